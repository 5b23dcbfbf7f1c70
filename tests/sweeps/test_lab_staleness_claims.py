"""The staleness study (``entropyrl lab --experiment staleness``): its claims on synthetic metric rows
(reproduced, not, and not run on a partial sweep), its table and figure panels, its report step on a
tiny fake sweep folder (directly and through ``entropyrl report --step``), and its CLI checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from entropyrl.conf import compose
from entropyrl.sweeps.ablation import training_variants
from entropyrl.sweeps.lab.report import claim_status
from entropyrl.sweeps.lab.staleness_claims import (
    CLAIM_VARIANTS,
    all_or_none,
    parse_variant,
    staleness_claims,
    staleness_table,
)
from entropyrl.sweeps.lab.staleness_step import entropy_groups

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
H = 0.25  # h_tgt of the synthetic STARE runs


def _linear(a, b, n=30):
    return [a + (b - a) * i / (n - 1) for i in range(n)]


def _rows(entropy, **metrics):
    """Metric rows: ``entropy`` per step and each of ``metrics`` (a value for every step, or a list)."""
    rows = []
    for i, h in enumerate(entropy):
        r = {"step": i + 1, "entropy": h}
        for k, v in metrics.items():
            r[k.replace("__", "/")] = v[i] if isinstance(v, list) else v
        rows.append(r)
    return rows


def _quarters(q1, q4, clip=None):
    return {"clip__frac__entropy_q1": q1, "clip__frac__entropy_q4": q4, "clip__frac": (q1 + q4) / 2 if clip is None else clip}


def _stale(q1, q4):
    """The stale ratio's clipped share of the bottom and top entropy quartiles (async/stale_clip_frac/entropy_q*)."""
    return {"async__stale_clip_frac__entropy_q1": q1, "async__stale_clip_frac__entropy_q4": q4}


def _gated(entropy, h=H):
    """STARE rows whose gate is open exactly on the steps below ``h``."""
    return _rows(entropy, stare__gate_on=[float(x < h) for x in entropy])


def _claims(runs, **kw):
    return {c["id"]: c for c in staleness_claims(runs, h_tgt=H, **kw)}


def test_variant_names_parse_into_method_k_and_tag():
    assert parse_variant("grpo_k0") == ("grpo", 0, "")
    assert parse_variant("clip_cov_k2") == ("clip_cov", 2, "")
    assert parse_variant("grpo_k2_m2po") == ("grpo", 2, "m2po")
    assert parse_variant("stare_k2_behav") == ("stare", 2, "behav")
    assert parse_variant("grpo") is None and parse_variant("quadrants") is None
    # every variant of the ablation parses, and the claims' variants are the ablation's
    names = training_variants("staleness")
    assert all(parse_variant(v) for v in names)
    assert {v for vs in CLAIM_VARIANTS.values() for v in vs} <= set(names)
    assert all_or_none([True, True]) is True and all_or_none([True, None]) is None and all_or_none([None, False]) is False
    assert all_or_none([]) is None


def test_stale_grpo_collapse_is_k4_last_tenth_against_the_k0_run_of_the_same_seed():
    k0 = _rows(_linear(0.6, 0.2))  # last tenth (3 steps) ~0.208
    runs = {
        "grpo_k0": {0: k0, 1: k0},
        "grpo_k2": {0: _rows(_linear(0.6, 0.3)), 1: _rows(_linear(0.6, 0.3))},
        "grpo_k4": {0: _rows(_linear(0.6, 0.05)), 1: _rows(_linear(0.6, 0.08))},
    }
    c = _claims(runs)["stale_grpo_collapses"]
    assert c["reproduced"] is True and [p["seed"] for p in c["per_seed"]] == [0, 1]
    p = c["per_seed"][0]
    assert p["ratio_k4"] == pytest.approx(p["last_tenth_k4"] / p["last_tenth_k0"]) and p["ratio_k4"] < 0.5
    assert p["ratio_k2"] > 1  # measured at every k, claimed at k=4
    assert "k=2 " in c["measured"] and "k=4 " in c["measured"] and "k=4" in c["claim"] and "0.5" in c["claim"]
    # one seed whose stale run keeps its entropy: not reproduced
    runs["grpo_k4"][1] = _rows(_linear(0.6, 0.3))
    assert _claims(runs)["stale_grpo_collapses"]["reproduced"] is False
    # no k=4 run (a partial sweep): not run, the ratios at the other k still measured
    del runs["grpo_k4"]
    c = _claims(runs)["stale_grpo_collapses"]
    assert c["reproduced"] is None and "grpo_k4" in c["reason"] and "k=2 " in c["measured"]
    assert claim_status(c) == "not run"


