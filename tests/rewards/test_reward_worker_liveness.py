"""A reward process killed while the trainer waits on it ends the wait at once, with the batch's
fallback and the reason -- with no time limit set (``timeout_s: null``) as well as with one, and
for the warm worker pool (``workers >= 1``) as for the forked child (``workers: 0``)."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from entropyrl.rewards.calls import CallFailed, WorkerPool, call_in_child, run_call

SLOW = """
import os, time
from pathlib import Path

def slow(responses, answer, **_):
    Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))
    time.sleep(60)
    return [1.0] * len(responses)
"""


@pytest.fixture
def slow_module(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "slow_rewards.py"
    path.write_text(textwrap.dedent(SLOW))
    monkeypatch.setenv("PID_FILE", str(tmp_path / "pid"))
    return path


def _kill_when_started(pid_file: Path) -> threading.Thread:
    def kill() -> None:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("timeout", [None, 50.0], ids=["no_limit", "limit"])
def test_a_killed_pool_worker_ends_the_wait_with_the_fallback(slow_module, tmp_path, timeout):
    pool = WorkerPool(f"{slow_module}:slow", 1)
    batch = {"responses": ["a", "b"], "answer": ["1", "2"]}
    try:
        pool._start()  # warm, so the kill lands in the call
        killer = _kill_when_started(tmp_path / "pid")
        start = time.monotonic()
        outcome = run_call("slow", lambda: pool.call(batch, 2, timeout, "slow"), 2, fallback=-1.0)
        killer.join(5)
        assert time.monotonic() - start < 30
        assert outcome.values == [-1.0, -1.0] and outcome.fallbacks == {"exception": 2}
        assert "a worker process died" in outcome.detail
    finally:
        pool.kill()


def test_a_killed_forked_child_ends_the_wait_before_its_deadline(slow_module, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("slow_rewards", slow_module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    killer = _kill_when_started(tmp_path / "pid")
    start = time.monotonic()
    with pytest.raises(CallFailed, match="ended without an answer"):
        call_in_child(module.slow, {"responses": ["a"], "answer": ["1"]}, 50.0)
    killer.join(5)
    assert time.monotonic() - start < 30
