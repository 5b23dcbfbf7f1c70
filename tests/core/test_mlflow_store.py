"""Runs started together on a fresh local sqlite store all open (MLflow's first-use table creation
is serialised by ``entropyrl.mlflow_store.store_lock``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

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


DIE_AFTER = """
import os, sys
from pathlib import Path
from omegaconf import OmegaConf
from entropyrl.core.tracking import RunTracker
uri, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
if steps < 0:  # killed while starting: the run exists, its params are being logged
    import entropyrl.core.tracking as tracking
    tracking.flatten = lambda *_: os._exit(3)
tracker = RunTracker(OmegaConf.create({"uri": uri, "experiment": "ends"}), out, log=lambda *_: None)
tracker.start(OmegaConf.create({"trainer": {"seed": 0}}), run_name="attempt", resume_step=None)
for step in range(1, steps + 1):
    tracker.log_metrics(step, {"entropy": 9.0})
os._exit(3)  # no finish, no exit hooks: a reward calling os._exit, a kill -9, an OOM kill
"""


def _die_after(uri: str, out, steps: int) -> None:
    done = subprocess.run([sys.executable, "-c", DIE_AFTER, uri, str(out), str(steps)], capture_output=True, text=True)
    assert done.returncode == 3, done.stderr[-2000:]


def _start_again(uri: str, out):
    from omegaconf import OmegaConf

    from entropyrl.core.tracking import RunTracker

    lines = []
    tracker = RunTracker(OmegaConf.create({"uri": uri, "experiment": "ends"}), out, log=lines.append)
    tracker.start(OmegaConf.create({"trainer": {"seed": 0}}), run_name="attempt", resume_step=None)
    tracker.log_metrics(1, {"entropy": 1.0})
    tracker.finish()
    return tracker.run_id, lines


def test_a_run_that_died_before_its_first_checkpoint_is_superseded_not_reopened(tmp_path):
    """Started again with nothing to resume from, the steps are computed again from step 1: the dead
    attempt's MLflow run (RUNNING, holding steps) is ended FAILED and tagged superseded, and the new
    run holds only the new values."""
    import json

    import mlflow

    uri, out = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "run"
    _die_after(uri, out, steps=2)
    old = json.loads((out / "tracking.json").read_text())["run_id"]
    new, lines = _start_again(uri, out)
    assert new != old
    client = mlflow.tracking.MlflowClient(uri)
    dead = client.get_run(old)
    assert dead.info.status == "FAILED" and dead.data.tags["entropyrl.superseded_by"] == new
    assert [(m.step, m.value) for m in client.get_metric_history(new, "entropy")] == [(1, 1.0)]
    assert client.get_run(new).info.status == "FINISHED" and any("superseded" in line for line in lines)


def test_a_run_killed_while_starting_is_reused_not_left_running_beside_a_new_one(tmp_path):
    import mlflow

    uri, out = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "run"
    _die_after(uri, out, steps=-1)
    new, _ = _start_again(uri, out)
    client = mlflow.tracking.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ends").experiment_id])
    assert [r.info.run_id for r in runs] == [new] and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["trainer.seed"] == "0"


def test_a_sweep_job_run_again_from_scratch_marks_its_earlier_child_superseded(tmp_path):
    """A resumed sweep whose job folder was deleted trains that job again in a new child run of the
    same parent; the earlier child (same name) is tagged with the run that supersedes it."""
    import mlflow
    from omegaconf import OmegaConf

    from entropyrl.core.tracking import RunTracker, TrackingStore

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    parent = TrackingStore(uri).open_run("sweeps", "gate-sweep")
    children = []
    for attempt in ("first", "again"):
        cfg = OmegaConf.create({"uri": uri, "experiment": "sweeps", "parent_run_id": parent})
        tracker = RunTracker(cfg, tmp_path / attempt, log=lambda *_: None)
        tracker.start(OmegaConf.create({"trainer": {"seed": 0}}), run_name="gated-s0", resume_step=None)
        tracker.log_metrics(1, {"entropy": 1.0})
        tracker.finish()
        children.append(tracker.run_id)
    client = mlflow.tracking.MlflowClient(uri)
    first, again = (client.get_run(r) for r in children)
    assert first.data.tags["entropyrl.superseded_by"] == again.info.run_id
    assert "entropyrl.superseded_by" not in again.data.tags
    assert first.info.status == "FINISHED"  # it ended as it ended; the tag and its name say it was replaced
    assert (first.info.run_name, again.info.run_name) == ("gated-s0 (superseded)", "gated-s0")  # not two of one name


def test_an_artifact_folder_that_cannot_be_written_is_one_line_before_training(tmp_path, monkeypatch):
    """A sqlite store keeps artifacts in mlruns beside its database file; a file in the way (or a folder without write
    permission) is named in one line when the run opens, and the run is not left RUNNING."""
    import mlflow
    import pytest
    from omegaconf import OmegaConf

    from entropyrl.core.errors import UserError
    from entropyrl.core.tracking import RunTracker, local_artifact_path

    assert local_artifact_path("file:///a/b%20c") == Path("/a/b c") and local_artifact_path("/x/y") == Path("/x/y")
    assert local_artifact_path("s3://bucket/x") is None and local_artifact_path("mlflow-artifacts:/1/a") is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns").write_text("not a folder")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = RunTracker(OmegaConf.create({"uri": uri, "experiment": "blocked"}), tmp_path / "run", log=lambda *_: None)
    with pytest.raises(UserError, match=r"cannot write MLflow artifacts to .*mlruns.*tracking.uri="):
        tracker.start(OmegaConf.create({"trainer": {"seed": 0}}), run_name="r", resume_step=None)
    assert mlflow.active_run() is None
    assert mlflow.tracking.MlflowClient(uri).get_run(tracker.run_id).info.status == "FAILED"


def _artifact_folders(uri: str, elsewhere: Path) -> list[Path]:
    """A run (RunTracker) and a sweep parent (TrackingStore) opened on ``uri`` from ``elsewhere``:
    the local folders their artifacts go to."""
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from entropyrl.core.tracking import RunTracker, TrackingStore, local_artifact_path

    tracker = RunTracker(OmegaConf.create({"uri": uri, "experiment": "runs"}), elsewhere / "run", log=lambda *_: None)
    tracker.start(OmegaConf.create({"trainer": {"seed": 0}}), run_name="r", resume_step=None)
    tracker.log_metrics(1, {"entropy": 1.0})
    tracker.finish()
    parent = TrackingStore(uri).open_run("sweeps", "a-sweep")
    client = MlflowClient(uri)
    return [local_artifact_path(client.get_run(r).info.artifact_uri) for r in (tracker.run_id, parent)]


def test_a_sqlite_store_keeps_its_artifacts_beside_itself_not_where_the_run_started(tmp_path, monkeypatch):
    """A store named by an absolute path: its experiments' artifacts go to mlruns beside the
    database file, whichever folder the run or the sweep started from (MLflow's own default,
    ./mlruns of the process's working directory, scatters them); a store in the working directory,
    as the default relative ``sqlite:///mlflow.db`` is, keeps MLflow's layout there."""
    from entropyrl.core import mlflow_store

    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    folders = _artifact_folders(f"sqlite:///{store}/mlflow.db", elsewhere)
    assert all(f is not None and f.is_relative_to(store / "mlruns") for f in folders), folders
    assert not (elsewhere / "mlruns").exists()
    assert mlflow_store.artifact_location("sqlite:///mlflow.db") is None  # MLflow's ./mlruns/<id>: the same folder
    assert mlflow_store.artifact_location("http://localhost:5000") is None
    # null: MLflow's default location (no artifact_location given) lands in the working directory
    monkeypatch.setattr(mlflow_store, "artifact_location", lambda uri: None)
    other = tmp_path / "other"
    other.mkdir()
    folders = _artifact_folders(f"sqlite:///{other}/mlflow.db", elsewhere)
    assert all(f.is_relative_to(elsewhere / "mlruns") for f in folders), folders


def test_a_lost_sweep_jobs_mlflow_run_is_ended_failed_the_next_time_anything_looks(tmp_path):
    """A job whose process died without a word (``os._exit``, kill -9) leaves its run RUNNING; the
    sweep's follower or ``entropyrl status`` finding the job lost ends it FAILED, with the reason."""
    import mlflow

    from entropyrl.sweeps.state import FAILED, JobStatus, close_lost_runs

    uri, out = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "runs" / "gated" / "s0"
    _die_after(uri, out, steps=2)
    client = mlflow.tracking.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ends").experiment_id])
    assert run.info.status == "RUNNING"
    lost = JobStatus("gated/s0", "gated", 0, FAILED, "lost: job process died without reporting; see the log", "log", str(out))
    assert close_lost_runs([lost]) == [run.info.run_id]
    ended = client.get_run(run.info.run_id)
    assert ended.info.status == "FAILED" and ended.data.tags["entropyrl.ended_by"].startswith("gated/s0: lost:")
    assert close_lost_runs([lost]) == []  # once: an ended run is left as it is
    failed = JobStatus("gated/s0", "gated", 0, FAILED, "RuntimeError: boom", "log", str(out))
    assert close_lost_runs([failed]) == []  # a job that reported its own failure ended its run itself
