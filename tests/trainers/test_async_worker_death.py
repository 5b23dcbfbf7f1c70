"""A rollout worker that dies ends the asynchronous run in one line at every wait between it and the
trainer, never a hang: killed mid-generation, at the staleness gate waiting for weights, while the
trainer waits for its batch, while it holds the weights' lock, half-way through sending a batch, and
during the trainer's shutdown. A worker alive but sending nothing (stopped with SIGSTOP) ends it the
same way once the trainer's limit passes, the worker stopped. Each wait runs in a thread joined with
a bound, so a hang fails the test instead of blocking the suite."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.trainers import components
from entropyrl.trainers.async_rollout import (
    FIRST_BATCH_WAIT_S,
    STALL_FACTOR,
    STALL_FLOOR_S,
    AsyncRollouts,
    StaleBatch,
    StopFlag,
    exit_cause,
    stall_limit_s,
)
from entropyrl.trainers.parallel.distributed import DistInfo

BOUND_S = 30.0  # a dead worker is noticed within a second; shutdown kills a live one after 10 s


def _overrides(fast_train: list[str], *extra: str) -> list[str]:
    return [
        *fast_train,
        "output_dir=run",
        "trainer.threads=1",
        "trainer.val_every=0",
        "val.prompts=0",
        "tracking.enabled=false",
        *extra,
    ]


def _within(fn, bound_s: float = BOUND_S):
    """``fn()``'s result or the exception it raised, failing the test when it takes longer than
    ``bound_s`` (the thread is a daemon: a hang does not keep the test process alive)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001  (handed to the test)
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} still blocked after {bound_s:.0f} s"
    return box.get("error", box.get("value"))


def _wait_for(condition, what: str, bound_s: float = 120.0) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {bound_s:.0f} s"
        time.sleep(0.02)


def _kill(rollouts: AsyncRollouts) -> int:
    pid = rollouts.process.pid
    os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: not rollouts.process.is_alive(), "the killed worker to exit", 10)
    return pid


# -- stand-in workers: each one reaches one wait, where the test kills it ---------------------------
def _at_the_gate(cfg_yaml, weights, out, stop, first_step, staleness):
    """Waits for weights that never come, as the real worker's staleness gate does."""
    weights.loaded.value = 0
    while weights.version.value < 10**6:
        if stop.wait(0.002):
            return


def _generating(cfg_yaml, weights, out, stop, first_step, staleness):
    """Busy with a generation that does not end (no wait on the trainer)."""
    weights.loaded.value = 0
    while True:
        sum(range(10_000))


def _holding_the_weights(cfg_yaml, weights, out, stop, first_step, staleness):
    """Takes the weights' lock, as loading them does, and keeps it."""
    weights.lock.acquire()
    weights.loaded.value = 0
    time.sleep(600)


def _half_a_batch(cfg_yaml, weights, out, stop, first_step, staleness):
    """Writes the start of a message to the queue's pipe (its length says 1 MB, 100 bytes follow):
    what the trainer reads from a worker killed while its batch was on the way."""
    writer = out._writer
    writer._send(struct.pack("!i", 1_000_000) + b"x" * 100)
    weights.loaded.value = 0
    time.sleep(600)


def _full_queue(cfg_yaml, weights, out, stop, first_step, staleness):
    """Puts more than the queue holds, so it blocks on a full queue (the trainer is behind)."""
    weights.loaded.value = 0
    for step in range(first_step, first_step + 10):
        out.put(("batch", step))


def _two_batches_then_generating(cfg_yaml, weights, out, stop, first_step, staleness):
    """Sends the batches of two steps, the second holding a tensor (shared through the worker's own
    connection while the trainer unpickles it), then generates for ever."""
    weights.loaded.value = 0
    for step, metrics in ((first_step, {}), (first_step + 1, {"shared": torch.ones(64)})):
        out.put(StaleBatch(step, 0, (None, metrics), float("nan"), 0.0, 0.05))
    while not stop.wait(0.01):
        pass


def _slow_to_start(cfg_yaml, weights, out, stop, first_step, staleness):
    """Takes a while before each batch, as a worker building a large model does before its first."""
    weights.loaded.value = 0
    for step in range(first_step, first_step + 2):
        if stop.wait(1.5):
            return
        out.put(StaleBatch(step, 0, (None, {}), float("nan"), 0.0, 0.05))
    stop.wait(60)


