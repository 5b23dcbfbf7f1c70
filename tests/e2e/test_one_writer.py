"""one writer per run folder. A second `entropyrl train` into a folder a
live run writes is refused with one line naming the holder's host and pid, and the first run's
metrics stay one continuous sequence; a lock left by a killed process is taken over; an output_dir
that cannot be created is one line. Real `entropyrl train` subprocesses, a real MLflow sqlite store."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entropyrl.core.errors import UserError
from entropyrl.core.folder_lock import FolderLock

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def run_args(workdir: Path, fast_train: list[str], *extra: str) -> list[str]:
    return [
        *CLI,
        "train",
        *fast_train,
        "trainer.save_every=0",
        "trainer.val_every=0",
        "val.prompts=0",
        "trainer.threads=1",
        "output_dir=run",
        f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}",
        *extra,
    ]


def steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_second_run_into_a_live_runs_folder_is_refused(in_tmp, fast_train):
    first = subprocess.Popen(
        run_args(in_tmp, fast_train, "trainer.total_steps=500"),
        cwd=in_tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not steps(in_tmp / "run"):
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no step in time"
        time.sleep(0.05)
    second = subprocess.run(
        run_args(in_tmp, fast_train, "trainer.total_steps=500"), cwd=in_tmp, capture_output=True, text=True, timeout=120
    )
    still_running = first.poll() is None
    first.send_signal(signal.SIGTERM)  # ends it cleanly at a step boundary
    _, err = first.communicate(timeout=300)
    assert still_running and first.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: output_dir=run is in use by another `entropyrl train`")
    assert f"(host {socket.gethostname()}, pid {first.pid}," in lines[0]
    done = steps(in_tmp / "run")
    assert done == list(range(1, len(done) + 1))  # one writer: no interleaved steps


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from entropyrl.core.folder_lock import "
            "FolderLock; FolderLock(sys.argv[1]).acquire(); print('held', flush=True); "
            "time.sleep(600)",
            str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(UserError, match=f"pid {holder.pid},"):
        FolderLock(tmp_path / "run").acquire()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    with FolderLock(tmp_path / "run") as lock:  # the dead holder's lock is free
        assert lock.holder()["pid"] == os.getpid()
        with pytest.raises(UserError, match=f"pid {os.getpid()},"):
            FolderLock(tmp_path / "run").acquire()  # and held again, by us


@pytest.mark.parametrize("where", ["/proc/entropyrl-test/run", "FILE/run"])
def test_an_output_dir_that_cannot_be_created_is_one_line(in_tmp, where):
    (in_tmp / "FILE").write_text("a file, not a folder")
    out = subprocess.run(
        [*CLI, "train", f"output_dir={where}", "trainer.total_steps=1"], cwd=in_tmp, capture_output=True, text=True, timeout=120
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    assert where.split("/")[1] in lines[0]
    assert not (in_tmp / "mlflow.db").exists() and not list(in_tmp.glob("outputs"))
