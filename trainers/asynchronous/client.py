"""The trainer's side of the rollout worker (``AsyncRollouts``): it starts the worker, publishes the
weights after every training step, takes each step's batch by the step it is stamped with (never by
order of arrival; a batch more than ``k`` versions old is dropped and counted, ``too_stale``), and
at a checkpoint takes the batches of the next ``k`` steps into ``pending``, which a resumed run
trains first. Every wait on the worker is bounded (``waits.py``); a worker that failed, died or
stalled ends the run with one ``UserError``. See ``trainers/async_rollout.py`` for the design."""

from __future__ import annotations

import contextlib
import dataclasses
import queue as queue_errors
import time

import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from ...core.alive import still_working
from ...core.errors import UserError
from ...core.helper_process import end_process_group, leads_own_group
from ..algos.step_batch import StepBatch
from ..parallel import distributed
from .channel import _POLL_S, StaleBatch, StopFlag, WeightChannel, WorkerFailed, _always
from .metrics import _rows_of, staleness_counts, staleness_histogram
from .placement import _environment, _free_port, visible_gpus, worker_devices, worker_group_env
from .settings import AsyncSettings, record_mismatch
from .waits import _QueueReader, exit_cause, stall_limit_s
from .worker import rollout_worker

__all__ = ["AsyncRollouts", "too_stale"]


def too_stale(batch_version: int, trainer_version: int, staleness: int) -> bool:
    """A batch generated at ``batch_version`` is too old for a trainer at ``trainer_version``."""
    return trainer_version - batch_version > staleness