def test_high_entropy_tokens_clipped_first_and_more_with_k():
    """Stated on the stale ratio pi_prox/pi_behav (async/stale_clip_frac/entropy_q*), no longer on the
    update's clip/frac/entropy_q*, which the stale ratio never enters: quarters of clip/frac alone now
    leave the claim not run."""
    n = 30
    runs = {
        f"grpo_k{k}": {s: _rows(_linear(0.6, 0.2, n), **_stale(0.001, q4 + 0.001 * s)) for s in (0, 1)}
        for k, q4 in ((0, 0.002), (1, 0.01), (2, 0.02), (4, 0.04))
    }
    c = _claims(runs)["stale_clips_high_entropy_first"]
    assert c["reproduced"] is True and c["per_seed"][1]["q4_k4"] == pytest.approx(0.041)
    assert "k=4: q4 0.04/0.041 vs q1 0.001/0.001" in c["measured"]
    # the top quarter's share does not grow from k=2 to k=4 on one seed
    runs["grpo_k4"][1] = _rows(_linear(0.6, 0.2, n), **_stale(0.001, 0.015))
    c = _claims(runs)["stale_clips_high_entropy_first"]
    assert c["reproduced"] is False and c["per_seed"][1]["q4_grows"] is False and c["per_seed"][1]["q4_above_q1"] is True
    # q1 above q4 at k=1: not reproduced either
    runs["grpo_k4"][1] = runs["grpo_k4"][0]
    runs["grpo_k1"] = {s: _rows(_linear(0.6, 0.2, n), **_stale(0.02, 0.01 + 0.001 * s)) for s in (0, 1)}
    assert _claims(runs)["stale_clips_high_entropy_first"]["per_seed"][0]["q4_above_q1"] is False
    # a partial grid: open while the measured k agree, refuted as soon as one does not
    partial = {v: runs[v] for v in ("grpo_k0", "grpo_k2")}
    c = _claims(partial)["stale_clips_high_entropy_first"]
    assert c["reproduced"] is None and "grpo_k1, grpo_k4" in c["reason"] and "k=2: q4" in c["measured"]
    assert _claims({**partial, "grpo_k1": runs["grpo_k1"]})["stale_clips_high_entropy_first"]["reproduced"] is False
    # only the synchronous run, or runs without the quarters: not run, with the reason
    c = _claims({"grpo_k0": runs["grpo_k0"]})["stale_clips_high_entropy_first"]
    assert c["reproduced"] is None and "two k" in c["reason"]
    bare = {f"grpo_k{k}": {0: _rows(_linear(0.6, 0.2, n), **_quarters(0.001, 0.01 * (k + 1)))} for k in (0, 1, 2, 4)}
    c = _claims(bare)["stale_clips_high_entropy_first"]
    assert c["reproduced"] is None
    assert "grpo_k0, grpo_k1, grpo_k2, grpo_k4 logged no async/stale_clip_frac/entropy_q1" in c["reason"]


