"""Local sweep jobs forked from the sweep's warm worker (sweeps/warm_worker.py) run as cold ones do.

A warm sweep's jobs finish with their submitit records (logs, result pickle, job.json) and the same
metrics as a cold job of the same seed, each in a process of its own; a Ctrl-C to the sweep's group
still stops a warm job at a step boundary; a killed worker fails its job with one ``error:`` line,
not a hang. Real `entropyrl sweep` subprocesses with tiny runs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entropyrl.core.errors import UserError
from entropyrl.sweeps.launchers import LocalLauncher

from .test_sweep_stop import CLI, JOB, alive  # the stop tests' tiny sweep job and process check


def sweep(tmp_path: Path, folder: str, *args: str) -> list[str]:
    return [
        *CLI,
        "sweep",
        "ablation=clip",
        "variants=[symmetric]",
        f"sweep_dir={folder}",
        "launcher=local",
        "poll_seconds=0.5",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        *JOB,
        *args,
    ]


def worker_pid(sweep_dir: Path) -> int:
    return int(re.search(r"warm worker (\d+): ready", (sweep_dir / "logs" / "warm_worker.log").read_text()).group(1))


def metrics(job_dir: Path) -> list[dict]:
    """metrics.jsonl without its wall-clock keys."""
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def wait_for_a_step(proc: subprocess.Popen, job_dir: Path) -> None:
    deadline = time.monotonic() + 300
    while not (job_dir / "metrics.jsonl").exists() or not (job_dir / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the job logged no step in time"
        time.sleep(0.2)


def start_long_sweep(tmp_path: Path, **popen) -> tuple[subprocess.Popen, Path]:
    """A one-job sweep of 500 steps in the background, and its job's folder once it logged a step."""
    proc = subprocess.Popen(
        sweep(tmp_path, "sw", "seeds=[0]", "train.trainer.total_steps=500"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    job_dir = tmp_path / "sw" / "runs" / "symmetric" / "s0"
    wait_for_a_step(proc, job_dir)
    return proc, job_dir


@pytest.mark.slow
def test_warm_jobs_finish_with_their_records_and_a_cold_jobs_metrics(tmp_path):
    # as a user's shell has it: no OMP_NUM_THREADS (importing torch then starts a thread pool)
    bare = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    warm = subprocess.run(
        sweep(tmp_path, "warm", "seeds=[0,1]", "train.trainer.total_steps=3"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=bare,
    )
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "on local (at most 1 at once), each job forked from a warm worker" in warm.stderr
    cold = subprocess.run(
        sweep(tmp_path, "cold", "seeds=[0]", "train.trainer.total_steps=3", "launcher.warm_start=false"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=bare,
    )
    assert cold.returncode == 0 and "each job started cold" in cold.stderr, cold.stderr[-3000:]
    assert not (tmp_path / "cold" / "logs" / "warm_worker.log").exists()

    records = json.loads((tmp_path / "warm" / "sweep.json").read_text())["jobs"]
    pids = set()
    for rec in records:
        out = Path(rec["output_dir"])
        state = json.loads((out / "job.json").read_text())
        assert state["state"] == "done" and state["scheduler_job_id"] == rec["scheduler_job_id"]
        logs = tmp_path / "warm" / "logs"
        assert (logs / f"{rec['scheduler_job_id']}_0_result.pkl").exists()
        assert "Loading weights" in Path(rec["stderr"]).read_text()  # the job's own output, in its log
        pids.add(state["pid"])
    zygote = worker_pid(tmp_path / "warm")
    assert len(pids) == 2 and zygote not in pids  # each job a process of its own
    deadline = time.monotonic() + 10
    while alive(zygote) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(zygote)  # gone with the sweep
    same_seed = [tmp_path / s / "runs" / "symmetric" / "s0" for s in ("warm", "cold")]
    assert metrics(same_seed[0]) == metrics(same_seed[1])


@pytest.mark.slow
def test_ctrl_c_to_the_group_stops_a_warm_job_at_a_step(tmp_path):
    proc, job_dir = start_long_sweep(tmp_path, start_new_session=True)
    job_pid = json.loads((job_dir / "job.json").read_text())["pid"]
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT and "Traceback" not in err, err[-3000:]
    assert not alive(job_pid)
    assert json.loads((job_dir / "summary.json").read_text())["status"] == "KILLED"  # stopped cleanly


@pytest.mark.slow
def test_a_killed_worker_fails_its_job_with_one_error_line(tmp_path):
    proc, job_dir = start_long_sweep(tmp_path)
    job_pid = json.loads((job_dir / "job.json").read_text())["pid"]
    os.kill(worker_pid(tmp_path / "sw"), signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert "FAILED symmetric/s0" in err, err[-3000:]
    [rec] = json.loads((tmp_path / "sw" / "sweep.json").read_text())["jobs"]
    errors = [line for line in Path(rec["stderr"]).read_text().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "warm worker" in errors[0] and "launcher.warm_start=false" in errors[0], errors
    assert not alive(job_pid)  # killed with its worker, not left running


def test_a_job_command_whose_worker_is_gone_says_so_in_one_line(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    out = subprocess.run(
        [sys.executable, "-m", "entropyrl.sweeps.warm_worker", "job", str(tmp_path / "w.sock"), str(gone.pid), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert lines[0].startswith("error: the warm worker") and "launcher.warm_start=false" in lines[0]


def test_warm_start_is_a_boolean_and_multi_rank_jobs_start_cold():
    launcher = LocalLauncher()
    with pytest.raises(UserError, match="launcher.warm_start must be true or false"):
        launcher.check({"warm_start": "yes", "max_parallel": 1})
    assert launcher.warm_start({"warm_start": True}) and not launcher.warm_start({"warm_start": True, "tasks_per_node": 2})
