"""The lab's claim table computed from synthetic metric rows (sweeps/lab/claims.py), the report
writer, the countdown verifier, pass@k from sampled scores, and the lab presets."""

from __future__ import annotations

import json
import math
import random

import pytest
from omegaconf import OmegaConf

from entropyrl.conf import CONF_DIR, compose
from entropyrl.sweeps.lab.claims import compute_claims, quadrant_claim
from entropyrl.sweeps.lab.report import write_lab_outputs
from entropyrl.tasks import builtin as tasks
from entropyrl.tasks import countdown
from entropyrl.trainers.run.regime import findings_cell
from entropyrl.trainers.stats.passk import pass_metrics_from_scores


def rows(n=50, entropy=lambda i: 1.0, **extra):
    return [
        {"step": i + 1, "entropy": entropy(i), **{k: (v(i) if callable(v) else v) for k, v in extra.items()}} for i in range(n)
    ]


def decay(rate):
    return lambda i: math.exp(-rate * i)


def by_claim(claims):
    return {c["id"]: c for c in claims}


def synthetic_runs(seeds=(0, 1, 2)):
    h_tgt = 0.5
    wiggle = lambda i: 0.01 * (-1) ** i  # noqa: E731
    runs = {
        "grpo": {s: rows(entropy=decay(0.05), **{"val/pass_at_8": 0.4}) for s in seeds},
        # STARE: falls to the target, gate open exactly below it, holds there
        "stare": {
            s: rows(
                entropy=lambda i: max(0.5 + wiggle(i), 1.0 - 0.05 * i),
                **{"stare/gate_on": lambda i: float(max(0.5 + 0.01 * (-1) ** i, 1.0 - 0.05 * i) < 0.5), "val/pass_at_8": 0.6},
            )
            for s in seeds
        },
        "steer": {s: rows(entropy=decay(0.02), **{"entropy_change/realized": lambda i: -0.01}) for s in seeds},
        "clip_cov": {s: rows(entropy=decay(0.01)) for s in seeds},
        "kl_cov": {s: rows(entropy=decay(0.06)) for s in seeds},  # ends below GRPO: not reproduced
        "sample_reweight": {s: rows(entropy=decay(0.01)) for s in seeds},
        "high_entropy_mask": {s: rows(entropy=lambda i: 1.0 + 0.3 * (-1) ** i) for s in seeds},
        "grpo_extreme": {s: rows(entropy=decay(0.1)) for s in seeds},
        "steer_extreme": {s: rows(entropy=lambda i: 1.0 - 0.005 * i) for s in seeds},
    }
    for s in seeds:  # GRPO's per-step change: realised values with a larger spread than STEER's
        for i, r in enumerate(runs["grpo"][s]):
            r["entropy_change/realized"] = -0.01 + 0.05 * (-1) ** i
    return runs, h_tgt


def test_claims_on_synthetic_rows():
    runs, h_tgt = synthetic_runs()
    quads = {s: {"q1": [-1e-3, -2e-3], "q2": [1e-3, 5e-4], "q3": [-3e-3, -1e-3], "q4": [2e-4, 1e-4]} for s in (0, 1, 2)}
    claims = by_claim(compute_claims(runs, h_tgt=h_tgt, quadrants=quads, algo_cfgs={"kl_cov": {"interventions": ["kl_cov"]}}))
    assert set(claims) == {
        "grpo_collapses",
        "stare_holds_target",
        "stare_gate_follows_entropy",
        "quadrant_signs",
        "steer_moderates_change",
        "steer_extreme_stable",
        "cov_keeps_entropy",
        "negative_samples_keep_entropy",
        "high_entropy_amplification_fluctuates",
        "pass_at_k_preserved",
    }
    for cid in (
        "grpo_collapses",
        "stare_holds_target",
        "stare_gate_follows_entropy",
        "quadrant_signs",
        "steer_moderates_change",
        "steer_extreme_stable",
        "negative_samples_keep_entropy",
        "high_entropy_amplification_fluctuates",
        "pass_at_k_preserved",
    ):
        assert claims[cid]["reproduced"] is True, (cid, claims[cid]["measured"])
        assert len(claims[cid]["per_seed"]) == 3
    # KL-Cov ends below GRPO on every seed: the Cov claim fails and says which run and why
    cov = claims["cov_keeps_entropy"]
    assert cov["reproduced"] is False and [p["ok"] for p in cov["per_seed"]] == [False] * 3
    assert "kl_cov: collapse" in cov["reason"]
    g = claims["grpo_collapses"]["per_seed"][0]
    assert g["ratio"] == pytest.approx(g["last_tenth"] / g["first_tenth"]) and g["ratio"] < 0.5
    assert claims["pass_at_k_preserved"]["per_seed"][0]["best"] == "stare"
    json.dumps(list(claims.values()))  # lab.json-serialisable