def test_stare_band_by_k_says_where_it_stops_holding():
    # held: reaches h_tgt from 0.6 and its gate opens below it (a curve that sat in the band with the
    # gate shut, as these rows were before, no longer holds: test_claim_nulls.py)
    held = _gated([0.6] * 20 + [0.24, 0.28] * 5)  # last third 0.26: +4 %
    lost = _gated([0.6] * 20 + [0.4] * 10)  # +60 %
    runs = {"stare_k0": {0: held, 1: held}, "stare_k2": {0: held, 1: held}, "stare_k4": {0: held, 1: lost}}
    c = _claims(runs)["stare_band_by_k"]
    assert c["reproduced"] is False and c["holds_up_to_k"] == 2 and c["stops_at_k"] == 4
    assert c["holds_by_k"] == {"0": True, "2": True, "4": False}
    assert "holds on every seed up to k=2, stops at k=4" in c["measured"] and "+60%" in c["measured"]
    assert "h_tgt=0.25" in c["claim"] and "30%" in c["claim"]
    runs["stare_k4"][1] = held
    c = _claims(runs)["stare_band_by_k"]
    assert c["reproduced"] is True and c["holds_up_to_k"] == 4 and c["stops_at_k"] is None
    # no k=4 run: not run, yet the measured k say how far it held
    del runs["stare_k4"]
    c = _claims(runs)["stare_band_by_k"]
    assert c["reproduced"] is None and "stare_k4" in c["reason"] and c["holds_up_to_k"] == 2
    assert "not measured at k=4" in c["measured"]
    # it fails at k=0 already: not reproduced, and nothing held
    c = _claims({"stare_k0": {0: lost}})["stare_band_by_k"]
    assert c["reproduced"] is False and c["holds_up_to_k"] is None and c["stops_at_k"] == 0


def test_stare_k2_dec_and_behav_rows_use_the_same_band():
    held, below = _gated([0.6] * 20 + [0.24] * 10), _gated([0.6] * 20 + [0.1] * 10)
    c = _claims({"stare_k2_behav": {0: held, 1: held}, "stare_k2": {0: below}})
    behav = c["stare_k2_behav_holds_band"]
    assert behav["reproduced"] is True and "behaviour policy" in behav["claim"]
    assert "stare_k2 (gate on the current policy) 0.1 (-60%)" in behav["measured"]
    assert c["stare_k2_dec_holds_band"]["reproduced"] is None and "stare_k2_dec" in c["stare_k2_dec_holds_band"]["reason"]
    c = _claims({"stare_k2_dec": {0: held, 1: below}})["stare_k2_dec_holds_band"]
    assert c["reproduced"] is False and c["per_seed"][1]["rel_error"] == pytest.approx(-0.6)


def test_corrections_lower_clipping_claims_dec_and_m2po_and_measures_tis_icepop():
    def run(clip, end=0.2):
        return {s: _rows(_linear(0.6, end), **{"clip__frac": clip, "rollout__tis_clip_frac": 0.05}) for s in (0, 1)}

    runs = {
        "grpo_k2": run(0.012),
        "grpo_k2_dec": run(0.009),
        "grpo_k2_m2po": run(0.006, 0.3),
        "grpo_k2_tis": run(0.02),  # higher: no direction is claimed for it
        "grpo_k2_icepop": run(0.011),
    }
    c = _claims(runs)["corrections_lower_clipping"]
    assert c["reproduced"] is True
    p = c["per_seed"][0]
    assert p["clip_frac_none"] == pytest.approx(0.012) and p["clip_frac_tis"] == pytest.approx(0.02)
    assert p["tis_clip_frac_m2po"] == pytest.approx(0.05) and p["last_tenth_m2po"] > p["last_tenth_none"]
    assert "m2po 0.006 (2/2 seeds lower, acted on 2/2" in c["measured"] and "tis 0.02 (0/2 seeds lower" in c["measured"]
    assert "Restated" in c["claim"] and c["restated"]
    # a correction that did nothing (no weight, no mask logged) is not credited with a lower clip/frac
    idle = {s: _rows(_linear(0.6, 0.3), clip__frac=0.006) for s in (0, 1)}
    c = _claims({**runs, "grpo_k2_m2po": idle})["corrections_lower_clipping"]
    assert c["reproduced"] is False and c["per_seed"][0]["acted_m2po"] is False and "m2po seed 0 did not act" in c["reason"]
    runs["grpo_k2_m2po"] = run(0.015)
    c = _claims(runs)["corrections_lower_clipping"]
    assert c["reproduced"] is False
    # M2PO not run, decoupled lower: not run (one failure would decide, a success does not)
    del runs["grpo_k2_m2po"]
    c = _claims(runs)["corrections_lower_clipping"]
    assert c["reproduced"] is None and "grpo_k2_m2po" in c["reason"]
    runs["grpo_k2_dec"] = run(0.02)
    assert _claims(runs)["corrections_lower_clipping"]["reproduced"] is False


