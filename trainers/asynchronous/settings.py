"""What the asynchronous path reads from a run's config, read once into ``AsyncSettings``; whether
the settings have an asynchronous path: ``trainer.staleness`` and ``trainer.rollout_gpus`` checked
before anything starts (``check_async_settings`` at a sweep's plan time, ``check_async`` at the
start of a run, against the process's GPUs); and whether the batches a checkpoint drew ahead
continue the run that resumes from it (``record_mismatch``)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import UserError
from ...rollout.settings import SamplingSettings
from .placement import visible_gpus, worker_devices

__all__ = ["AsyncSettings", "check_async", "check_async_settings", "record_mismatch"]


#: The fields of ``AsyncSettings`` read from ``cfg.trainer``, with how a config value becomes each.
TRAINER_KEYS = {"staleness": int, "rollout_gpus": int, "worker_stall_s": float}


@dataclass(frozen=True)
class AsyncSettings:
    """The ``trainer`` keys of the asynchronous path, each default declared once: the composed
    ``train`` config's value (``tests/trainers/test_async_settings.py`` holds them equal), for a
    config that leaves one out, such as a train config from before ``trainer.staleness`` existed:
    that one is the synchronous loop. A key missing or null takes its default. The engine's keys
    (``rollout.name``, ``rollout.tensor_parallel_size``) take ``SamplingSettings``' defaults."""

    staleness: int = 0  # batches the rollout worker may run ahead; 0: the synchronous loop, no worker
    rollout_gpus: int = 0  # GPUs the worker has to itself; 0: it shares the trainer's
    worker_stall_s: float | None = None  # the wait on a silent live worker; None: stall_limit_s derives it
    engine: str = SamplingSettings.name  # rollout.name: the worker's engine (vllm: not a daemonic process)
    tensor_parallel_size: int = SamplingSettings.tensor_parallel_size  # rollout.tensor_parallel_size

    @classmethod
    def from_config(cls, cfg) -> AsyncSettings:
        """The settings of a run's config (``cfg.trainer``, ``cfg.rollout``; settings already built
        are returned as they are)."""
        if isinstance(cfg, cls):
            return cfg
        trainer, rollout = cfg.get("trainer") or {}, cfg.get("rollout") or {}
        engine = SamplingSettings.from_config({key: rollout.get(key) for key in ("name", "tensor_parallel_size")})
        values = {key: convert(v) for key, convert in TRAINER_KEYS.items() if (v := trainer.get(key)) is not None}
        return cls(engine=engine.name, tensor_parallel_size=engine.tensor_parallel_size, **values)

    @property
    def engine_gpus(self) -> int:
        """The GPUs the worker's engine splits over: vLLM's ``tensor_parallel_size``, else one."""
        return max(int(self.tensor_parallel_size), 1) if self.engine == "vllm" else 1


def check_async_settings(cfg) -> tuple[int, int]:
    """``(trainer.staleness, trainer.rollout_gpus)``, with the checks that need no device: GPUs for
    a worker that staleness 0 never starts, or fewer than its vLLM engine splits over. A sweep runs
    them at plan time, ``check_async`` at the start of a run. ``cfg``: a run's config or its
    ``AsyncSettings``."""
    settings = AsyncSettings.from_config(cfg)
    staleness, rollout_gpus, tp = settings.staleness, settings.rollout_gpus, settings.engine_gpus
    if rollout_gpus and staleness == 0:
        raise UserError(
            f"trainer.rollout_gpus={rollout_gpus} places the rollout worker, which only trainer.staleness >= 1 starts; "
            f"set trainer.staleness=1 (or more), or trainer.rollout_gpus=0"
        )
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
