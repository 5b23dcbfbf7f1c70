"""Whether a run's settings have an asynchronous path: ``trainer.staleness`` and
``trainer.rollout_gpus`` checked before anything starts (``check_async_settings`` at a sweep's plan
time, ``check_async`` at the start of a run, against the process's GPUs), and whether the batches a
checkpoint drew ahead continue the run that resumes from it (``record_mismatch``)."""

from __future__ import annotations

from ...core.errors import UserError
from .placement import visible_gpus, worker_devices

__all__ = ["check_async", "check_async_settings", "record_mismatch"]


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
