"""Where the rollout worker runs and whom it meets: its GPUs (the last ``trainer.rollout_gpus`` of
the process's visible ones, ``worker_devices``; by default the trainer's own), and, with several
trainer ranks, the environment that puts each rank's worker in the workers' own process group
(``worker_group_env``). A spawned process takes the environment of the moment it starts, so the
trainer sets it for the start only (``_environment``)."""

from __future__ import annotations

import contextlib
import os

import torch

from ...core.errors import UserError

__all__ = ["visible_gpus", "worker_devices", "worker_group_env"]


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
