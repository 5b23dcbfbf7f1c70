"""Nothing lost whatever happens around a run.

- a real `mlflow server` (started here on a free loopback port) killed mid-run and started again:
  training goes on with one warning line, every step reaches MLflow once the server is back, and
  the run is FINISHED only then;
- a full disk mid-run (a small tmpfs mounted here; else a file-size limit): one `error:` line with
  the path, the fix and the resume line, no staging folder, no 0-byte file, the MLflow run FAILED,
  and a resume once space is back continues exactly;
- metrics.jsonl deleted mid-run and before a resume: rebuilt, with a warning;
- a start-up failure leaves nothing that blocks the corrected command.
Real `entropyrl train` subprocesses, real MLflow stores."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def train_args(fast_train: list[str], out: str, uri: str, *extra: str) -> list[str]:
    return [
        *CLI,
        "train",
        *fast_train,
        "trainer.val_every=0",
        "val.prompts=0",
        "trainer.threads=1",
        f"output_dir={out}",
        f"tracking.uri={uri}",
        *extra,
    ]


def steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(ln)["step"] for ln in path.read_text().splitlines() if ln.endswith("}")] if path.exists() else []


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while max(steps(run_dir), default=0) < step:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"step {step} not reached in time"
        time.sleep(0.05)


def sqlite_status(db: Path, run_id: str) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("select status from runs where run_uuid = ?", (run_id,)).fetchone()[0]


# -- a tracking server that goes away ----------------------------------------------------------
def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(uri + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _start_server(root: Path, port: int) -> subprocess.Popen:
    log = (root / "server.log").open("a")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
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
    deadline = time.time() + 180
    while not _healthy(f"http://127.0.0.1:{port}"):
        assert proc.poll() is None and time.time() < deadline, (root / "server.log").read_text()[-2000:]
        time.sleep(0.3)
    return proc


def _kill_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the server and its worker: its own process group
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_tracking_server_outage_mid_run_loses_nothing(tmp_path, fast_train):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    server = _start_server(tmp_path, port)
    proc = None
    try:
        proc = subprocess.Popen(
            train_args(
                fast_train,
                "run",
                uri,
                "trainer.total_steps=30",
                "trainer.save_every=0",
                "tracking.retry_s=1",
                "tracking.flush_wait_s=240",
            ),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for_step(proc, tmp_path / "run", 3)
        _kill_server(server)
        down_at = max(steps(tmp_path / "run"))
        wait_for_step(proc, tmp_path / "run", down_at + 5)  # training goes on while the server is away
        assert (tmp_path / "run" / "tracking.queue.jsonl").exists()
        server = _start_server(tmp_path, port)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        _kill_server(server)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert err.count("stopped answering") == 1 and "answers again: delivered" in err, err[-3000:]
    assert not (tmp_path / "run" / "tracking.queue.jsonl").exists()
    run_id = json.loads((tmp_path / "run" / "tracking.json").read_text())["run_id"]
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        logged = [
            s
            for (s,) in con.execute(
                "select distinct step from metrics where run_uuid = ? and key = 'entropy' order by step", (run_id,)
            )
        ]
    assert logged == list(range(1, 31)) == steps(tmp_path / "run")
    assert sqlite_status(tmp_path / "mlflow.db", run_id) == "FINISHED"


# -- a disk that fills up ----------------------------------------------------------------------
@pytest.fixture()
def small_disk(tmp_path):
    """``(folder, preexec)``: a 12 MB tmpfs where we may mount one, else a plain folder and a
    file-size limit for the child process."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(folder)], capture_output=True).returncode == 0
    )
    limit = None if mounted else (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20)))
    try:
        yield folder, limit, mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_and_resumes(tmp_path, fast_train, small_disk):
    disk, limit, mounted = small_disk
    db = tmp_path / "mlflow.db"
    run = disk / "run"
    out = subprocess.run(
        train_args(
            fast_train,
            str(run),
            f"sqlite:///{db}",
            "trainer.total_steps=60",
            "trainer.save_every=1",
            "trainer.keep_checkpoints=100",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[-1].startswith("error: cannot write ") and "resume from it" in lines[-1], lines[-3:]
    assert ("no space left" in lines[-1].lower()) if mounted else ("too large" in lines[-1] or "space" in lines[-1]), lines[-1]
    assert not list((run / "checkpoints").glob(".tmp-*"))  # staging folder removed
    assert not [p for p in run.rglob("*") if p.is_file() and p.stat().st_size == 0 and p.name != ".lock"]
    run_id = json.loads((run / "tracking.json").read_text())["run_id"]
    assert sqlite_status(db, run_id) == "FAILED"
    kept = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    assert kept and f"checkpoint at step {kept[-1]} is intact" in lines[-1]
    for step in kept[:-1]:  # space is back
        subprocess.run(["rm", "-rf", str(run / "checkpoints" / f"step_{step:06d}")], check=True)
    again = subprocess.run(
        train_args(
            fast_train,
            str(run),
            f"sqlite:///{db}",
            f"trainer.total_steps={kept[-1] + 2}",
            "trainer.save_every=0",
            "trainer.keep_checkpoints=1",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr and steps(run) == list(range(1, kept[-1] + 3))
    assert sqlite_status(db, run_id) == "FINISHED"


# -- metrics.jsonl deleted ---------------------------------------------------------------------
@pytest.mark.slow
def test_a_deleted_metrics_record_is_rebuilt(tmp_path, fast_train):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.Popen(
        train_args(fast_train, "run", uri, "trainer.total_steps=500", "trainer.save_every=2"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_step(proc, tmp_path / "run", 4)
    (tmp_path / "run" / "metrics.jsonl").unlink()
    time.sleep(1.0)
    wait_for_step(proc, tmp_path / "run", 7)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err[-3000:]
    assert "was deleted or cut short while the run wrote it" in err
    done = steps(tmp_path / "run")
    assert done == list(range(1, len(done) + 1))
    # lost between runs: rebuilt from the checkpoint's copy when the run is resumed
    (tmp_path / "run" / "metrics.jsonl").unlink()
    again = subprocess.run(
        train_args(fast_train, "run", uri, f"trainer.total_steps={len(done) + 2}", "trainer.save_every=2"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "rebuilt from the checkpoint" in again.stderr
    assert steps(tmp_path / "run") == list(range(1, len(done) + 3))


# -- a start-up failure ------------------------------------------------------------------------
def test_a_start_up_failure_leaves_nothing_that_blocks_the_fix(tmp_path, fast_train):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    bad = subprocess.run(
        train_args(fast_train, "run", uri, "trainer.total_steps=1", "model.path=/no/such/model"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        bad.returncode == 2 and "Traceback" not in bad.stderr and "error: model.path=/no/such/model: no such folder" in bad.stderr
    )
    assert not (tmp_path / "run").exists()  # the folder it made goes: no config, no MLflow run, no empty folder
    fixed = subprocess.run(
        train_args(fast_train, "run", uri, "trainer.total_steps=1"), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert fixed.returncode == 0, fixed.stderr[-3000:]
