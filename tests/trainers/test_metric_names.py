"""A metric has one name: ``metrics.jsonl`` and MLflow hold it the same way (MLflow rejects '@', so
``val/aime24/avg@2`` is ``val/aime24/avg_at_2`` in both)."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from entropyrl.core.tracking import RunTracker


def test_file_and_mlflow_use_the_same_metric_names(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "run"
    out.mkdir()
    tracker = RunTracker(OmegaConf.create({"uri": uri, "experiment": "names"}), out, log=lambda *_: None)
    tracker.start(OmegaConf.create({"trainer": {"seed": 0}}), run_name="names", resume_step=None)
    tracker.log_metrics(1, {"entropy": 0.5, "val/aime24/avg@2": 0.25, "val/pass@8": 0.75})
    tracker.finish()
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert set(row) == {"step", "entropy", "val/aime24/avg_at_2", "val/pass_at_8"}
    logged = mlflow.tracking.MlflowClient(uri).get_run(tracker.run_id).data.metrics
    assert set(logged) == set(row) - {"step"}
    assert logged["val/aime24/avg_at_2"] == row["val/aime24/avg_at_2"] == 0.25


def test_the_overview_copies_the_entropy_story_under_the_first_section():
    from entropyrl.trainers.run.overview import overview_metrics

    step = {"entropy": 0.4, "stare/gate_on": 1.0, "acc/mean": 0.5, "loss/policy": 0.1}
    out = overview_metrics(step, ["stare/gate_on"])
    assert out == {
        "0_overview/entropy": 0.4,
        "0_overview/method_stare_gate_on": 1.0,
        "0_overview/train_acc": 0.5,
    }
    # a name without '/' shows last in MLflow's run view; sections sort by name: the overview leads,
    # and within it the headline entropy is the first chart
    assert sorted(out)[0] == "0_overview/entropy"
    assert min(k.rsplit("/", 1)[0] for k in [*out, "acc/mean", "async/dropped", "attribution/x"]) == "0_overview"
    assert overview_metrics({"entropy": 0.3, "val/acc": 0.9}, [])["0_overview/val_acc"] == 0.9