def test_a_clip_free_m2po_run_cannot_lower_clipping_by_construction():
    """M2PO's own objective (algo.tis.m2po_clip false, the default) has no clip: its clip/frac is 0 whatever
    it did, so comparing it with GRPO's would pass by construction; the claim leaves it unjudged and says why."""

    def run(clip):
        return {s: _rows(_linear(0.6, 0.2), **{"clip__frac": clip, "rollout__tis_clip_frac": 0.05}) for s in (0, 1)}

    runs = {"grpo_k2": run(0.012), "grpo_k2_dec": run(0.009), "grpo_k2_m2po": run(0.0)}
    clip_free = {"grpo_k2_m2po": {"tis": {"mode": "m2po", "m2po_clip": False}}}
    c = _claims(runs, algo_cfgs=clip_free)["corrections_lower_clipping"]
    assert c["reproduced"] is None and "clip-free" in c["reason"]
    clipped = {"grpo_k2_m2po": {"tis": {"mode": "m2po", "m2po_clip": True}}}
    assert _claims(runs, algo_cfgs=clipped)["corrections_lower_clipping"]["reproduced"] is True


def test_clip_cov_and_steer_against_grpo_at_the_same_k():
    grpo = {s: _rows(_linear(0.6, 0.1)) for s in (0, 1)}
    above = {s: _rows(_linear(0.6, 0.3)) for s in (0, 1)}
    runs = {"grpo_k0": grpo, "grpo_k2": grpo, "clip_cov_k0": above, "clip_cov_k2": above}
    c = _claims(runs)["clip_cov_keeps_entropy_stale"]
    assert c["reproduced"] is True and c["per_seed"][0]["last_tenth_ratio_k2"] > 1
    runs["clip_cov_k2"] = {0: above[0], 1: grpo[1]}  # equal to GRPO's on seed 1: not above
    assert _claims(runs)["clip_cov_keeps_entropy_stale"]["reproduced"] is False
    del runs["clip_cov_k2"]
    c = _claims(runs)["clip_cov_keeps_entropy_stale"]
    assert c["reproduced"] is None and "clip_cov_k2" in c["reason"] and "k=0:" in c["measured"]

    # STEER: a smaller per-step change than GRPO's (the probe's realised change when logged)
    jumpy = {s: _rows(_linear(0.6, 0.1), entropy_change__realized=[0.02 * (-1) ** i for i in range(30)]) for s in (0, 1)}
    calm = {s: _rows(_linear(0.6, 0.1), entropy_change__realized=[0.005 * (-1) ** i for i in range(30)]) for s in (0, 1)}
    runs = {"grpo_k0": jumpy, "grpo_k2": jumpy, "steer_k0": calm, "steer_k2": calm}
    c = _claims(runs)["steer_moderates_change_stale"]
    assert c["reproduced"] is True and c["per_seed"][0]["std_steer_k2"] == pytest.approx(0.005)
    assert "step-change std steer/grpo 0.005/0.02" in c["measured"]
    runs["steer_k2"] = jumpy
    assert _claims(runs)["steer_moderates_change_stale"]["reproduced"] is False


def test_pass_at_k_table_is_descriptive_and_no_claim_raises_on_an_empty_or_partial_sweep():
    val = [float("nan")] * 29 + [0.5]
    runs = {"grpo_k0": {0: _rows(_linear(0.6, 0.2), val__pass_at_8=val, val__acc=[float("nan")] * 29 + [0.3])}}
    c = _claims(runs)["stale_pass_at_k"]
    assert c["descriptive"] and claim_status(c) == "descriptive" and c["measured"] == "grpo_k0 pass@8 0.5 acc 0.3"
    for claims in (_claims({}), _claims({"steer_k2": {0: _rows([0.3] * 5)}, "other": {0: []}})):
        assert len(claims) == 9
        for cid, c in claims.items():
            assert c["reproduced"] is None, cid
            assert c.get("descriptive") or c["reason"], cid


