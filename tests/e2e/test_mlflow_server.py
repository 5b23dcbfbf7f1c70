"""Sweeps against a real MLflow tracking server on loopback (`mlflow server` from the venv, sqlite
backend, proxied artifacts), started for the session and killed at teardown."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
TINY = [
    "data=toy",
    "train.trainer.total_steps=3",
    "train.trainer.prompts_per_step=4",
    "train.trainer.mini_batch_prompts=4",
    "train.trainer.val_every=3",
    "train.trainer.save_every=0",
    "train.val.prompts=8",
]
# One server per pytest session: test_slurm.py starts the same way and reuses a live one.
SHARED_URI_ENV = "ENTROPYRL_TEST_MLFLOW_SERVER"


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(uri + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """``http://127.0.0.1:<port>`` of a live `mlflow server` (sqlite store, artifacts proxied)."""
    shared = os.environ.get(SHARED_URI_ENV)
    if shared and _healthy(shared):
        yield shared
        return
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [
            str(mlflow_bin),
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    try:
        while not _healthy(uri):
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited ({proc.returncode}): {(root / 'server.log').read_text()[-2000:]}")
            if time.time() > deadline:
                pytest.fail(f"mlflow server not healthy after 180 s: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        os.environ[SHARED_URI_ENV] = uri
        yield uri
    finally:
        os.environ.pop(SHARED_URI_ENV, None)
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)  # the server and its uvicorn worker: our own process group
                proc.wait(timeout=wait)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        log.close()


@pytest.mark.slow
def test_sweep_logs_parent_and_child_runs_to_a_server(mlflow_server, tmp_path):
    out = subprocess.run(
        [
            *CLI,
            "sweep",
            "ablation=clip",
            "seeds=[0]",
            "launcher=debug",
            "sweep_dir=sw",
            f"tracking.uri={mlflow_server}",
            "tracking.experiment=server-test",
            *TINY,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert sweep["tracking"]["uri"] == mlflow_server

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("server-test")
    parent_id = sweep["tracking"]["parent_run_id"]
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert sorted(r.data.tags["variant"] for r in children) == ["clip_higher", "symmetric"]
    for run in children:
        assert run.info.status == "FINISHED"
        assert run.data.tags["sweep_id"] == sweep["sweep_id"] and run.data.tags["seed"] == "0"
        assert run.data.params["algo.clip.high"] == ("0.28" if run.data.tags["variant"] == "clip_higher" else "0.2")
        assert [m.step for m in client.get_metric_history(run.info.run_id, "entropy")] == [1, 2, 3]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["ablation"] == "clip"
    assert "clip_higher/final_val_acc" in parent.data.metrics
    arts = {a.path for a in client.list_artifacts(parent_id, "report/plots")}
    assert "report/plots/entropy.png" in arts
    # the report's PNG really went through the server's artifact proxy
    local = client.download_artifacts(parent_id, "report/plots/entropy.png", str(tmp_path))
    assert Path(local).stat().st_size > 5000


def test_unreachable_server_is_one_line_error_before_anything_runs(tmp_path):
    port = _free_port()  # nothing listens there
    out = subprocess.run(
        [*CLI, "sweep", "ablation=gate", "seeds=[0]", "sweep_dir=sw", f"tracking.uri=http://127.0.0.1:{port}", *TINY],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"error: cannot reach the MLflow tracking server at http://127.0.0.1:{port}")
    assert not (tmp_path / "sw").exists()
