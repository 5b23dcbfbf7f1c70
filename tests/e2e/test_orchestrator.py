"""One orchestrator, one tracking interface, one seed band: the lab is the ``lab`` ablation run by
the sweep machinery (a real `entropyrl lab` run, its folder a sweep folder), MLflow is reached only
through core/tracking.py, and the sweep plots and the lab figures share ``aggregate.seed_band``."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from entropyrl.conf import compose
from entropyrl.sweeps import aggregate as agg
from entropyrl.sweeps.ablation import default_variants, expand, training_variants
from entropyrl.sweeps.job_kinds import JOB_KINDS
from entropyrl.sweeps.lab.report import plot_band

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "entropyrl.cli.main"]


# ---------------------------------------------------------------------------------------------
# one seed band
# ---------------------------------------------------------------------------------------------
def _rows(values: dict[int, float | None]) -> list[dict]:
    return [{"step": s, "entropy": v} for s, v in values.items()]


SEEDS = {
    0: {1: 0.9, 2: 0.8, 3: 0.7, 4: 0.6},
    1: {1: 1.1, 3: 0.5, 4: 0.4},  # never logged step 2
    2: {1: 1.0, 2: 0.6, 3: float("nan"), 4: 0.5},
}  # a non-finite value at step 3 counts as missing


def test_seed_band_counts_only_the_seeds_that_logged_a_step():
    band = agg.seed_band([_rows(v) for v in SEEDS.values()], "entropy")
    assert band["steps"].tolist() == [1, 2, 3, 4] and band["seeds"] == 3
    for i, step in enumerate(band["steps"].astype(int)):
        logged = [v[step] for v in SEEDS.values() if step in v and math.isfinite(v[step])]
        assert band["n"][i] == len(logged)
        assert band["mean"][i] == pytest.approx(np.mean(logged))
        assert (band["lo"][i], band["hi"][i]) == (min(logged), max(logged))
    assert band["n"].tolist() == [3, 2, 2, 3]  # the stated treatment, visible in n
    assert agg.seed_band([_rows({1: None})], "entropy") is None


def test_lab_figure_keeps_a_step_one_seed_missed(tmp_path, monkeypatch):
    """The lab's figure draws the same band: a step one seed skipped stays in (it used to be dropped
    for every seed)."""
    import matplotlib.pyplot as plt

    runs = {"grpo": {s: _rows(v) for s, v in SEEDS.items()}}
    drawn = []
    original = plt.Axes.plot

    def spy(self, x, *a, **k):  # records what is drawn; the real plot still runs
        drawn.append(list(x))
        return original(self, x, *a, **k)

    monkeypatch.setattr(plt.Axes, "plot", spy)
    path = plot_band(runs, "entropy", tmp_path / "band.png", "entropy")
    assert path is not None and path.stat().st_size > 500
    assert drawn == [agg.seed_band(runs["grpo"].values(), "entropy")["steps"].tolist()] == [[1, 2, 3, 4]]


# ---------------------------------------------------------------------------------------------
# one tracking interface
# ---------------------------------------------------------------------------------------------
RAW_MLFLOW = re.compile(r"^\s*(import mlflow|from mlflow)\b|MlflowClient|\bmlflow\.[A-Za-z_]+\s*\(", re.M)


def raw_mlflow_uses(root: Path) -> list[str]:
    """``path:line`` of every direct MLflow call or import in the package outside core/."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("tests", "core", "build") or any(p.startswith(".") for p in rel.parts):
            continue
        text = path.read_text(encoding="utf-8")
        for m in RAW_MLFLOW.finditer(text):
            found.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}")
    return found


def test_mlflow_is_reached_only_through_core_tracking():
    assert raw_mlflow_uses(REPO) == []


def test_the_raw_mlflow_finder_finds_one(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "x.py").write_text("import os\n\ndef f():\n    import mlflow\n    mlflow.log_metric('a', 1)\n")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "ok.py").write_text("from mlflow.tracking import MlflowClient\n")
    assert raw_mlflow_uses(tmp_path) == ["cli/x.py:4", "cli/x.py:5"]


# ---------------------------------------------------------------------------------------------
# one orchestrator
# ---------------------------------------------------------------------------------------------
def test_the_lab_ablation_plans_the_quadrant_experiment_as_a_job_kind(tmp_path):
    cfg = compose("sweep", ["ablation=lab", "ablation.quadrant_batches=3"])
    jobs = expand(cfg.ablation, seeds=[0, 1], sweep_dir=tmp_path)
    by_key = {j.key: j for j in jobs}
    assert [j.key for j in jobs][:2] == ["quadrants/s0", "quadrants/s1"]  # first: its claim needs every seed
    assert by_key["quadrants/s1"].extra == {"kind": "quadrant_probe", "params": {"batches": 3}}
    assert by_key["stare/s0"].extra == {} and "experiment=lab_stare" in by_key["stare/s0"].overrides
    # the ablation holds every lab variant; `entropyrl lab` runs its default set unless --algos all
    assert {j.variant for j in jobs} - {"quadrants"} == set(training_variants("lab"))
    assert set(default_variants("lab")) < set(training_variants("lab")) and {"ce_gppo", "entropic", "gspo"} <= set(
        training_variants("lab")
    )
    assert set(JOB_KINDS) >= {"train", "quadrant_probe"}  # the lab plugin registered its kind


