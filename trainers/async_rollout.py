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

Where the parts live (``trainers/asynchronous/``): ``worker.py`` the worker process
(``rollout_worker``), ``placement.py`` its GPUs and process group, ``channel.py`` what the two
processes share (the weights, the stop flag, the queue's items), ``client.py`` the trainer's side
(``AsyncRollouts``), ``waits.py`` its bounded waits on the worker, ``settings.py`` the checks of
the settings and of a checkpoint's pending batches, ``metrics.py`` the ``async/*`` metrics. This
module gathers the names the rest of the package uses.
"""

from __future__ import annotations

from .asynchronous.channel import _LOCK_BOUND_S as _LOCK_BOUND_S
from .asynchronous.channel import _POLL_S as _POLL_S
from .asynchronous.channel import StaleBatch, StopFlag, WeightChannel, WorkerFailed
from .asynchronous.channel import _acquire as _acquire
from .asynchronous.channel import _always as _always
from .asynchronous.client import AsyncRollouts, too_stale
from .asynchronous.client import _on_cpu as _on_cpu
from .asynchronous.metrics import _rows_of as _rows_of
from .asynchronous.metrics import async_step_metrics, staleness_counts, staleness_histogram
from .asynchronous.placement import _environment as _environment
from .asynchronous.placement import _free_port as _free_port
from .asynchronous.placement import _set_env as _set_env
from .asynchronous.placement import visible_gpus, worker_devices, worker_group_env
from .asynchronous.settings import check_async, check_async_settings, record_mismatch
from .asynchronous.waits import _READ_GRACE_S as _READ_GRACE_S
from .asynchronous.waits import FIRST_BATCH_WAIT_S, STALL_FACTOR, STALL_FLOOR_S, exit_cause, stall_limit_s
from .asynchronous.waits import _QueueReader as _QueueReader
from .asynchronous.worker import _quiet_loading as _quiet_loading
from .asynchronous.worker import rollout_worker

__all__ = [
    "AsyncRollouts",
    "record_mismatch",
    "StaleBatch",
    "StopFlag",
    "WeightChannel",
    "WorkerFailed",
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
    "FIRST_BATCH_WAIT_S",
    "STALL_FACTOR",
    "STALL_FLOOR_S",
]
