"""Rollouts generated in a separate process while the trainer trains (``trainer.staleness=k``, k >= 1).

The rollout worker is a spawned process that builds its own copy of the policy, tokenizer, prompt
source, rewards and engine from the run's config (``trainers/components.py``) and runs
``collect_rollouts`` for step after step, on its own thread budget (``trainer.threads``, as the
trainer). The two meet in two places:

- the weights: after every training step the trainer copies its ``state_dict`` into tensors in
  shared memory and raises the version counter (the number of training steps applied to those
  weights); the worker loads them before its next generation when the version moved, and pushes
  them into its engine's own copy where it has one (vLLM's ``sync_weights``);
- a bounded queue (``k`` batches) of ``StaleBatch``: the collected batch of one step, stamped with
  the version that generated it, with the token log-probs and entropy of the responses under the
  worker's (behaviour) weights: ``sampling_logp`` of the rollout (vLLM's own where the engine
  reports them), so the mismatch metrics and the ``tis`` corrections apply to the
  behaviour-vs-current ratio.

Bounded staleness: the worker starts step ``j``'s batch only once version ``j - k`` is published,
so the trainer at step ``s`` (version ``s``) gets a batch at most ``k`` versions old. A batch older
than that (which the gate prevents; kept as a check of the contract) is dropped and counted, and
its step trains nothing: every batch is stamped with the step it was generated for, and the
trainer takes a step's batch by that stamp, never by order of arrival, so a dropped batch never
shifts the batches of the steps after it.

Several trainer ranks (torchrun, SLURM, ``launcher=local launcher.tasks_per_node=N``): every rank
starts a worker of its own, and the workers form a process group of their own (the trainer's
master address, a port rank 0 picks), so worker ``r`` generates exactly rank ``r``'s share of each
step, as the synchronous loop would (the dynamic-sampling and batch-size agreements of
``collect_rollouts`` are collectives among the workers). A worker holds the whole model, unsharded:
under FSDP each rank gathers the full weights it publishes.

Placement: by default the worker shares the trainer's device. ``trainer.rollout_gpus=g`` gives it
the last ``g`` of the process's visible GPUs to itself (its ``CUDA_VISIBLE_DEVICES``; a vLLM engine
it starts inherits them), and the trainer keeps the first (``worker_devices``), so generation and
training run on different hardware.

A worker that raises sends its error and exits; one that dies (killed, out of memory) is noticed
within a second; both end the run with one ``error:`` line (``UserError``). The trainer owns
shutdown: ``close`` stops the worker; the worker ignores SIGINT and SIGTERM (a Ctrl-C or a
scheduler's signal to the process group reaches the trainer, which stops at a step boundary as
usual) and exits when its parent is gone.

No wait between the two processes can outlive the other one, wherever it dies: nothing they share
needs the other side to finish what it started. The stop flag and the version counters are shared
numbers without a lock (a ``multiprocessing.Event`` is not: its ``set`` waits for every process
sleeping in ``wait`` to wake, which a process killed at the staleness gate never does); the weights'
lock is taken in short polls that look at the other process (``_acquire``), with a bound; the
trainer closes its copy of the queue's write end once the worker has its own, so a batch cut short
by the worker's death reads as the end of the pipe instead of blocking; the batch wait polls the
worker's liveness; ``close`` is bounded (the worker is killed after 10 s).

A worker alive but sending nothing (stopped by SIGSTOP, deadlocked, spinning) is bounded too: every
wait of the trainer on it (its batch, the weights' lock, its loading of restored weights) ends after
``stall_limit_s``: ``trainer.worker_stall_s`` when set, else ten times the slowest batch the worker
has made so far (at least five minutes), and at least half an hour before its first batch (building
the model, warming up its engine). Then the trainer stops the worker and ends the run with one
``error:`` line naming the wait, its length, the worker's pid and the key to raise. The queue is read
in a helper thread (``_QueueReader``): taking a batch can itself block on the worker, which hands
its tensors over through a connection of its own while the trainer unpickles them.

Checkpoints and resume: at every checkpoint the trainer takes from its worker the batches of the
next ``k`` steps (``drain``: they exist or are being generated, from weights the checkpoint's
step already covers, so the worker finishes them without a new version) into its own buffer,
``pending``, which the run trains first, in order, as it would have from the queue; the
checkpoint keeps them (``checkpoint_record``). A resumed run takes them back (``restore``), trains
them with the versions they were stamped with, and starts its worker at the first step after them
from the restored weights (the checkpoint's version), behind the same gate: the batches and
versions of the run that did not stop, since each step's generation is seeded by its step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue as queue_errors
import signal
import threading
import time
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from ..core.errors import UserError
from ..core.resources import ThreadBudget
from . import components
from .algos.step_batch import StepBatch
from .collect import collect_rollouts
from .parallel import distributed
from .stats.policy_stats import batch_token_stats, masked_mean

__all__ = [
    "AsyncRollouts",
    "record_mismatch",
    "StaleBatch",
    "StopFlag",
    "WeightChannel",
    "exit_cause",
    "too_stale",
    "async_step_metrics",
    "check_async",
    "check_async_settings",
    "rollout_worker",
    "staleness_counts",
    "staleness_histogram",
    "stall_limit_s",
    "visible_gpus",
    "worker_devices",
    "worker_group_env",
]

_POLL_S = 0.5  # how often a blocked side looks at the stop flag and at the other process
# the longest the worker waits for the weights' lock while the trainer is alive (the holder copies
# the weights, seconds even for a large model): past it the run ends instead of hanging; the
# trainer's own wait is bounded by stall_limit_s
_LOCK_BOUND_S = 600.0
# a live worker that sends nothing: the trainer's bound on each wait for it (stall_limit_s)
FIRST_BATCH_WAIT_S = 1800.0  # before its first batch: the worker builds its model and warms its engine up
STALL_FACTOR = 10.0  # after it: this many times the slowest batch so far ...
STALL_FLOOR_S = 300.0  # ... and never less (a longer response than any before, a slow shared machine)
_READ_GRACE_S = 0.5  # past a read's own timeout: the unpickling of a batch that arrived


def stall_limit_s(explicit: float | None, slowest_batch_s: float | None) -> tuple[float, str]:
    """``(seconds, how they were set)``: how long the trainer waits on a live rollout worker that
    sends nothing before it ends the run. ``explicit``: ``trainer.worker_stall_s`` (None: derived);
    ``slowest_batch_s``: the longest the worker has generated one batch (None: no batch yet, where
    building the model and warming up the engine come first, so the wait is at least
    ``FIRST_BATCH_WAIT_S``). Derived from what the run measured so a slow model or long responses
    never trip it, while a stall ends in minutes rather than never."""
    if slowest_batch_s is None:
        seconds = max(FIRST_BATCH_WAIT_S, float(explicit or 0.0))
        return seconds, f"the allowance for building the model and its first batch, {seconds:.0f} s"
    if explicit is not None:
        return float(explicit), f"trainer.worker_stall_s={float(explicit):g}"
    seconds = max(STALL_FLOOR_S, STALL_FACTOR * float(slowest_batch_s))
    return (
        seconds,
        f"{STALL_FACTOR:g} x the slowest batch so far ({float(slowest_batch_s):.1f} s), at least {STALL_FLOOR_S:.0f} s",
    )


class StopFlag:
    """The trainer's request that the worker stop: one shared byte, set once, read without a lock.
    Not a ``multiprocessing.Event``, whose ``set`` waits for every process sleeping in ``wait`` to
    wake: a worker killed while it waits at the staleness gate never does, and the trainer's
    shutdown would block for ever."""

    def __init__(self, ctx):
        self._flag = ctx.Value("b", 0, lock=False)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)

    def wait(self, timeout: float) -> bool:
        """Sleep ``timeout`` seconds unless the flag is already set; returns whether it is set."""
        if not self.is_set():
            time.sleep(timeout)
        return self.is_set()


def _acquire(lock, alive, bound_s: float = _LOCK_BOUND_S) -> bool:
    """Take ``lock`` (shared with one other process), looking every ``_POLL_S`` at whether that
    process is still ``alive()``: False, not taken, when it is gone (it may have died holding the
    lock, which then is never released) or after ``bound_s`` seconds."""
    deadline = time.monotonic() + bound_s
    while not lock.acquire(timeout=_POLL_S):
        if not alive() or time.monotonic() > deadline:
            return False
    return True


def _always() -> bool:
    return True


@dataclass
class StaleBatch:
    """What the worker sends for one step: ``collected`` as ``collect_rollouts`` returns it
    (``(StepBatch or None, metrics)``), ``version`` the training steps applied to the weights that
    generated it, ``behaviour_entropy`` the mean token entropy of its responses under those
    weights, ``idle_s`` / ``cycle_s`` the worker's time blocked (waiting for weights, or on a full
    queue with the batch before) and its wall time since the batch before was ready."""

    step: int
    version: int
    collected: tuple
    behaviour_entropy: float
    idle_s: float
    cycle_s: float


@dataclass
class WorkerFailed:
    """What a worker that raised sends before it exits: ``step`` it was producing, the error text."""

    step: int
    error: str


class WeightChannel:
    """The trainer's weights in shared memory, with the version they are at (training steps), and
    the version the worker last loaded (-1: none yet). ``state``: whole tensors by name
    (``distributed.full_weights`` of the policy)."""

    def __init__(self, state: dict[str, torch.Tensor], version: int, ctx):
        self.tensors = {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in state.items()}
        # one writer each (the trainer's version, the worker's loaded): no lock, which a process
        # killed while holding it would keep for ever
        self.version = ctx.Value("q", int(version), lock=False)
        self.loaded = ctx.Value("q", -1, lock=False)
        self.lock = ctx.Lock()  # the tensors: never read while half copied

    def publish(self, state: dict[str, torch.Tensor], version: int, alive=_always, bound_s: float = _LOCK_BOUND_S) -> bool:
        """Copy ``state`` in and set the version (the trainer, after a training step). False,
        nothing published, when the lock could not be taken: the worker is gone (``alive()``
        false) or held it past ``bound_s`` seconds."""
        if not _acquire(self.lock, alive, bound_s):
            return False
        try:
            for key, shared in self.tensors.items():
                shared.copy_(state[key].detach())
            self.version.value = int(version)
        finally:
            self.lock.release()
        return True

    def load_into(self, model: torch.nn.Module, alive=_always) -> int | None:
        """Copy the published weights into ``model`` (the worker); returns their version, None when
        the lock could not be taken (the trainer, ``alive()``, is gone or held it past the bound)."""
        if not _acquire(self.lock, alive):
            return None
        try:
            model.load_state_dict(self.tensors)
            self.loaded.value = int(self.version.value)
            return int(self.version.value)
        finally:
            self.lock.release()


def too_stale(batch_version: int, trainer_version: int, staleness: int) -> bool:
    """A batch generated at ``batch_version`` is too old for a trainer at ``trainer_version``."""
    return trainer_version - batch_version > staleness


def rollout_worker(cfg_yaml: str, weights: WeightChannel, out, stop, first_step: int, staleness: int) -> None:
    """The worker process: build the run's parts from ``cfg_yaml``, then produce one ``StaleBatch``
    per step from ``first_step`` on into ``out`` until ``stop`` is set or the parent is gone."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # a Ctrl-C or a scheduler's SIGTERM to the process group
        signal.signal(sig, signal.SIG_IGN)  # is the trainer's to handle (a step boundary); it stops us
    parent = os.getppid()
    parent_alive = lambda: os.getppid() == parent  # noqa: E731  (re-parented: the trainer is gone)
    step, engine = first_step, None
    try:
        cfg = OmegaConf.create(cfg_yaml)
        _quiet_loading()
        ThreadBudget(cfg.trainer.threads)
        dist = distributed.setup(cfg.trainer)  # the workers' own group when the trainer has several ranks
        if dist.world_size > 1:  # a whole model per worker: generation needs no collective
            dist = dataclasses.replace(dist, fsdp=False)
        components.seed_everything(int(cfg.trainer.seed))
        quiet = lambda *_a, **_k: None  # noqa: E731  (the trainer already said what it builds)
        algo = components.build_algorithm(cfg)
        rewards = components.build_rewards(cfg, log=quiet)
        model, tokenizer, _adapter = components.build_policy_and_adapter(cfg, dist, log=quiet)
        if dist.world_size > 1 and str(cfg.trainer.get("dtype", "float32")) == "bfloat16":
            model.to(torch.bfloat16)  # the trainer's FSDP computes in bf16; the published float32 weights are cast on load
        source = components.build_source(cfg, tokenizer, log=quiet)
        rewards.bind(source)
        engine = components.build_engine(cfg, model, tokenizer)
        stats_kw, rows_per_chunk = components.stats_kwargs(cfg), int(cfg.trainer.micro_batch_responses)
        loaded, idle, ready_before = -1, 0.0, time.perf_counter()
        while not stop.is_set():
            waited = time.perf_counter()
            while weights.version.value < step - staleness:  # the staleness gate
                if stop.wait(0.002) or not parent_alive():
                    return
            if weights.version.value != loaded:
                loaded = weights.load_into(model, alive=parent_alive)
                if loaded is None:
                    raise RuntimeError(f"could not take the weights' lock in {_LOCK_BOUND_S:.0f} s")
                engine.sync_weights()  # an engine holding its own copy (vLLM) gets them too
            idle += time.perf_counter() - waited
            batch, metrics = collect_rollouts(
                cfg,
                source=source,
                rollout=engine,
                algo=algo,
                dist=dist,
                pad_token_id=tokenizer.pad_token_id,
                step=step,
                reward_runner=rewards,
            )
            behaviour_entropy = float("nan")
            if batch is not None:  # the behaviour policy's token log-probs and entropy of the samples
                roll = batch.responses
                with torch.no_grad():
                    logp, entropy = batch_token_stats(model, roll, rows_per_chunk, **stats_kw)
                mask = roll.policy_mask.to(logp.device).float()
                behaviour_entropy = masked_mean(entropy, mask)
                if roll.sampling_logp is None:
                    batch = batch.with_(responses=dataclasses.replace(roll, sampling_logp=(logp * mask).cpu()))
                else:  # the engine's own log-probs (vLLM): how far its weights are from the ones loaded
                    gap = (roll.sampling_logp.to(logp.device) - logp).abs() * mask
                    metrics["async/engine_logp_diff_max"] = float(gap.max()) if gap.numel() else 0.0
            ready = time.perf_counter()
            item = StaleBatch(step, loaded, (batch, metrics), behaviour_entropy, idle, ready - ready_before)
            ready_before = ready
            while True:  # a full queue: the trainer is behind
                try:
                    out.put(item, timeout=_POLL_S)
                    break
                except queue_errors.Full:
                    if stop.is_set() or not parent_alive():
                        return
            idle = time.perf_counter() - ready
            step += 1
    except BaseException as exc:  # noqa: BLE001  (sent to the trainer, which ends the run with it)
        try:
            out.put(WorkerFailed(step, f"{type(exc).__name__}: {exc}"), timeout=5)
        finally:
            raise SystemExit(1) from None
    finally:
        if engine is not None:
            engine.close()  # vLLM's engine process ends with its worker