def test_claims_fail_when_the_effect_is_absent():
    runs, h_tgt = synthetic_runs(seeds=(0, 1))
    runs["grpo"] = {s: rows(entropy=lambda i: 1.0 - 0.001 * i) for s in (0, 1)}  # no collapse
    runs["stare"][1] = rows(entropy=lambda i: 0.2, **{"stare/gate_on": lambda i: float(i % 2)})  # gate ignores H
    c = by_claim(compute_claims(runs, h_tgt=h_tgt))
    assert c["grpo_collapses"]["reproduced"] is False
    assert c["stare_gate_follows_entropy"]["reproduced"] is False
    assert [p["ok"] for p in c["stare_gate_follows_entropy"]["per_seed"]] == [True, False]
    assert c["stare_holds_target"]["reproduced"] is False  # seed 1 sits at 0.2, not 0.5
    assert c["quadrant_signs"]["reproduced"] is None  # experiment not run


def test_unreproduced_steer_claims_name_steer_weights_and_stress_accuracy():
    runs, h_tgt = synthetic_runs(seeds=(0, 1))
    # STEER near-uniform (mean weight ~0.99): its per-step change as spread as GRPO's, no warning fires
    runs["steer"] = {
        s: rows(
            entropy=decay(0.05),
            **{
                "steer/weight_mean": lambda i: 0.985 + 0.01 * (i % 2),
                "entropy_change/realized": lambda i: -0.01 + 0.06 * (-1) ** i,
            },
        )
        for s in (0, 1)
    }
    for v in ("grpo_extreme", "steer_extreme"):  # both broken: accuracy 0
        runs[v] = {s: rows(entropy=lambda i: 1.0, **{"val/acc": 0.0}) for s in (0, 1)}
    c = by_claim(compute_claims(runs, h_tgt=h_tgt))
    assert c["steer_moderates_change"]["reproduced"] is False
    assert "steer: mean token weight 0.990 (lowest 0.985), 0.990 (lowest 0.985)" in c["steer_moderates_change"]["reason"]
    assert c["steer_extreme_stable"]["reproduced"] is False
    assert "final val acc grpo_extreme 0/0, steer_extreme 0/0" in c["steer_extreme_stable"]["reason"]


def test_missing_runs_give_not_run():
    c = by_claim(compute_claims({"grpo": {0: rows(entropy=decay(0.05))}}, h_tgt=0.3))
    assert c["grpo_collapses"]["reproduced"] is True
    for cid in ("stare_holds_target", "steer_moderates_change", "cov_keeps_entropy", "steer_extreme_stable"):
        assert c[cid]["reproduced"] is None, cid


def test_quadrant_claim_signs():
    good = {"q1": [-1.0], "q2": [1.0], "q3": [-1.0], "q4": [1.0]}
    assert quadrant_claim({0: good})["reproduced"] is True
    assert quadrant_claim({0: good, 1: {**good, "q4": [-1.0, 0.5]}})["reproduced"] is False