def test_the_wait_for_the_first_batch_says_it_is_alive_and_later_waits_do_not(cfg):
    """While the worker builds its model the trainer's first step waits minutes with nothing on
    screen: a heartbeat line names the worker and what it does; one batch's generation (later
    steps, bounded by the stall limit) is not announced (the null)."""
    said: list[str] = []
    rollouts = AsyncRollouts(cfg, staleness=1, worker=_slow_to_start, log=said.append)
    rollouts.heartbeat_s = 0.3
    try:
        rollouts.start(torch.nn.Linear(2, 2), step=0)
        batch, _metrics = _within(lambda: rollouts.next_batch(None, step=0))
        pid = rollouts.process.pid
        assert said and all(f"rollout worker (pid {pid}): building its model and generating step 1's batch" in m for m in said)
        assert all("still working" in m for m in said), said
        first = len(said)
        _within(lambda: rollouts.next_batch(None, step=1))
        assert len(said) == first, said[first:]
    finally:
        rollouts.close()


def _started(cfg, worker) -> AsyncRollouts:
    rollouts = AsyncRollouts(cfg, staleness=1, worker=worker)
    rollouts.start(torch.nn.Linear(2, 2), step=0)
    _wait_for(lambda: rollouts.weights.loaded.value >= 0, "the stand-in worker to start")
    return rollouts


def _gone(error, pid: int) -> None:
    assert isinstance(error, UserError), repr(error)
    assert f"the rollout worker (pid {pid}) exited with code -9" in str(error)
    assert "SIGKILL" in str(error) and "\n" not in str(error)


@pytest.fixture
def cfg(fast_train, in_tmp):
    return compose("train", _overrides(fast_train, "trainer.staleness=1"))


def test_a_worker_killed_at_the_staleness_gate_does_not_block_the_shutdown(cfg):
    """The worker sleeps in the stop flag's wait at the gate: a ``multiprocessing.Event`` there made
    ``set`` wait for ever for the killed sleeper to wake."""
    rollouts = _started(cfg, _at_the_gate)
    time.sleep(0.3)  # well inside the gate's waits
    pid = _kill(rollouts)
    _gone(_within(lambda: rollouts.next_batch(None, step=0)), pid)
    assert _within(rollouts.close) is None
    assert rollouts.process is None


def test_a_worker_killed_while_the_trainer_waits_for_its_batch_ends_the_wait(cfg):
    rollouts = _started(cfg, _generating)
    waiting: dict = {}
    thread = threading.Thread(
        target=lambda: waiting.update(error=_within(lambda: rollouts.next_batch(None, step=0))), daemon=True
    )
    thread.start()  # the trainer blocked on the queue, the worker mid-generation
    time.sleep(1.0)
    pid = _kill(rollouts)
    thread.join(BOUND_S + 5)
    assert not thread.is_alive()
    _gone(waiting["error"], pid)
    assert _within(rollouts.close) is None


def test_a_worker_killed_holding_the_weights_ends_the_run_at_the_next_batch(cfg):
    """The worker died inside the weights' lock, which nobody will release: the trainer's publish
    returns (the step it just trained is still logged and saved) and the next step's batch ends the
    run instead of waiting for it."""
    rollouts = _started(cfg, _holding_the_weights)
    pid = _kill(rollouts)
    assert _within(lambda: rollouts.publish(torch.nn.Linear(2, 2), 1)) is None
    assert rollouts.weights.version.value == 0  # nothing published
    error = _within(lambda: rollouts.next_batch(None, step=1))
    _gone(error, pid)
    assert "while the trainer published the weights of step 1" in str(error)
    assert _within(rollouts.close) is None


def test_a_worker_killed_half_way_through_sending_a_batch_ends_the_read(cfg):
    """A batch cut short: with the trainer's copy of the pipe's write end open, the read of the rest
    never ends; without it, the read meets the end of the pipe."""
    rollouts = _started(cfg, _half_a_batch)
    time.sleep(0.3)
    pid = _kill(rollouts)
    _gone(_within(lambda: rollouts.next_batch(None, step=0)), pid)
    assert _within(rollouts.close) is None


def test_a_worker_killed_during_the_shutdown_lets_it_end(cfg):
    """The worker blocked on a full queue: the trainer's close empties it; killed meanwhile."""
    rollouts = _started(cfg, _full_queue)
    _wait_for(lambda: rollouts.queue.qsize() >= 1, "the queue to fill")
    closing = threading.Thread(target=rollouts.close, daemon=True)
    closing.start()
    time.sleep(0.05)
    if rollouts.process is not None and rollouts.process.is_alive():
        with_pid = rollouts.process.pid
        os.kill(with_pid, signal.SIGKILL)
    closing.join(BOUND_S)
    assert not closing.is_alive()
    assert rollouts.process is None