class AsyncRollouts:
    """The trainer's side: starts the worker, takes each step's batch, publishes the weights.

    ``dist``: this trainer rank (``DistInfo``; None: one process). With several ranks every rank
    makes the same calls in the same order (``start``, ``publish`` and ``next_batch`` hold
    collectives). ``worker``: the process's function (``rollout_worker``; tests pass another)."""

    def __init__(self, cfg, staleness: int, dist=None, *, worker=rollout_worker):
        self.cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        self.staleness = int(staleness)
        self.dist = dist if dist is not None else distributed.DistInfo()
        self.worker = worker
        self.ctx = mp.get_context("spawn")
        self.engine = str(cfg.rollout.get("name", "hf"))
        self.rollout_gpus = int(cfg.trainer.get("rollout_gpus", 0) or 0)
        self.process = None
        self.weights: WeightChannel | None = None
        # batches taken from the worker ahead of the steps that train them (drain, restore): trained first
        self.pending: list[StaleBatch] = []
        self.failure: UserError | None = None  # the worker's error met while draining: raised when its batch is due
        stall = cfg.trainer.get("worker_stall_s", None)
        self.stall_s = None if stall is None else float(stall)  # trainer.worker_stall_s; None: stall_limit_s derives it
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
        the behaviour policy's entropy. A pending batch comes first, else the worker's next; the
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
        while True:
            try:
                item = self.reader.get(timeout=_POLL_S)
            except queue_errors.Empty:
                if not self.process.is_alive():
                    raise self._worker_gone(step) from None
                waited = time.monotonic() - started
                if waited > limit_s:
                    raise self._stalled(waited, f"for step {step + 1}'s batch", how) from None
                continue
            except (OSError, EOFError):  # a batch whose tensors the worker shares died with it
                self.process.join(timeout=5.0)
                raise self._worker_gone(step) from None
            if isinstance(item, WorkerFailed):
                raise UserError(
                    f"the rollout worker failed while producing step {item.step + 1}'s batch: {item.error}; the "
                    f"checkpoints written so far are kept: fix the cause and run the same command again to resume"
                )
            busy = max(float(item.cycle_s) - float(item.idle_s), 0.0)  # generating it, not waiting at the gate
            self.slowest_batch_s = max(self.slowest_batch_s or 0.0, busy)
            return item

    def _stalled(self, waited_s: float, what: str, how: str) -> UserError:
        """Stop a live worker that sent nothing for ``waited_s`` seconds while the trainer waited
        ``what`` (past its limit, set as ``how`` says), and the one line that ends the run."""
        pid = self.process.pid
        self.process.kill()  # SIGKILL ends a stopped process too; close() reaps it
        self.process.join(timeout=5.0)
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
        self.queue.cancel_join_thread()
        self.process = None


