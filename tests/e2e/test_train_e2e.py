"""End-to-end training on the embedded default: the CLI, MLflow, metrics.jsonl, checkpoints, resume,
determinism. Real MLflow (sqlite store in the test's working directory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NAMED_METRICS = ("entropy", "reward/mean", "acc/mean", "response_length/mean", "loss/policy", "clip/frac")
CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def rows_of(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def mlflow_client(workdir: Path):
    import mlflow

    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    return mlflow.tracking.MlflowClient(uri)


@pytest.mark.slow
def test_cli_train_logs_named_metrics_to_mlflow_and_jsonl(in_tmp, fast_train):
    out = subprocess.run(
        [
            *CLI,
            "train",
            *fast_train,
            "output_dir=run",
            "tracking.experiment=e2e",
            "val.benchmarks=[aime24]",
            "val.limit=2",
            "val.n_samples=2",
            "val.max_new_tokens=8",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = in_tmp / "run"
    rows = rows_of(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        for key in NAMED_METRICS:
            assert r.get(key) is not None, (key, r)
    assert sum("val/acc" in r for r in rows) == 2
    # real-benchmark validation through the eval harness (AIME24, the packaged copy)
    # the same names in metrics.jsonl as in MLflow, which cannot hold '@'
    assert sum("val/aime24/avg_at_2" in r for r in rows) == 2 and not any("@" in k for r in rows for k in r)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["steps"] == 4
    assert (run_dir / "curves.png").stat().st_size > 5000
    assert (run_dir / "checkpoints" / "step_000004" / "model" / "config.json").exists()

    client = mlflow_client(in_tmp)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["algo.name"] == "grpo" and run.data.params["trainer.total_steps"] == "4"
    for key in (*NAMED_METRICS, "val/acc", "val/aime24/avg_at_2"):  # MLflow names cannot hold '@'
        assert key in run.data.metrics, key
    assert [m.step for m in client.get_metric_history(run.info.run_id, "entropy")] == [1, 2, 3, 4]
    # the entropy story is MLflow's first section (sections sort by prefix): copies of the headline curves
    sections = sorted({k.rsplit("/", 1)[0] for k in run.data.metrics if "/" in k})
    assert sections[0] == "0_overview", sections[:3]
    assert run.data.metrics["0_overview/entropy"] == run.data.metrics["entropy"] == rows[-1]["0_overview/entropy"]
    assert rows[-1]["0_overview/val_acc"] == rows[-1]["val/acc"] and "0_overview/train_acc" in rows[0]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "curves.png", "quadrants.png", "summary.json", "metrics.jsonl"} <= artifacts
    assert (run_dir / "quadrants.png").stat().st_size > 5000
    assert not (run_dir / "tools.png").exists() and "tools.png" not in artifacts  # tools off: no tool figure


@pytest.mark.slow
def test_resume_continues_step_count_and_mlflow_run(in_tmp, fast_train):
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import train

    overrides = [*fast_train, "output_dir=run", "tracking.uri=sqlite:///mlflow.db"]
    first = train(compose("train", overrides), log=lambda *_: None)
    # Lose the newest checkpoint, as if the job died between step 2's and step 4's save.
    import shutil

    shutil.rmtree(in_tmp / "run" / "checkpoints" / "step_000004")
    second = train(compose("train", [*overrides, "trainer.total_steps=6"]), log=lambda *_: None)
    assert second["mlflow_run_id"] == first["mlflow_run_id"]
    assert [r["step"] for r in rows_of(in_tmp / "run")] == [1, 2, 3, 4, 5, 6]
    client = mlflow_client(in_tmp)
    steps = [m.step for m in client.get_metric_history(first["mlflow_run_id"], "entropy")]
    assert steps == [1, 2, 3, 4, 5, 6]  # one continuous sequence, nothing logged twice
    assert (in_tmp / "run" / "checkpoints" / "step_000006").exists()


@pytest.mark.slow
def test_same_seed_same_metrics(in_tmp, fast_train):
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import train

    def run(name, seed):
        train(
            compose("train", [*fast_train, f"output_dir={name}", "tracking.enabled=false", f"trainer.seed={seed}"]),
            log=lambda *_: None,
        )
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows_of(in_tmp / name)]

    a, b, c = run("a", 0), run("b", 0), run("c", 1)
    assert a == b
    assert a != c


def test_unreachable_tracking_server_fails_fast(in_tmp, fast_train):
    out = subprocess.run(
        [*CLI, "train", *fast_train, "output_dir=run", "tracking.uri=http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2
    assert "cannot reach the MLflow tracking server at http://127.0.0.1:9" in out.stderr
    assert not (in_tmp / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_default_run_shows_grpo_entropy_collapse(in_tmp):
    """`entropyrl train` with no arguments (what `make run` runs): entropy collapses."""
    out = subprocess.run(
        [*CLI, "train", "output_dir=default", "trainer.progress=false"], capture_output=True, text=True, timeout=1200
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((in_tmp / "default" / "summary.json").read_text())
    assert summary["steps"] == 200 and summary["algo"] == "grpo"
    assert summary["entropy/last_tenth"] < 0.5 * summary["entropy/first_tenth"], summary
    assert summary["final/val/acc"] > 0.0
    # the regime check flags the collapse at the first step whose entropy is below 0.2x the
    # first-tenth mean (trainers/run/regime.py). Measured with the default settings: flagged at steps
    # 63-89 over seeds 0-2 at 1 and 2 torch threads, and at 54-124 from three other warm starts
    # (warm_start.seed 1 and 2, and one built on 2 threads).
    rows = [json.loads(line) for line in (in_tmp / "default" / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["entropy"]) for r in rows if "entropy" in r]
    first_tenth = sum(v for _, v in curve[: len(curve) // 10]) / (len(curve) // 10)
    below = [step for step, v in curve if v < 0.2 * first_tenth]
    collapse = [f for f in summary["flags"] if f["id"] == "collapse"]
    assert below and [f["first_step"] for f in collapse] == below[:1], (collapse, below[:3], first_tenth)
    assert f"step {below[0]}" in collapse[0]["message"], collapse