class AsyncRollouts:
    """The trainer's side: starts the worker, takes each step's batch, publishes the weights.

    ``dist``: this trainer rank (``DistInfo``; None: one process). With several ranks every rank
    makes the same calls in the same order (``start``, ``publish`` and ``next_batch`` hold
    collectives). ``worker``: the process's function (``rollout_worker``; tests pass another).
    ``log``: where the wait for the worker's first batch (its model built, its first generation)
    says it is alive, every ``heartbeat_s`` seconds."""

    heartbeat_s = 30.0

    def __init__(self, cfg, staleness: int, dist=None, *, worker=rollout_worker, log=lambda _m: None):
        self.log = log
        self.cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        self.staleness = int(staleness)
        self.dist = dist if dist is not None else distributed.DistInfo()
        self.worker = worker
        self.ctx = mp.get_context("spawn")
        self.settings = AsyncSettings.from_config(cfg)  # what this side reads from the config, read once
        self.engine = self.settings.engine
        self.rollout_gpus = self.settings.rollout_gpus
        self.process = None
        # the worker's pid once it was seen leading its own process group (its vLLM engine process is in
        # it): the group is ended with the worker, however the worker ends
        self.group_leader: int | None = None
        self.weights: WeightChannel | None = None
        # batches taken from the worker ahead of the steps that train them (drain, restore): trained first
        self.pending: list[StaleBatch] = []
        self.failure: UserError | None = None  # the worker's error met while draining: raised when its batch is due
        self.stall_s = self.settings.worker_stall_s  # trainer.worker_stall_s; None: stall_limit_s derives it
        self.slowest_batch_s: float | None = None  # the longest the worker took to generate one batch (None: none yet)
        self._reader: _QueueReader | None = None

    @property
    def reader(self) -> _QueueReader:
        """The reader of the worker's queue (``self.queue``; a new one when the queue changed)."""
        if self._reader is None or self._reader.source is not self.queue:
            self._reader = _QueueReader(self.queue)
        return self._reader

    def start(self, model: torch.nn.Module, step: int) -> None:
        """Start the worker from ``model``'s weights, published as version ``step`` (0, or the
        resumed step); it generates from the first step after the pending batches, behind the
        staleness gate."""
        first_step = self.pending[-1].step + 1 if self.pending else step
        self.weights = WeightChannel(distributed.full_weights(model), step, self.ctx)
        env: dict[str, str | None] = {}  # the worker's environment where it differs from this process's
        if self.rollout_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(worker_devices(visible_gpus(), self.rollout_gpus)[1])
        if self.dist.world_size > 1:  # rank 0 picks the workers' port; every rank's worker uses it
            port = distributed.broadcast_value(_free_port() if self.dist.is_main else 0, self.dist)
            env.update(worker_group_env(self.dist, port))
        self.queue = self.ctx.Queue(maxsize=self.staleness)
        self.stop = StopFlag(self.ctx)
        self.process = self.ctx.Process(
            target=self.worker,
            args=(self.cfg_yaml, self.weights, self.queue, self.stop, int(first_step), self.staleness),
            name="entropyrl-rollout-worker",
            # vLLM starts its engine in a process of its own, which a daemonic process may not have;
            # close() stops the worker either way (and the worker stops when its parent is gone)
            daemon=str(self.engine) != "vllm",
        )
        with _environment(env):
            self.process.start()  # a spawned process takes the environment of the moment it starts
        # the worker holds its own write end now; with ours open, a batch cut short by the worker's
        # death would block the trainer's read for ever instead of ending at the end of the pipe
        writer = getattr(self.queue, "_writer", None)
        if writer is not None:
            writer.close()
        if self.pending:  # the stopped run's worker held this version while the trainer trained them
            self._wait_until_loaded(step, first_step)

    def _wait_until_loaded(self, version: int, first_step: int) -> None:
        """Block until the worker has loaded weights ``version``. A restarted worker takes seconds to
        build its model; meanwhile the trainer would train the pending batches and publish newer
        weights, and the worker's first batch would come from those instead of the version the
        uninterrupted run's worker generated it from (the gate's, when generation keeps up)."""
        limit_s, how = stall_limit_s(self.stall_s, self.slowest_batch_s)
        started = time.monotonic()
        while self.weights.loaded.value < version:
            self._note_group()
            if not self.process.is_alive():  # its error, sent before it exited, or that it is gone
                self._receive(first_step)
            waited = time.monotonic() - started
            if waited > limit_s:
                raise self._stalled(waited, f"for it to load the restored weights of step {version}", how)
            time.sleep(0.01)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """The weights after training step ``version`` (the worker loads them before its next batch).
        When the worker is gone (it may have died holding the weights' lock) or holds the lock past
        the bound, nothing is published and the error is kept for the next step's batch, so the step
        just trained is still logged and saved."""
        if self.weights is None:
            return
        self._note_group()
        alive = self.process.is_alive if self.process is not None else _always
        limit_s, how = stall_limit_s(self.stall_s, self.slowest_batch_s)
        started = time.monotonic()
        if self.weights.publish(distributed.full_weights(model), version, alive=alive, bound_s=limit_s):
            return
        when = f"while the trainer published the weights of step {version}"
        if self.process is not None and not self.process.is_alive():
            self.failure = self.failure or self._worker_gone(version, when)
            return
        stalled = self._stalled(time.monotonic() - started, f"for the shared weights' lock to publish step {version}'s", how)
        self.failure = self.failure or stalled

    def next_batch(self, model: torch.nn.Module, step: int) -> tuple[StepBatch | None, dict]:
        """Step ``step``'s batch (``collect_rollouts``' pair) with the ``async/*`` metrics of its
        provenance: its version lag, the samples dropped as too stale, the worker's idle share and
        the behaviour policy's entropy; the batch carries the version it was generated from
        (``StepBatch.policy_version``). A pending batch comes first, else the worker's next; the
        batch is the one stamped for ``step`` (``_take_for_step``). ``(None, {"async/dropped": n})``
        when this step has no batch to train (too stale, or missing, on any rank): the trainer skips
        the step and the next step trains its own batch. Starts the worker on the first call."""
        if self.process is None:
            self.start(model, step)
        item, dropped = self._take_for_step(step)
        # every rank trains this step or none does (a rank's batch missing or too stale skips it for all)
        if distributed.max_across(float(item is None), self.dist) > 0:
            if item is not None:  # this rank's batch is fine, another rank's is not: not trained either
                dropped += _rows_of(item)
            return None, {"async/dropped": float(distributed.sum_across(float(dropped), self.dist))}
        batch, metrics = item.collected
        if batch is not None:  # the version of the weights the worker generated it from
            batch = batch.with_(policy_version=item.version)
        lag = float(step - item.version)
        metrics = dict(metrics)
        metrics.update(
            {
                "async/staleness/mean": lag,  # one version per batch: mean and max agree on one rank
                # over ranks (the trainer averages metrics): the largest lag, and the samples dropped by all
                "async/staleness/max": float(distributed.max_across(lag, self.dist)),
                "async/dropped": float(distributed.sum_across(float(dropped), self.dist)),
                "async/worker_idle_frac": item.idle_s / max(item.cycle_s, 1e-9),
            }
        )
        # the trained samples by how many versions behind they were generated, over every rank's batch
        counts = distributed.sum_across(
            staleness_counts(step - item.version, 0 if batch is None else len(batch), self.staleness), self.dist
        )
        metrics.update(staleness_histogram(counts))
        if self.dist.world_size > 1:  # a token mean over every rank's responses, as the trainer's `entropy`
            tokens = 0.0 if batch is None else float(batch.responses.policy_mask.sum())
            total = distributed.sum_across([item.behaviour_entropy * tokens if tokens else 0.0, tokens], self.dist)
            if total[1] > 0:
                metrics["async/entropy_behaviour"] = float(total[0] / total[1])
        elif batch is not None:
            metrics["async/entropy_behaviour"] = item.behaviour_entropy
        return batch, metrics

    def _take_for_step(self, step: int) -> tuple[StaleBatch | None, int]:
        """``(the batch stamped for step ``step``, or None; samples dropped)``. Each batch carries the
        step it was generated for (``StaleBatch.step``), and that stamp, not the order of arrival,
        decides: a batch of an earlier step is dropped and the next one taken; this step's batch is
        dropped when it is more than ``k`` versions old, and the step then trains nothing (None), so
        the next step still gets its own batch; a batch of a later step goes back to ``pending``
        for that step and this step trains nothing. Dropped batches count their samples."""
        dropped = 0
        while True:
            item = self._take(step)
            if item.step > step:  # this step's batch never came: the later one waits for its own step
                self.pending.insert(0, item)
                return None, dropped
            if item.step == step and not too_stale(item.version, step, self.staleness):
                return item, dropped
            dropped += _rows_of(item)
            if item.step == step:  # this step's batch, too old: the step is skipped, the next ones keep theirs
                return None, dropped

    def drain(self, step: int) -> list[StaleBatch] | None:
        """Take the batches of the next ``k`` steps into ``pending`` (the trainer at version
        ``step``), waiting for those the worker is still generating: their gate is open, so it
        finishes them from weights this version already covers. The run trains them next, in order,
        as it would have from the queue. Returns ``pending``; None when the worker failed meanwhile
        (its error is raised when the step that needs its batch comes)."""
        if self.process is not None and self.failure is None:
            try:
                while len(self.pending) < self.staleness:
                    self.pending.append(self._receive(step + len(self.pending)))
            except UserError as exc:
                self.failure = exc
        return None if self.failure is not None else list(self.pending)

    def checkpoint_record(self, step: int) -> dict | None:
        """What a checkpoint at ``step`` keeps of this rank's worker: the pending batches after
        ``drain`` (on the CPU: tensors, metrics, version stamps, behaviour entropy and idle/cycle
        times as the worker sent them), with the step, staleness and ranks they continue; None when
        the worker failed while draining."""
        batches = self.drain(step)
        if batches is None:
            return None
        return {
            "step": int(step),
            "staleness": self.staleness,
            "world_size": int(self.dist.world_size),
            "rank": int(self.dist.rank),
            "batches": [_on_cpu(batch) for batch in batches],
        }

    def restore(self, record: dict | None, step: int, problem: str | None = None) -> str | None:
        """Take the pending batches a checkpoint at ``step`` recorded for this rank
        (``checkpoint_record``, None: no record) when every rank's record continues this run; the
        worker then starts after them. Returns the line to log when they are not used: none were
        recorded (a synchronous run's checkpoint, or one from before they were kept), or why one
        rank's record does not fit (``problem``: its file could not be read). Every rank must call it."""
        if problem is None and record is not None:
            problem = record_mismatch(record, step, self.staleness, int(self.dist.world_size))
        elif problem is None:
            problem = "none recorded"
        problems = distributed.all_gather_objects(problem, self.dist)
        if all(p is None for p in problems):
            self.pending = list(record["batches"])
            return None
        fresh = "the first batches after the resume are generated fresh from the restored weights"
        if all(p == "none recorded" for p in problems):
            return f"the checkpoint holds no batches drawn ahead by the rollout worker (saved before they were kept): {fresh}"
        rank, why = next((r, p) for r, p in enumerate(problems) if p is not None)
        where = f"rank {rank}: " if len(problems) > 1 else ""
        return f"not using the batches the rollout worker had drawn ahead at the checkpoint ({where}{why}): {fresh}"

    def _take(self, step: int) -> StaleBatch:
        """The next batch in step order: the first pending one, else the worker's next."""
        if self.pending:
            return self.pending.pop(0)
        if self.failure is not None:
            raise self.failure
        return self._receive(step)

    def _receive(self, step: int) -> StaleBatch:
        """The worker's next item for the trainer at ``step``; ``UserError`` when the worker failed,
        is gone, or sent nothing within ``stall_limit_s`` (then it is stopped)."""
        limit_s, how = stall_limit_s(self.stall_s, self.slowest_batch_s)
        started = time.monotonic()
        with self._first_batch_heartbeat(step):
            item = self._wait_for_item(step, started, limit_s, how)
        if isinstance(item, WorkerFailed):
            raise UserError(
                f"the rollout worker failed while producing step {item.step + 1}'s batch: {item.error}; the "
                f"checkpoints written so far are kept: fix the cause and run the same command again to resume"
            )
        busy = max(float(item.cycle_s) - float(item.idle_s), 0.0)  # generating it, not waiting at the gate
        self.slowest_batch_s = max(self.slowest_batch_s or 0.0, busy)
        return item

    def _first_batch_heartbeat(self, step: int):
        """A line every ``heartbeat_s`` while the trainer waits for the worker's first batch (it
        builds its own model first: minutes for a large one or a vLLM engine); later waits are one
        batch's generation, which the stall limit bounds."""
        if self.slowest_batch_s is not None:
            return contextlib.nullcontext()
        pid = getattr(self.process, "pid", None)
        who = "rollout worker" if pid is None else f"rollout worker (pid {pid})"
        what = f"{who}: building its model and generating step {step + 1}'s batch"
        return still_working(self.log, what, every_s=self.heartbeat_s)

    def _wait_for_item(self, step: int, started: float, limit_s: float, how: str):
        """The worker's next queue item, polled; ``UserError`` when it is gone or past ``limit_s``."""
        while True:
            try:
                item = self.reader.get(timeout=_POLL_S)
            except queue_errors.Empty:
                self._note_group()
                if not self.process.is_alive():
                    raise self._worker_gone(step) from None
                waited = time.monotonic() - started
                if waited > limit_s:
                    raise self._stalled(waited, f"for step {step + 1}'s batch", how) from None
                continue
            except (OSError, EOFError):  # a batch whose tensors the worker shares died with it
                self.process.join(timeout=5.0)
                raise self._worker_gone(step) from None
            return item

    def _stalled(self, waited_s: float, what: str, how: str) -> UserError:
        """Stop a live worker that sent nothing for ``waited_s`` seconds while the trainer waited
        ``what`` (past its limit, set as ``how`` says), and the one line that ends the run."""
        pid = self.process.pid
        self._note_group()
        self.process.kill()  # SIGKILL ends a stopped process too; close() reaps it
        self.process.join(timeout=5.0)
        self._end_group()
        return UserError(
            f"the rollout worker (pid {pid}) is alive but sent nothing for {waited_s:.0f} s while the trainer waited "
            f"{what} (stopped, deadlocked or spinning?); the limit is {how}; the worker was stopped. The metrics "
            f"and checkpoints written so far are kept: run the same command again to resume, or, if its batches "
            f"are this slow, raise trainer.worker_stall_s (seconds)"
        )

    def _worker_gone(self, step: int, when: str | None = None) -> UserError:
        when = when or f"before sending step {step + 1}'s batch"
        return UserError(
            f"the rollout worker (pid {self.process.pid}) exited with code {self.process.exitcode} {when} "
            f"({exit_cause(self.process.exitcode)}); the metrics and checkpoints written so far are kept: run "
            f"the same command again to resume, or set trainer.staleness=0"
        )

    def close(self) -> None:
        """Stop the worker (it exits at its next poll) and wait for it; terminate it if it lingers."""
        if self.process is None:
            return
        self._note_group()  # while it runs: its group outlives a worker that exits
        self.stop.set()
        deadline = time.monotonic() + 10.0
        while self.process.is_alive() and time.monotonic() < deadline:
            try:  # a worker blocked on a full queue gets room (what it sent is dropped)
                self.reader.get(timeout=0.1)
            except queue_errors.Empty:
                pass
            except (OSError, EOFError):  # a batch whose tensors left with the worker that shared them
                pass
        if self.process.is_alive():
            self.process.kill()  # it ignores SIGTERM
        self.process.join(timeout=5.0)
        self._end_group()
        self.queue.cancel_join_thread()
        self.process = None

    def _note_group(self) -> None:
        """Remember the worker's process group once the running worker is seen leading one."""
        if self.group_leader is None and self.process is not None and self.process.is_alive():
            if leads_own_group(self.process.pid):
                self.group_leader = self.process.pid

    def _end_group(self) -> None:
        """End what is left of the worker's process group (its engine's processes, which outlive a
        killed worker: vLLM's engine process watches no parent)."""
        if self.group_leader is not None:
            end_process_group(self.group_leader)
            self.group_leader = None


def _on_cpu(value):
    """``value`` with every tensor in it (dataclass fields, dicts, lists, tuples) copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        moved = {f.name: _on_cpu(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **moved)
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_on_cpu(item) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(item) for item in value)
    return value