def test_the_stop_flag_is_set_and_read_across_processes_without_a_lock():
    import torch.multiprocessing as mp

    flag = StopFlag(mp.get_context("spawn"))
    assert not flag.is_set() and not flag.wait(0.001)
    flag.set()
    assert flag.is_set() and flag.wait(10.0)  # set: no sleep


def test_the_exit_cause_names_the_signal():
    assert exit_cause(-9) == "SIGKILL: killed, or out of memory?"
    assert exit_cause(-15) == "SIGTERM: killed"
    assert exit_cause(1) == "killed, or out of memory?"


# -- the real worker ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_real_worker_killed_at_its_staleness_gate_ends_the_run_in_one_line(cfg):
    """The real worker: batch 0 taken, batch 1 in the queue, it waits at the gate for version 1."""
    model, _tokenizer, _adapter = components.build_policy_and_adapter(cfg, DistInfo(), log=lambda *_a, **_k: None)
    rollouts = AsyncRollouts(cfg, staleness=1)
    try:
        batch, _metrics = _within(lambda: rollouts.next_batch(model, step=0), 180)
        assert batch is not None and len(batch) > 0
        _wait_for(lambda: rollouts.queue.qsize() >= 1, "batch 1 in the queue")
        time.sleep(0.5)  # past the put: at the gate (step 2 needs version 1)
        pid = _kill(rollouts)
        outcome = _within(lambda: rollouts.next_batch(model, step=1))
        if not isinstance(outcome, UserError):  # batch 1 arrived before it died; its step 2 never comes
            outcome = _within(lambda: rollouts.next_batch(model, step=2))
        _gone(outcome, pid)
    finally:
        assert _within(rollouts.close) is None


@pytest.mark.slow
def test_a_cli_run_whose_worker_is_killed_ends_in_one_line_keeping_its_metrics(fast_train, in_tmp, spawned_children):
    """Training slower than generation (ppo_epochs): the worker spends most of its time at the gate,
    where the kill lands; the run ends within the bound, with one error line, its finished steps in
    metrics.jsonl and a FAILED summary."""
    cmd = [
        sys.executable,
        "-m",
        "entropyrl.cli.main",
        "train",
        *_overrides(fast_train, "trainer.staleness=1", "trainer.total_steps=500", "trainer.ppo_epochs=4"),
    ]
    proc = subprocess.Popen(cmd, cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = in_tmp / "run" / "metrics.jsonl"
        # past the first steps (the worker's warm-up), it waits at the gate most of each step
        _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 4, "four steps logged", 150)
        assert proc.poll() is None
        (worker,) = spawned_children(proc.pid)
        _wait_for(lambda: _blocked(worker), "the worker to wait at its gate", 60)
        os.kill(worker, signal.SIGKILL)
        try:
            _out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the trainer still runs 60 s after its worker was killed at the staleness gate")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"the rollout worker (pid {worker}) exited with code -9" in errors[0], err[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(rows) >= 4 and [row["step"] for row in rows] == list(range(1, len(rows) + 1))
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["status"] == "FAILED" and summary["steps"] == len(rows)  # every trained step is logged


def _blocked(pid: int, samples: int = 5) -> bool:
    """The process's main thread sleeps (waiting, not generating) over ``samples`` looks 10 ms apart:
    after its first steps the worker's only long sleep is the staleness gate."""
    for _ in range(samples):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] != "S":
            return False
        time.sleep(0.01)
    return True


# -- a worker alive but stalled ----------------------------------------------------------------------
def _stopped(rollouts: AsyncRollouts) -> int:
    pid = rollouts.process.pid
    os.kill(pid, signal.SIGSTOP)
    _wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", "the worker to stop", 10)
    return pid


def _stalled(error, pid: int) -> None:
    assert isinstance(error, UserError), repr(error)
    text = str(error)
    assert f"the rollout worker (pid {pid}) is alive but sent nothing for" in text, text
    assert "trainer.worker_stall_s" in text and "the worker was stopped" in text and "\n" not in text, text


def test_the_stall_limit_grows_with_the_slowest_batch_and_waits_longer_for_the_first():
    assert stall_limit_s(None, None)[0] == FIRST_BATCH_WAIT_S  # the model is still loading
    assert stall_limit_s(2.0, None)[0] == FIRST_BATCH_WAIT_S  # a small explicit limit leaves the warm-up alone
    assert stall_limit_s(10 * FIRST_BATCH_WAIT_S, None)[0] == 10 * FIRST_BATCH_WAIT_S
    assert stall_limit_s(None, 1.0)[0] == STALL_FLOOR_S
    slow = 2 * STALL_FLOOR_S / STALL_FACTOR
    assert stall_limit_s(None, slow)[0] == pytest.approx(STALL_FACTOR * slow)
    assert stall_limit_s(None, slow)[0] > STALL_FLOOR_S
    seconds, how = stall_limit_s(2.5, slow)
    assert seconds == 2.5 and "trainer.worker_stall_s=2.5" in how