def test_the_generic_sweep_imports_no_plugin_and_loads_them_on_lookup():
    """sweeps/ reaches the lab only through its seams: importing the sweep machinery imports no
    plugin; asking for a kind or report step it does not know loads them."""
    import subprocess
    import sys

    code = (
        "import sys; import entropyrl.sweeps.planning, entropyrl.sweeps.report, entropyrl.sweeps.following; "
        "assert not [m for m in sys.modules if m.startswith('entropyrl.sweeps.lab')], 'lab imported'; "
        "from entropyrl.sweeps.job_kinds import job_class; from entropyrl.sweeps.report import REPORT_STEPS; "
        "assert job_class('quadrant_probe').__module__ == 'entropyrl.sweeps.lab.quadrant_probe'; "
        "assert 'lab' in REPORT_STEPS"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _mlflow_runs(db: Path, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp is not None else []


@pytest.mark.slow
def test_entropyrl_lab_runs_through_the_sweep_machinery(in_tmp):
    db = in_tmp / "mlflow.db"
    cmd = [
        *CLI,
        "lab",
        "--algos",
        "grpo",
        "--seeds",
        "0",
        "--quadrant-batches",
        "1",
        "--jobs",
        "2",
        "--out",
        "lab",
        "trainer.total_steps=2",
        "trainer.val_every=2",
        "val.prompts=8",
        "diagnostics.probe_prompts=4",
        "diagnostics.attribution_every=2",
        f"tracking.uri=sqlite:///{db}",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=in_tmp, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 jobs (0 done, 0 still queued/running, 2 to run) on local (at most 2 at once)" in first.stderr
    lab = in_tmp / "lab"
    sweep = json.loads((lab / "sweep.json").read_text())
    assert sweep["ablation"]["name"] == "lab" and sweep["command"].startswith("entropyrl lab --algos grpo")
    assert [j["key"] for j in sweep["jobs"]] == ["quadrants/s0", "grpo/s0"]
    assert all("trainer.threads=1" in j["overrides"] for j in sweep["jobs"])  # one torch thread each
    quadrants = json.loads((lab / "runs" / "quadrants" / "s0" / "quadrants.json").read_text())
    assert set(quadrants) == {"q1", "q2", "q3", "q4", "predicted", "tabular"}
    assert all(len(quadrants[q]) <= 1 and len(quadrants["predicted"][q]) == len(quadrants[q]) for q in ("q1", "q2", "q3", "q4"))
    for q in ("q1", "q2", "q3", "q4"):  # a small SGD step: the network's first-order prediction holds (measured: 0.1 %)
        for real, pred in zip(quadrants[q], quadrants["predicted"][q]):
            assert abs(pred - real) <= 0.05 * abs(real), (q, pred, real)
    steps = [json.loads(r)["step"] for r in (lab / "runs" / "grpo" / "s0" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]

    doc = json.loads((lab / "lab.json").read_text())
    claims = {c["id"]: c for c in doc["claims"]}
    assert all(set(c) >= {"id", "claim", "measured", "reproduced", "per_seed"} for c in doc["claims"])
    assert claims["grpo_collapses"]["reproduced"] is not None and len(claims["grpo_collapses"]["per_seed"]) == 1
    assert claims["quadrant_signs"]["per_seed"][0]["seed"] == 0
    assert claims["stare_holds_target"]["reproduced"] is None  # not run
    # the lab measures the attribution (every 10 steps; every 2nd here: step 2) and explains the claims with it
    grpo = next(v for v in doc["variants"] if v["variant"] == "grpo")
    assert grpo["attribution"]["seeds"] == [0] and {"q1", "q3", "momentum"} <= set(grpo["attribution"]["total"])
    assert "grpo seed 0: 1 measured steps: predicted" in claims["grpo_collapses"]["attribution_text"]
    assert set(doc["quadrant_comparison"]) == {"q1", "q2", "q3", "q4"}
    report = (lab / "report.md").read_text()
    assert "## Why entropy moved" in report and "network prediction" in report
    assert "| first order (predicted_net_1st): r detrended |" in report  # the first order's fit beside the trapezoid's
    assert (lab / "report.md").read_text().startswith("# entropyrl lab report")
    assert (lab / "sweep-report.md").exists() and (lab / "lab-entropy.png").exists()

    runs = _mlflow_runs(db, "lab")
    parents = [r for r in runs if r.data.tags.get("entropyrl.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert [r.info.run_name for r in children] == ["grpo-s0"]  # the quadrant job tracks nothing
    assert parent.data.metrics["claims/grpo_collapses"] == float(claims["grpo_collapses"]["reproduced"])

    status = subprocess.run([*CLI, "status", "lab"], capture_output=True, text=True, cwd=in_tmp, timeout=300)
    assert status.returncode == 0 and "2 done, 0 running, 0 pending, 0 failed" in status.stdout

    # the same command again reuses both finished jobs and rebuilds the report over them
    (lab / "lab.json").unlink()
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=in_tmp, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 jobs (2 done, 0 still queued/running, 0 to run)" in again.stderr
    assert json.loads((lab / "lab.json").read_text())["claims"] == doc["claims"]
    assert len([r for r in _mlflow_runs(db, "lab") if r.data.tags.get("entropyrl.role") == "sweep"]) == 1
