"""Runs started together on a fresh local sqlite store all open (MLflow's first-use table creation
is serialised by ``entropyrl.mlflow_store.store_lock``)."""

from __future__ import annotations

import subprocess
import sys
import time

from entropyrl.core.mlflow_store import sqlite_path

OPEN_RUN = """
import sys, time
from pathlib import Path
from omegaconf import OmegaConf
from entropyrl.core.tracking import RunTracker
uri, out, start_at = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
import mlflow  # noqa: F401  (imported before the common start so the processes meet in the store)
tracker = RunTracker(OmegaConf.create({"uri": uri, "experiment": "together"}), out, log=lambda *_: None)
time.sleep(max(0.0, start_at - time.time()))
tracker.start(OmegaConf.create({"trainer": {"seed": 0}}), run_name=out.name, resume_step=None)
tracker.log_metrics(1, {"entropy": 1.0})
tracker.finish()
print(tracker.run_id)
"""


def test_sqlite_path_of_uris(tmp_path):
    assert sqlite_path("sqlite:///mlflow.db").as_posix() == "mlflow.db"
    assert sqlite_path(f"sqlite:///{tmp_path}/m.db") == tmp_path / "m.db"
    assert sqlite_path("http://127.0.0.1:5000") is None and sqlite_path("sqlite:///:memory:") is None


def test_runs_started_together_on_a_fresh_sqlite_store_all_open(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    start_at = time.time() + 12  # after every process has imported torch, transformers, mlflow
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_RUN, uri, str(tmp_path / f"run{i}"), str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-600:] for _, err in results]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("together").experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(out.strip() for out, _ in results)


def test_a_relative_sqlite_uri_follows_the_working_directory_within_one_process(tmp_path, monkeypatch):
    """MLflow caches one store per URI string for the life of the process: a relative
    ``sqlite:///mlflow.db`` used again after a change of directory must reach the new folder's
    database, not the first one's (a lab, a notebook, a test session train in many folders)."""
    import mlflow
    from omegaconf import OmegaConf

    from entropyrl.core.mlflow_store import resolve_uri
    from entropyrl.core.tracking import RunTracker

    runs = {}
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        cfg = OmegaConf.create({"uri": "sqlite:///mlflow.db", "experiment": "cwd"})
        assert resolve_uri(cfg) == f"sqlite:///{tmp_path / name / 'mlflow.db'}"
        tracker = RunTracker(cfg, tmp_path / name / "run", log=lambda *_: None)
        tracker.start(OmegaConf.create({"trainer": {"seed": 0}}), run_name=name, resume_step=None)
        tracker.log_metrics(1, {"entropy": 1.0})
        tracker.finish()
        runs[name] = tracker.run_id
    for name, run_id in runs.items():
        client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / name / 'mlflow.db'}")
        assert [m.step for m in client.get_metric_history(run_id, "entropy")] == [1]
        assert client.get_run(run_id).info.status == "FINISHED"