class _QueueReader:
    """Reads a ``multiprocessing`` queue in a helper thread, so that the trainer's wait for an item
    is bounded even where the read itself blocks: a batch's tensors come through the worker's own
    connection while they are unpickled, which never answers when the worker is stopped, and a
    message cut short by a stopped writer never ends. A read still under way when a ``get`` gives
    up is kept and joined by the next ``get`` (its item is never lost); once the worker is killed
    the blocked read fails and its thread ends."""

    def __init__(self, source):
        self.source = source
        self.thread: threading.Thread | None = None
        self.box: dict = {}

    def get(self, timeout: float):
        """The next item; ``queue.Empty`` when none came within about ``timeout`` seconds (or a read
        is still under way), else the read's own error (``OSError``, ``EOFError``)."""
        if self.thread is None:
            self.box = {}
            self.thread = threading.Thread(target=self._read, args=(self.box, timeout), daemon=True)
            self.thread.start()
        self.thread.join(timeout + _READ_GRACE_S)
        if self.thread.is_alive():
            raise queue_errors.Empty
        self.thread, box = None, self.box
        if "error" in box:
            raise box["error"]
        return box["item"]

    def _read(self, box: dict, timeout: float) -> None:
        try:
            box["item"] = self.source.get(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001  (handed to the caller of get)
            box["error"] = exc


def exit_cause(exitcode: int | None) -> str:
    """What a worker's exit code says: the signal that killed it (negative codes), else a guess."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = "killed, or out of memory?" if -exitcode == signal.SIGKILL else "killed"
        return f"{name}: {why}"
    return "killed, or out of memory?"


def record_mismatch(record: dict, step: int, staleness: int, world_size: int) -> str | None:
    """Why the pending batches a checkpoint recorded (``AsyncRollouts.checkpoint_record``) cannot
    continue a run at ``step`` with ``staleness`` and ``world_size`` trainer ranks (None: they can):
    they were drawn at another staleness (another gate, another number of batches ahead), by
    another number of ranks (each rank's batch is its share of the step), or at another step."""
    if int(record["staleness"]) != int(staleness):
        return f"drawn at trainer.staleness={record['staleness']}, this run has trainer.staleness={staleness}"
    if int(record["world_size"]) != int(world_size):
        ranks = int(record["world_size"])
        return f"drawn by {ranks} trainer rank{'s' if ranks != 1 else ''}, this run has {world_size}"
    if int(record["step"]) != int(step):
        return f"drawn at step {record['step']}, the checkpoint is at step {step}"
    return None


def _rows_of(item: StaleBatch) -> int:
    """The samples of a worker's batch (0 when its step kept none)."""
    batch = item.collected[0]
    return 0 if batch is None else len(batch)


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


def staleness_counts(lag: int, rows: int, staleness: int) -> list[float]:
    """``[k + 1]``: ``rows`` trained samples at index ``lag`` (versions behind the trainer,
    ``0 <= lag <= staleness``), 0 elsewhere: one batch per step and rank, so one version."""
    if not 0 <= lag <= staleness:
        raise ValueError(f"a trained batch {lag} versions behind is outside the staleness bound {staleness}")
    counts = [0.0] * (int(staleness) + 1)
    counts[int(lag)] = float(rows)
    return counts


def staleness_histogram(counts) -> dict[str, float]:
    """``async/staleness/frac_<j>`` for ``j = 0..k``: the share of the step's trained samples
    generated ``j`` versions behind, from ``counts [k + 1]`` (samples at each lag, every rank's
    summed); empty when no sample was trained."""
    values = [float(c) for c in counts]
    total = sum(values)
    if total <= 0:
        return {}
    return {f"async/staleness/frac_{j}": c / total for j, c in enumerate(values)}


def async_step_metrics(metrics: dict, rows: int) -> dict[str, float]:
    """The trainer's side of a step under staleness, from its metrics (``time/generate``: the wait
    for the queue, ``time/step``, ``entropy``: the current policy's, recomputed by ``_score``):
    ``async/trainer_idle_frac``, ``async/samples_per_s`` and ``async/entropy_gap`` (behaviour
    minus current)."""
    step_s = max(float(metrics["time/step"]), 1e-9)
    out = {"async/trainer_idle_frac": float(metrics["time/generate"]) / step_s, "async/samples_per_s": rows / step_s}
    if "async/entropy_behaviour" in metrics and "entropy" in metrics:
        out["async/entropy_gap"] = float(metrics["async/entropy_behaviour"]) - float(metrics["entropy"])
    return out


def _quiet_loading() -> None:
    """No transformers progress bars in the worker (a spawned process starts with them on; the
    trainer's command turned its own off)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def worker_group_env(dist, port: int) -> dict[str, str | None]:
    """The environment that puts rank ``dist.rank``'s worker in the workers' own process group: the
    trainer's rank and world size, its master address with ``port``; torchrun's agent store (the
    trainer's group) is not the workers' (None: unset)."""
    return {
        "RANK": str(dist.rank),
        "WORLD_SIZE": str(dist.world_size),
        "LOCAL_RANK": str(dist.local_rank),
        "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "MASTER_PORT": str(int(port)),
        "TORCHELASTIC_USE_AGENT_STORE": None,
    }


@contextlib.contextmanager
def _environment(values: dict[str, str | None]):
    """``os.environ`` with ``values`` set (None: removed) for the block, then as it was."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            _set_env(key, value)
        yield
    finally:
        for key, value in saved.items():
            _set_env(key, value)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def visible_gpus() -> list[str]:
    """This process's GPUs as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs), else
    ``0..device_count-1``; empty without CUDA."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def worker_devices(visible: list[str], rollout_gpus: int) -> tuple[list[str], list[str]]:
    """``(trainer's, worker's)``: the last ``rollout_gpus`` of ``visible`` for the rollout worker,
    the rest for the trainer (which trains on the first); ``UserError`` when that leaves the trainer
    none."""
    if rollout_gpus <= 0:
        return list(visible), list(visible)
    if len(visible) < rollout_gpus + 1:
        seen = f"{len(visible)} GPU{'s' if len(visible) != 1 else ''}" + (f" ({','.join(visible)})" if visible else "")
        raise UserError(
            f"trainer.rollout_gpus={rollout_gpus} needs {rollout_gpus + 1} GPUs (the worker's plus one for the trainer); "
            f"this process sees {seen}; give it more (CUDA_VISIBLE_DEVICES, launcher.gpus_per_node) or set trainer.rollout_gpus=0"
        )
    return list(visible[:-rollout_gpus]), list(visible[-rollout_gpus:])


def check_async_settings(cfg) -> tuple[int, int]:
    """``(trainer.staleness, trainer.rollout_gpus)``, with the checks that need no device: GPUs for
    a worker that staleness 0 never starts, or fewer than its vLLM engine splits over. A sweep runs
    them at plan time, ``check_async`` at the start of a run."""
    staleness = int(cfg.trainer.get("staleness", 0) or 0)
    rollout_gpus = int(cfg.trainer.get("rollout_gpus", 0) or 0)
    if rollout_gpus and staleness == 0:
        raise UserError(
            f"trainer.rollout_gpus={rollout_gpus} places the rollout worker, which only trainer.staleness >= 1 starts; "
            f"set trainer.staleness=1 (or more), or trainer.rollout_gpus=0"
        )
    rollout = cfg.get("rollout") or {}
    tp = int(rollout.get("tensor_parallel_size", 1) or 1) if str(rollout.get("name", "hf")) == "vllm" else 1
    if rollout_gpus and tp > rollout_gpus:
        raise UserError(
            f"rollout.tensor_parallel_size={tp} splits the worker's vLLM engine over more GPUs than "
            f"trainer.rollout_gpus={rollout_gpus} gives it; set trainer.rollout_gpus={tp}"
        )
    return staleness, rollout_gpus


def check_async(cfg, dist=None) -> int:
    """``trainer.staleness``, with ``trainer.rollout_gpus`` checked as ``check_async_settings``
    says and against this process's visible GPUs; refused where the asynchronous loop does not
    exist yet: GPUs of their own for the workers of several trainer ranks."""
    staleness, rollout_gpus = check_async_settings(cfg)
    if staleness == 0:
        return 0
    world = 1 if dist is None else int(dist.world_size)
    if rollout_gpus and world > 1:
        raise UserError(
            f"trainer.rollout_gpus={rollout_gpus} gives one rollout worker GPUs of its own, but {world} trainer ranks "
            f"start one worker each, which share their ranks' GPUs; set trainer.rollout_gpus=0, or launch one trainer process"
        )
    if rollout_gpus:
        worker_devices(visible_gpus(), rollout_gpus)
    return staleness
