"""What a rollout worker started ends with it. The worker leads its own process group, so a process
it starts that watches no parent (vLLM's engine process on CPU) is ended by the trainer however the
worker went: killed while the trainer waits for its batch, stopped for a stall, or closed. The
stand-in worker starts a sleeping process in place of the engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.core.helper_process import end_process_group, lead_own_process_group, leads_own_group
from entropyrl.trainers.async_rollout import AsyncRollouts

BOUND_S = 30.0


def _engine_beside_it(cfg_yaml, weights, out, stop, first_step, staleness):
    """Leads its group as the real worker does, starts a process that watches no parent (as vLLM's
    engine process does), writes its pid to ``engine.pid`` and waits at the gate."""
    lead_own_process_group()
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path("engine.pid").write_text(str(engine.pid))
    weights.loaded.value = 0
    while not stop.wait(0.01):
        pass


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _wait_for(condition, what: str, bound_s: float = 60.0) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {bound_s:.0f} s"
        time.sleep(0.02)


@pytest.fixture
def started(fast_train, in_tmp):
    cfg = compose(
        "train",
        [*fast_train, "output_dir=run", "trainer.threads=1", "val.prompts=0", "tracking.enabled=false", "trainer.staleness=1"],
    )
    rollouts = AsyncRollouts(cfg, staleness=1, worker=_engine_beside_it)
    rollouts.start(torch.nn.Linear(2, 2), step=0)
    _wait_for(lambda: Path("engine.pid").exists() and Path("engine.pid").read_text(), "the stand-in engine")
    engine = int(Path("engine.pid").read_text())
    yield rollouts, engine
    if _running(engine):  # never leave it behind, whatever the test found
        os.kill(engine, signal.SIGKILL)


def test_the_engine_of_a_worker_killed_while_the_trainer_waits_is_ended(started):
    rollouts, engine = started
    waiting: dict = {}

    def wait():
        try:
            rollouts.next_batch(None, step=0)
        except UserError as exc:
            waiting["error"] = exc

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()  # the trainer waits for the first batch, polling the worker
    _wait_for(lambda: rollouts.group_leader is not None, "the trainer to see the worker's group", 10)
    os.kill(rollouts.process.pid, signal.SIGKILL)  # the OOM killer's way: the engine is left running
    thread.join(BOUND_S)
    assert "exited with code -9" in str(waiting.get("error"))
    assert _running(engine)  # orphaned, until the trainer ends the group
    rollouts.close()
    _wait_for(lambda: not _running(engine), "the worker's engine process to end", 10)
    assert rollouts.group_leader is None


def test_the_engine_of_a_stalled_worker_is_ended_with_it(started):
    rollouts, engine = started
    rollouts.stall_s, rollouts.slowest_batch_s = 1.0, 0.1  # past the first batch's allowance: the 1 s limit
    os.kill(rollouts.process.pid, signal.SIGSTOP)  # alive, sending nothing
    try:
        rollouts.next_batch(None, step=0)
    except UserError as exc:
        assert "is alive but sent nothing" in str(exc)
    else:
        pytest.fail("a stalled worker's batch was awaited for ever")
    _wait_for(lambda: not _running(engine), "the stalled worker's engine process to end", 10)
    rollouts.close()


def test_closing_a_live_worker_ends_its_engine(started):
    rollouts, engine = started
    _wait_for(lambda: leads_own_group(rollouts.process.pid), "the worker to lead its group", 10)
    rollouts.close()
    _wait_for(lambda: not _running(engine), "the closed worker's engine process to end", 10)


def test_a_group_is_only_ended_for_a_process_seen_leading_it():
    """``leads_own_group`` is False for this process (it shares the test runner's group) and for a
    pid that does not exist; ``end_process_group`` of a group with no member is nothing."""
    assert not leads_own_group(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # in our group
    try:
        assert not leads_own_group(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not leads_own_group(child.pid)  # reaped: no process, no group
    end_process_group(child.pid)  # no member left: nothing, no error