def test_staleness_table_and_entropy_panels():
    rows = _rows(
        _linear(0.6, 0.1, 20),
        **_quarters(0.001, 0.02, clip=0.01),
        stare__gate_on=[0.0] * 10 + [1.0] * 10,
        async__staleness__mean=2.0,
        val__pass_at_8=[float("nan")] * 19 + [0.7],
    )
    (t,) = staleness_table({"stare_k2": {0: rows, 1: rows}}, h_tgt=H)
    assert (t["method"], t["k"], t["tag"], t["seeds"]) == ("stare", 2, "", [0, 1])
    assert t["first_step_below"] == [15, 15]  # 0.6 - 0.5 * 14 / 19 = 0.232 < 0.25
    assert t["clip_q4"] == [pytest.approx(0.02)] * 2 and t["gate_open"] == [0.5, 0.5]
    assert t["staleness_mean"] == [2.0, 2.0] and t["pass"] == [0.7, 0.7]
    groups = dict(entropy_groups(training_variants("staleness")))
    assert [v for v, _ in groups["GRPO by staleness k"]] == ["grpo_k0", "grpo_k1", "grpo_k2", "grpo_k4"]
    assert groups["GRPO at k=2: corrections and options"] == [
        ("grpo_k2", "none"),
        ("grpo_k2_tis", "tis"),
        ("grpo_k2_icepop", "icepop"),
        ("grpo_k2_dec", "dec"),
        ("grpo_k2_m2po", "m2po"),
    ]
    assert [label for _v, label in groups["STARE at k=2: corrections and options"]] == ["none", "dec", "behav"]
    assert list(groups)[-1] == "STEER by staleness k" and len(groups) == 6