def test_report_files(tmp_path):
    runs, h_tgt = synthetic_runs(seeds=(0, 1))
    claims = compute_claims(runs, h_tgt=h_tgt)
    paths = write_lab_outputs(
        tmp_path,
        runs,
        claims,
        algo_cfgs={},
        quadrants={0: {"q1": [-1e-3]}},
        pass_key="val/pass_at_8",
        command="entropyrl lab",
        wall_seconds=60.0,
        failed=[],
    )
    doc = json.loads((tmp_path / "lab.json").read_text())
    assert [c["id"] for c in doc["claims"]] == [c["id"] for c in claims]
    assert {"id", "claim", "measured", "reproduced", "per_seed"} <= set(doc["claims"][0])
    report = (tmp_path / "report.md").read_text()
    assert "grpo_collapses" in report and "![entropy](lab-entropy.png)" in report and "Quadrant" in report
    assert (tmp_path / "lab-entropy.png").stat().st_size > 1000 and "extreme" in paths
    # each variant's regime flags and warnings, with their first step per seed (regime.findings_cell)
    first_tenth = sum(decay(0.06)(i) for i in range(5)) / 5
    step = next(i + 1 for i in range(50) if decay(0.06)(i) < 0.2 * first_tenth)  # kl_cov's collapse
    kl = next(line for line in report.splitlines() if line.startswith("| kl_cov |"))
    assert kl.rstrip(" |").endswith(f"| - | collapse@{step}/{step}")
    assert next(v for v in doc["variants"] if v["variant"] == "kl_cov")["flags"] == f"collapse@{step}/{step}"


def test_findings_cell_names_ids_steps_and_seed_share():
    collapse = lambda step: {"id": "collapse", "message": "m", "first_step": step}  # noqa: E731
    warn = {"id": "all_equal_groups", "message": "m", "first_step": 3}
    assert (
        findings_cell([[collapse(40)], [collapse(52), warn], []]) == "collapse@40/52 (2/3 seeds), all_equal_groups@3 (1/3 seeds)"
    )
    assert findings_cell([[warn], [warn]]) == "all_equal_groups@3/3"
    assert findings_cell([[], []]) == "-" and findings_cell([]) == "-"


# ------------------------------------------------------------------------------------------
# the countdown task's verifier (parses, never executes)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "response,want",
    [
        ("12+7=19:19-3=16", 1.0),
        ("7-3=4:12+4=16", 1.0),
        ("12-3=9:9+7=16", 1.0),
        (" 12+7=19:19-3=16 ", 1.0),
        ("12+7=19:19-3=15", 0.0),  # wrong arithmetic
        ("12+7=19:19-7=12", 0.0),  # 7 used twice, and the wrong target
        ("12+4=16", 0.0),  # 4 is not one of the numbers
        ("3-7=-4", 0.0),
        ("7-12=5", 0.0),  # negative intermediate / wrong value
        ("12+7=19", 0.0),  # a valid step that does not reach the target
        ("16", 0.0),
        ("", 0.0),
        ("12+7=19::19-3=16", 0.0),
        ("12+7=19 19-3=16", 0.0),
        ("12*7=84", 0.0),
        ("12+07=19:19-3=16", 0.0),
        ("__import__('os').system('x')", 0.0),
        ("12+7=19:19-3=16" * 10, 0.0),
    ],
)
def test_countdown_verifier(response, want):
    assert countdown.verify_countdown((3, 7, 12), 16, response) == want


def test_countdown_problems_are_solvable_with_several_paths():
    cfg = OmegaConf.load(CONF_DIR / "data" / "countdown.yaml").data  # @package _global_
    problems = tasks.sample_problems(cfg, 200, random.Random(0))
    assert {p.task for p in problems} == {"countdown3", "countdown4"}
    for p in problems:
        answers = tasks.correct_answers(p)
        assert answers and all(tasks.reward(p, a) == 1.0 for a in answers[:5])
        assert tasks.reward(p, p.answer) == 1.0 and set(p.prompt) <= set(tasks.ALPHABET)
        wrong = tasks.wrong_answer(p, random.Random(1))
        assert tasks.reward(p, wrong) == 0.0 and set(wrong) <= set(tasks.ALPHABET)
    assert sum(len(tasks.correct_answers(p)) > 1 for p in problems) > 0.9 * len(problems)
    mean_len = sum(len(p.answer) for p in problems) / len(problems)
    assert 12 <= mean_len <= 40