@pytest.mark.parametrize("batches_taken", [1, 0], ids=["generating", "batch-in-the-queue"])
def test_a_stopped_worker_ends_the_wait_for_its_batch_after_the_limit(fast_train, in_tmp, batches_taken):
    """SIGSTOP after the first batch: while it generates the next one, and with the next one
    already in the queue, whose tensor the trainer fetches from the stopped worker as it reads it.
    With ``trainer.worker_stall_s=1`` the wait ends in about a second: one line, the worker killed."""
    cfg = compose("train", _overrides(fast_train, "trainer.staleness=2", "trainer.worker_stall_s=1"))
    rollouts = _started(cfg, _two_batches_then_generating)
    batch, _metrics = _within(lambda: rollouts.next_batch(None, step=0))
    assert batch is None and rollouts.slowest_batch_s == pytest.approx(0.05)
    if batches_taken == 0:
        _wait_for(lambda: rollouts.queue._reader.poll(), "the second batch in the queue's pipe")
    else:
        assert _within(lambda: rollouts.next_batch(None, step=1))[0] is None
    pid = _stopped(rollouts)
    started = time.monotonic()
    error = _within(lambda: rollouts.next_batch(None, step=1 + batches_taken), 15)
    assert time.monotonic() - started < 10
    _stalled(error, pid)
    assert f"while the trainer waited for step {2 + batches_taken}'s batch" in str(error)
    assert "trainer.worker_stall_s=1" in str(error)  # the limit, and where it came from
    assert rollouts.process.exitcode == -signal.SIGKILL  # stopped for good, not left frozen
    assert _within(rollouts.close) is None and rollouts.process is None


def test_a_worker_stopped_holding_the_weights_ends_the_run_at_the_next_batch(fast_train, in_tmp):
    """Stopped inside the weights' lock: the trainer's publish gives up after the limit (the step it
    trained is still logged and saved), the worker is stopped, and the next batch ends the run."""
    cfg = compose("train", _overrides(fast_train, "trainer.staleness=1", "trainer.worker_stall_s=1"))
    rollouts = _started(cfg, _holding_the_weights)
    rollouts.slowest_batch_s = 0.05  # past the first batch's allowance
    pid = _stopped(rollouts)
    assert _within(lambda: rollouts.publish(torch.nn.Linear(2, 2), 1), 15) is None
    assert rollouts.weights.version.value == 0  # nothing published
    error = _within(lambda: rollouts.next_batch(None, step=1))
    _stalled(error, pid)
    assert "while the trainer waited for the shared weights' lock to publish step 1's" in str(error)
    assert _within(rollouts.close) is None


@pytest.mark.slow
def test_a_cli_run_whose_worker_is_stopped_ends_in_one_line_keeping_its_metrics(fast_train, in_tmp, spawned_children):
    """SIGSTOP to the real worker of a CLI run after its first steps: with trainer.worker_stall_s=5
    the run ends within seconds, with one error line naming the stall, the worker's pid and the key
    to raise, its finished steps in metrics.jsonl and a FAILED summary; the worker is gone."""
    cmd = [
        sys.executable,
        "-m",
        "entropyrl.cli.main",
        "train",
        *_overrides(fast_train, "trainer.staleness=1", "trainer.total_steps=500", "trainer.worker_stall_s=5"),
    ]
    proc = subprocess.Popen(cmd, cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = None
    try:
        metrics = in_tmp / "run" / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, "two steps logged", 40)
        assert proc.poll() is None
        (worker,) = spawned_children(proc.pid)
        os.kill(worker, signal.SIGSTOP)
        try:
            _out, err = proc.communicate(timeout=25)
        except subprocess.TimeoutExpired:
            pytest.fail("the trainer still runs 25 s after its worker was stopped, with trainer.worker_stall_s=5")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if worker is not None and Path(f"/proc/{worker}").exists():
            os.kill(worker, signal.SIGKILL)
    assert proc.returncode == 2
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert f"the rollout worker (pid {worker}) is alive but sent nothing for" in errors[0], errors[0]
    assert "trainer.worker_stall_s" in errors[0]
    _wait_for(lambda: not Path(f"/proc/{worker}").exists(), "the stopped worker to be gone", 5)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(rows) >= 2 and [row["step"] for row in rows] == list(range(1, len(rows) + 1))
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["status"] == "FAILED" and summary["steps"] == len(rows)