def _fake_sweep(tmp_path, with_step: bool):
    """A sweep folder of four variants x two seeds, finished; ``sweep.json`` names the report step
    or not (a sweep started before its ablation named one)."""
    n = 20
    shapes = {
        "grpo_k0": dict(end=0.1, q4=0.002),
        "grpo_k4": dict(end=0.04, q4=0.03),
        # STARE reaches h_tgt (0.25) with its gate open: a run that stayed above it never held it
        "stare_k0": dict(end=0.24, q4=0.002),
        "stare_k4": dict(end=0.24, q4=0.03),
    }
    jobs = []
    for variant, sh in shapes.items():
        for seed in (0, 1):
            d = tmp_path / "runs" / variant / f"s{seed}"
            d.mkdir(parents=True)
            rows = _rows(
                [0.6] * 10 + [sh["end"] + 0.005 * seed] * 10,
                **_quarters(0.001, sh["q4"]),
                # the stale ratio's clipped quarters: 0 at k=0 by construction
                **(_stale(0.0, 0.0) if variant.endswith("k0") else _stale(0.001, sh["q4"])),
                val__pass_at_8=[float("nan")] * (n - 1) + [0.6],
                val__acc=[float("nan")] * (n - 1) + [0.4],
                **({"stare__gate_on": [0.0] * 10 + [1.0] * 10} if variant.startswith("stare") else {}),
                **({"async__staleness__mean": 4.0} if variant.endswith("k4") else {}),
            )
            (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
            (d / "job.json").write_text(json.dumps({"state": "done", "started": 100.0 + seed, "ended": 160.0 + seed}))
            jobs.append({"key": f"{variant}/s{seed}", "variant": variant, "seed": seed, "overrides": [], "output_dir": str(d)})
    ablation = {"name": "staleness", **({"report_step": "lab_staleness"} if with_step else {})}
    sweep = {
        "sweep_id": "staleness-test",
        "ablation": ablation,
        "jobs": jobs,
        "launcher": {"name": "local"},
        "tracking": {"enabled": False},
        "train_overrides": ["trainer.total_steps=20"],
        "report": {"entropy_threshold": H},
    }
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    statuses = [
        SimpleNamespace(key=j["key"], variant=j["variant"], seed=j["seed"], state="done", output_dir=j["output_dir"])
        for j in jobs
    ]
    return sweep, statuses


def test_report_step_writes_the_report_the_claims_and_the_figures(tmp_path):
    from entropyrl.sweeps.lab.staleness_step import CLIP_FIGURE, ENTROPY_FIGURE, lab_staleness_report_step

    sweep, statuses = _fake_sweep(tmp_path, with_step=True)
    result = lab_staleness_report_step(tmp_path, sweep, statuses, log=lambda m: None)
    doc = json.loads((tmp_path / "lab.json").read_text())
    claims = {c["id"]: c for c in doc["claims"]}
    h_tgt = compose("train", ["experiment=lab_stare"]).algo.stare.h_tgt
    assert doc["h_tgt"] == h_tgt and doc["command"] == "entropyrl sweep ablation=staleness trainer.total_steps=20"
    assert claims["stale_grpo_collapses"]["status"] == "yes"
    band = claims["stare_band_by_k"]  # held at k=0 and k=4; no stare_k2 in this sweep
    assert band["status"] == "not run" and "stare_k2" in band["reason"] and band["holds_by_k"]["4"] is True
    assert claims["stale_clips_high_entropy_first"]["status"] == "not run"  # k=1 and k=2 not in this sweep
    assert claims["corrections_lower_clipping"]["status"] == "not run" and claims["stale_pass_at_k"]["status"] == "descriptive"
    assert result["metrics"]["claims/stale_grpo_collapses"] == 1.0 and "claims/stare_band_by_k" not in result["metrics"]
    assert {t["variant"] for t in doc["staleness_table"]} == {"grpo_k0", "grpo_k4", "stare_k0", "stare_k4"}
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# entropyrl lab report: staleness") and "Quadrant sign experiment" not in report
    assert f"![entropy by method and staleness]({ENTROPY_FIGURE})" in report and CLIP_FIGURE in report
    row = next(line for line in report.splitlines() if line.startswith("| stare_k4 | 4 | none |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[4] == "0.242 ± 0.003" and cells[5] == "11.0 ± 0.0" and cells[8] == "0.0300 ± 0.0000"
    assert cells[9:12] == ["-", "0.0010 ± 0.0000", "0.0300 ± 0.0000"]  # stale clip overall not logged, its q1, q4
    assert cells[14] == "0.50 ± 0.00" and cells[15] == "4.00 ± 0.00"
    row = next(line for line in report.splitlines() if line.startswith("| grpo_k4 | 4 | none |"))
    assert [c.strip() for c in row.split("|")[1:-1]][5] == "11.0 ± 0.0"  # 0.04 from step 11
    assert "| grpo_k0 | 0 | none |" in report and "| - |" in report.split("| grpo_k0 | 0 | none |")[1].splitlines()[0]
    for fig in (ENTROPY_FIGURE, CLIP_FIGURE, "lab-entropy.png"):
        assert (tmp_path / fig).stat().st_size > 5000, fig
    assert result["paths"]["staleness_entropy"] == tmp_path / ENTROPY_FIGURE


def test_entropyrl_report_step_option_runs_the_step_on_a_sweep_that_named_none(tmp_path):
    from entropyrl.sweeps.report import build_report

    _fake_sweep(tmp_path, with_step=False)
    rep = build_report(tmp_path, log_mlflow=False, log=lambda m: None, report_step="lab_staleness")
    assert rep["report"] == str(tmp_path / "report.md") and (tmp_path / "sweep-report.md").exists()
    assert (tmp_path / "lab.json").exists() and rep["step_metrics"]["claims/stale_grpo_collapses"] == 1.0


def test_the_staleness_ablation_names_its_report_step():
    cfg = compose("sweep", ["ablation=staleness"])
    assert cfg.ablation.report_step == "lab_staleness" and len(training_variants("staleness")) == 17
    from entropyrl.sweeps.plugins import load_plugins
    from entropyrl.sweeps.report import REPORT_STEPS

    load_plugins()
    assert "lab_staleness" in REPORT_STEPS


def test_lab_staleness_rejects_a_variant_of_another_ablation_and_documents_itself(tmp_path):
    proc = subprocess.run(
        [*CLI, "lab", "--experiment", "staleness", "--algos", "grpo_k0,stare", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "unknown staleness-study variant 'stare'" in proc.stderr
    assert "grpo_k2_m2po" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [*CLI, "lab", "--help"], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"}
    )
    assert proc.returncode == 0 and "--experiment staleness" in proc.stdout and "outputs/lab_staleness" in proc.stdout