def test_pass_metrics_from_scores():
    out = pass_metrics_from_scores([1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1], 8)
    assert out == {"val/pass@1": pytest.approx((1 / 8 + 1) / 2), "val/pass@8": 1.0}
    assert pass_metrics_from_scores([0] * 8, 8)["val/pass@8"] == 0.0
    with pytest.raises(ValueError):
        pass_metrics_from_scores([1, 0, 1], 2)


@pytest.mark.parametrize(
    "variant",
    [
        "grpo",
        "stare",
        "steer",
        "clip_cov",
        "kl_cov",
        "sample_reweight",
        "high_entropy_mask",
        "grpo_extreme",
        "steer_extreme",
        "ce_gppo",
        "entropic",
        "aent",
        "siren",
        "archer",
        "entropy_adv",
        "gtpo",
        "lp_reg",
        "gspo",
        "gmpo",
        "cispo",
        "sapo",
    ],
)
def test_lab_presets_state_every_deviation(variant):
    cfg = compose("train", [f"experiment=lab_{variant}"])
    assert cfg.data.name == "countdown" and cfg.val.pass_k == 8 and cfg.diagnostics.entropy_change
    text = (CONF_DIR / "experiment" / f"lab_{variant}.yaml").read_text()
    assert text.splitlines()[0].strip() == "# @package _global_"
    for line in text.split("\ndefaults:", 1)[1].splitlines():
        s = line.strip()
        if s and not s.startswith("#") and not s.endswith(":"):
            assert "#" in line, f"lab_{variant}: {line!r} says no reason"
    seven_b = compose("train", ["experiment=steer_7b"])
    assert seven_b.algo.steer.lambda_min == 0.8  # the 7B presets keep published values


def test_countdown_text_survives_the_saved_embedded_tokenizer(tmp_path):
    """The embedded tokenizer drops spaces once saved and reloaded; countdown text must not need them."""
    from transformers import AutoTokenizer

    from entropyrl.models.tiny import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    cfg = OmegaConf.load(CONF_DIR / "data" / "countdown.yaml").data  # @package _global_
    for p in tasks.sample_problems(cfg, 20, random.Random(3)):
        for text in (p.prompt, p.answer):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids and tok.decode(ids) == text


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--algos", "grpo,nope"], "unknown lab variant 'nope'"),
        (["--seeds", "0,x"], "--seeds must be comma-separated integers"),
        (["--experiment", "both"], "--experiment must be one of"),
    ],
)
def test_lab_bad_options_fail_in_one_line(args, needle, tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "lab", *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_the_report_tells_a_resumed_sweeps_pause_from_its_job_time(tmp_path):
    """Two jobs of one hour each, a day apart (a sweep resumed the next day): the span is 25 h, the
    jobs' own time 2 h; the report says both, and lab.json keeps both."""
    from types import SimpleNamespace

    from entropyrl.sweeps.jobs import write_job_state
    from entropyrl.sweeps.lab.report import job_times

    statuses = []
    for i, (start, end) in enumerate([(0.0, 3600.0), (86400.0, 90000.0)]):
        out = tmp_path / "runs" / f"j{i}"
        write_job_state(out, {"started": 1.7e9 + start, "ended": 1.7e9 + end})
        statuses.append(SimpleNamespace(output_dir=str(out)))
    statuses.append(SimpleNamespace(output_dir=str(tmp_path / "runs" / "never_started")))
    wall_seconds, job_seconds = job_times(statuses)
    assert wall_seconds == pytest.approx(90000.0)
    assert job_seconds == pytest.approx(7200.0)
    runs, _ = synthetic_runs(seeds=(0,))
    write_lab_outputs(
        tmp_path / "report",
        runs,
        compute_claims(runs, h_tgt=0.3),
        algo_cfgs={},
        quadrants=None,
        pass_key="val/pass_at_8",
        command="entropyrl lab",
        wall_seconds=wall_seconds,
        job_seconds=job_seconds,
        failed=[],
    )
    head = (tmp_path / "report" / "report.md").read_text().splitlines()[2]
    assert "1500.0 min from the first job's start" in head and "120.0 min of job time" in head, head
    doc = json.loads((tmp_path / "report" / "lab.json").read_text())
    assert (doc["wall_seconds"], doc["job_seconds"]) == (90000.0, 7200.0)
