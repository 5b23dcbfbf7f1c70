"""The tool study (``entropyrl lab --experiment tools``): its claims on synthetic metric rows, its
report step and figure on synthetic runs, its presets and its CLI checks. The end-to-end run is the
slow test at the bottom."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from entropyrl.conf import CONF_DIR, compose
from entropyrl.sweeps.ablation import default_variants, training_variants
from entropyrl.sweeps.lab.claim_measures import metric_ends
from entropyrl.sweeps.lab.report import claim_status
from entropyrl.sweeps.lab.tool_claims import kind_table, tool_claims

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def _rows(entropy, kinds=None, steps=None):
    """Metric rows: ``entropy`` per step, and ``kinds`` {key: values} beside it."""
    rows = []
    for i, h in enumerate(entropy):
        r = {"step": i + 1, "entropy": h}
        for k, vals in (kinds or {}).items():
            r[k] = vals[i]
        rows.append(r)
    return rows


def _linear(a, b, n=20):
    return [a + (b - a) * i / (n - 1) for i in range(n)]


def _claims(runs, h_tgt=0.3):
    return {c["id"]: c for c in tool_claims(runs, h_tgt=h_tgt)}


def test_grpo_collapse_is_last_tenth_against_first_tenth():
    collapsing = _rows(_linear(0.6, 0.1))  # first tenth (2 steps) ~0.587, last ~0.113
    holding = _rows(_linear(0.6, 0.4))
    c = _claims({"grpo": {0: collapsing, 1: collapsing}})["tool_grpo_collapses"]
    assert c["reproduced"] is True and [p["seed"] for p in c["per_seed"]] == [0, 1]
    p = c["per_seed"][0]
    assert p["first_tenth"] == pytest.approx((0.6 + 0.6 - 0.5 / 19) / 2)
    assert p["last_tenth"] == pytest.approx((0.1 + 0.1 + 0.5 / 19) / 2)
    # one seed that does not collapse: the claim is not reproduced, and the measured value says so
    c = _claims({"grpo": {0: collapsing, 1: holding}})["tool_grpo_collapses"]
    assert c["reproduced"] is False and "->" in c["measured"]
    assert c["per_seed"][1]["ratio"] == pytest.approx(c["per_seed"][1]["last_tenth"] / c["per_seed"][1]["first_tenth"])


def test_stare_band_is_last_third_within_thirty_percent_of_h_tgt():
    # held: entropy reaches h_tgt and the gate opens below it (a curve sitting in the band with no gate,
    # as these rows were before, is the claim's null control and no longer holds: test_claim_nulls.py)
    gate = lambda ent: {"stare/gate_on": [float(h < 0.3) for h in ent]}  # noqa: E731
    held_ent, below_ent = [0.6] * 14 + [0.28, 0.36] * 3, [0.6] * 14 + [0.15] * 6
    held = _rows(held_ent, gate(held_ent))  # last third (6 steps) 0.32: +7 %
    below = _rows(below_ent, gate(below_ent))  # -50 %
    c = _claims({"stare": {0: held}}, h_tgt=0.3)["tool_stare_holds_target"]
    assert c["reproduced"] is True and c["per_seed"][0]["last_third"] == pytest.approx(0.32)
    assert c["per_seed"][0]["acted_share"] == pytest.approx(0.15) and "gate open 15% of steps" in c["measured"]
    assert "h_tgt=0.3" in c["claim"]
    c = _claims({"stare": {0: held, 1: below}}, h_tgt=0.3)["tool_stare_holds_target"]
    assert c["reproduced"] is False and c["per_seed"][1]["rel_error"] == pytest.approx(-0.5)
    assert "-50%" in c["measured"]


def test_claims_without_their_runs_are_not_run():
    c = _claims({"steer": {0: _rows(_linear(0.5, 0.2))}})
    assert c["tool_grpo_collapses"]["reproduced"] is None and c["tool_stare_holds_target"]["reproduced"] is None
    assert claim_status(c["tool_grpo_collapses"]) == "not run"


def test_entropy_by_kind_is_first_and_last_tenth_of_each_kind_skipping_nan():
    n = 20
    kinds = {
        "entropy/kind/text": _linear(0.8, 0.4, n),
        "entropy/kind/code": _linear(0.5, 0.05, n),
        # a kind with no token in the first steps is NaN there: the tenths are of the logged steps
        "entropy/kind/post_tool": [float("nan")] * 10 + _linear(0.3, 0.3, 10),
        "entropy/turn/first": _linear(0.6, 0.2, n),
        "entropy/turn/later": [0.3] * n,
    }
    runs = {"grpo": {0: _rows(_linear(0.6, 0.2, n), kinds)}, "stare": {0: _rows([0.3] * n, {"entropy/kind/code": [0.4] * n})}}
    first, last = metric_ends(runs["grpo"][0], "entropy/kind/post_tool")
    assert (first, last) == (pytest.approx(0.3), pytest.approx(0.3))
    table = {(t["variant"], t["key"]): t for t in kind_table(runs)}
    assert set(table) == {("grpo", k) for k in kinds} | {("stare", "entropy/kind/code")}
    code = table[("grpo", "entropy/kind/code")]
    assert code["first_mean"] == pytest.approx((0.5 + 0.5 - 0.45 / 19) / 2) and code["ratio"] < 0.2
    c = _claims(runs)["tool_entropy_by_kind"]
    assert c["descriptive"] and c["reproduced"] is None and claim_status(c) == "descriptive"
    assert c["measured"].startswith("grpo: text 0.789->0.411") and "stare: code 0.4->0.4 (1x)" in c["measured"]
    assert "turn later" in c["measured"]
    # no run logged a kind (tools off): the row is not run, not an empty "descriptive"
    empty = _claims({"grpo": {0: _rows(_linear(0.6, 0.2))}})["tool_entropy_by_kind"]
    assert empty["measured"] == "" and claim_status(empty) == "not run"


def test_report_step_writes_the_claims_the_kind_table_and_the_figure(tmp_path):
    from entropyrl.sweeps.lab.tool_step import KIND_FIGURE, lab_tools_report_step

    n = 20
    kinds = lambda scale: {  # noqa: E731
        "entropy/kind/text": _linear(0.8, 0.8 * scale, n),
        "entropy/kind/code": _linear(0.5, 0.5 * scale, n),
        "entropy/kind/post_tool": _linear(0.3, 0.3 * scale, n),
        "entropy/turn/first": _linear(0.6, 0.6 * scale, n),
        "entropy/turn/later": _linear(0.3, 0.3 * scale, n),
        "tools/calls/mean": [1.0] * n,
    }
    statuses, jobs = [], []
    for variant, scale in (("grpo", 0.2), ("stare", 0.9)):
        for seed in (0, 1):
            d = tmp_path / "runs" / variant / f"s{seed}"
            d.mkdir(parents=True)
            rows = _rows(_linear(0.5, 0.5 * scale, n), kinds(scale + 0.01 * seed))
            (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
            statuses.append(
                SimpleNamespace(key=f"{variant}/s{seed}", variant=variant, seed=seed, state="done", output_dir=str(d))
            )
            jobs.append({"key": f"{variant}/s{seed}", "kind": "train"})
    sweep = {"jobs": jobs, "command": "entropyrl lab --experiment tools", "train_overrides": []}
    result = lab_tools_report_step(tmp_path, sweep, statuses, log=lambda m: None)
    doc = json.loads((tmp_path / "lab.json").read_text())
    claims = {c["id"]: c for c in doc["claims"]}
    assert claims["tool_grpo_collapses"]["status"] == "yes"
    h_tgt = compose("train", ["experiment=lab_tool_stare"]).algo.stare.h_tgt
    assert doc["h_tgt"] == h_tgt and claims["tool_entropy_by_kind"]["status"] == "descriptive"
    assert {t["variant"] for t in doc["token_kinds"]} == {"grpo", "stare"}
    assert result["metrics"]["claims/tool_grpo_collapses"] == 1.0 and "claims/tool_entropy_by_kind" not in result["metrics"]
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# entropyrl lab report: tool use") and "## Entropy by token kind and turn" in report
    assert f"![entropy by token kind]({KIND_FIGURE})" in report and "Quadrant sign experiment" not in report
    row = next(line for line in report.splitlines() if line.startswith("| grpo | `entropy/kind/code` |"))
    first, last = (float(x) for x in row.split("|")[3:5])
    assert first == pytest.approx(0.5 - 0.4 / 19 / 2, abs=2e-3) and last == pytest.approx(
        0.1025 + 0.3975 / 19 / 2, abs=2e-3
    )  # seeds end at 0.1 and 0.105
    fig = tmp_path / KIND_FIGURE
    assert fig.exists() and fig.stat().st_size > 5000 and result["paths"]["entropy_kind"] == fig
    assert (tmp_path / "lab-entropy.png").exists()


@pytest.mark.parametrize("variant", ["grpo", "stare", "steer", "clip_cov"])
def test_tool_presets_state_every_deviation(variant):
    cfg = compose("train", [f"experiment=lab_tool_{variant}"])
    assert cfg.data.name == "tool_countdown" and cfg.tools.enabled and cfg.tools.name == "code_interpreter"
    assert cfg.algo.name == variant and cfg.trainer.threads == 1
    for name in (f"lab_tool_{variant}", "lab_tool_common"):
        text = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
        assert text.splitlines()[0].strip() == "# @package _global_"
        for line in text.split("\ndefaults:", 1)[1].splitlines():
            s = line.strip()
            if s and not s.startswith("#") and not s.endswith(":"):
                assert "#" in line, f"{name}: {line!r} says no reason"


def test_the_tool_ablation_lists_the_presets_and_defaults_to_three_methods():
    assert default_variants("lab_tools") == ["grpo", "stare", "steer"]
    assert set(training_variants("lab_tools")) == {"grpo", "stare", "steer", "clip_cov"}
    cfg = compose("sweep", ["ablation=lab_tools"])
    assert cfg.ablation.report_step == "lab_tools"
    from entropyrl.sweeps.plugins import load_plugins
    from entropyrl.sweeps.report import REPORT_STEPS

    load_plugins()
    assert "lab_tools" in REPORT_STEPS


def test_lab_tools_rejects_a_variant_of_the_other_ablation(tmp_path):
    proc = subprocess.run(
        [*CLI, "lab", "--experiment", "tools", "--algos", "grpo,kl_cov", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "unknown tool-study variant 'kl_cov'" in proc.stderr and "Traceback" not in proc.stderr
    assert "clip_cov" in proc.stderr


def test_lab_help_documents_the_tool_study():
    proc = subprocess.run(
        [*CLI, "lab", "--help"], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"}
    )
    assert proc.returncode == 0 and "tools" in proc.stdout and "lab_tools" in proc.stdout


@pytest.mark.slow
def test_entropyrl_lab_tools_end_to_end(tmp_path):
    """`entropyrl lab --experiment tools` with one seed, a few steps and few prompts: the report, the
    claim table with the tool claims, the figure, and every run's tool metrics, on the preset's task
    (data=tool_countdown) from a short warm start (one cache entry per test session)."""
    cmd = [
        *CLI,
        "lab",
        "--experiment",
        "tools",
        "--algos",
        "grpo,stare",
        "--seeds",
        "0",
        "--jobs",
        "1",
        "--out",
        str(tmp_path / "lab"),
        "trainer.total_steps=3",
        "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=4",
        "trainer.val_every=3",
        "val.prompts=8",
        "tracking.enabled=false",
        # a short warm start on the study's task, built once per test session
        "model.warm_start.steps=120",
        "model.warm_start.batch_size=32",
        "model.warm_start.label_noise=0.2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lab = tmp_path / "lab"
    sweep = json.loads((lab / "sweep.json").read_text())
    assert sweep["ablation"]["name"] == "lab_tools" and [j["key"] for j in sweep["jobs"]] == ["grpo/s0", "stare/s0"]
    assert yaml.safe_load((lab / "runs" / "grpo" / "s0" / "config.yaml").read_text())["data"]["name"] == "tool_countdown"
    for variant in ("grpo", "stare"):
        rows = [json.loads(r) for r in (lab / "runs" / variant / "s0" / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if "entropy" in r]
        assert [r["step"] for r in train] == [1, 2, 3]
        for r in train:
            assert {"entropy/kind/text", "entropy/kind/code", "entropy/kind/post_tool", "tools/calls/mean"} <= set(r)
            assert r["tools/calls/mean"] > 0  # the warm-started policy calls the tool
            assert math.isfinite(r["entropy/kind/code"])
    doc = json.loads((lab / "lab.json").read_text())
    claims = {c["id"]: c for c in doc["claims"]}
    assert {"tool_grpo_collapses", "tool_stare_holds_target", "tool_entropy_by_kind"} == set(claims)
    assert claims["tool_grpo_collapses"]["reproduced"] is not None and claims["tool_stare_holds_target"]["per_seed"]
    assert (
        claims["tool_entropy_by_kind"]["status"] == "descriptive" and "grpo: text" in claims["tool_entropy_by_kind"]["measured"]
    )
    report = (lab / "report.md").read_text()
    assert "`tool_grpo_collapses`" in report and "## Entropy by token kind and turn" in report
    assert (lab / "lab-tools-entropy-kind.png").stat().st_size > 5000
    assert "tool_grpo_collapses:" in proc.stderr  # the CLI prints the claim table


def test_the_kinds_figure_draws_a_series_equal_to_another_once_under_both_names(tmp_path):
    """In the tool tasks the later turns are all text after a tool result and a first turn without
    prose is all code: drawn apart, one line hid the other exactly. Equal series are one line with
    both names; distinct ones stay apart."""
    import matplotlib

    matplotlib.use("Agg")
    from entropyrl.sweeps.lab.tool_step import coinciding_series_merged, plot_kinds

    def rows(code, post):
        return [
            {
                "step": s,
                "entropy/kind/text": 0.5,
                "entropy/kind/code": code[s - 1],
                "entropy/kind/post_tool": post[s - 1],
                "entropy/turn/first": code[s - 1],
                "entropy/turn/later": post[s - 1],
            }
            for s in (1, 2, 3)
        ]

    runs = {"grpo": {0: rows([0.3, 0.2, 0.1], [0.05, 0.04, 0.03]), 1: rows([0.3, 0.25, 0.2], [0.05, 0.05, 0.04])}}
    from entropyrl.sweeps.aggregate import seed_band

    keys = ("entropy/kind/text", "entropy/kind/code", "entropy/kind/post_tool", "entropy/turn/first", "entropy/turn/later")
    bands = [(k, seed_band(runs["grpo"].values(), k)) for k in keys]
    labels = [label for label, _ls, _b in coinciding_series_merged(bands)]
    assert labels == ["text", "code = first turn", "post-tool = later turns"]
    # a series that differs at one step stays its own line
    runs["grpo"][1][2]["entropy/turn/later"] = 0.5
    bands = [(k, seed_band(runs["grpo"].values(), k)) for k in keys]
    assert [label for label, _ls, _b in coinciding_series_merged(bands)] == [
        "text",
        "code = first turn",
        "post-tool",
        "later turns",
    ]
    assert plot_kinds(runs, tmp_path / "kinds.png").is_file()
