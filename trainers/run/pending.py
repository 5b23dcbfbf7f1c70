"""The batches a rollout worker drew ahead of a checkpoint's step (``trainer.staleness >= 1``): each
rank's kept in the checkpoint beside the weights (``checkpoint.pending_batches_name``), and trained
first on resume with the versions they were stamped with, so a resumed run trains the batches the
uninterrupted one would (``async_rollout.py``, ``drain``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..parallel import distributed
from ..parallel.distributed import DistInfo
from . import checkpoint as ckpt

__all__ = ["pending_records", "restore_pending"]


def pending_records(async_rollouts, step: int, dist: DistInfo, log: Callable[[str], None]) -> dict[str, dict]:
    """``{file name: record}`` of every rank's pending batches (``AsyncRollouts.checkpoint_record``:
    the batches of the next ``k`` steps, waited for), on rank 0; empty on the other ranks, without
    a worker (``async_rollouts`` None), and when a worker failed before its batches were ready (the
    checkpoint is then written without them: a resume generates those steps' batches afresh)."""
    if async_rollouts is None:
        return {}
    records = distributed.gather_objects_to_main(async_rollouts.checkpoint_record(step), dist)
    if records is None:
        return {}
    if any(record is None for record in records):
        log(
            f"warning: a rollout worker failed before the batches it had started were ready; checkpoint "
            f"step {step} is written without them (a resume generates them afresh)"
        )
        return {}
    return {ckpt.pending_batches_name(rank): record for rank, record in enumerate(records)}


def restore_pending(async_rollouts, checkpoint: Path, step: int, rank: int, log: Callable[[str], None]) -> None:
    """Hand rank ``rank``'s batches of ``checkpoint`` (at step ``step``) to ``async_rollouts``:
    trained first, with the versions they were stamped with; the new worker starts after them. A
    record that does not read is noted, and the run goes on without it."""
    record, problem = None, None
    try:
        record = ckpt.load_pending_batches(checkpoint, rank)
    except Exception as exc:  # noqa: BLE001 - a file that does not read: the run goes on without it
        problem = f"{ckpt.pending_batches_name(rank)} cannot be read ({type(exc).__name__})"
    note = async_rollouts.restore(record, step, problem=problem)
    pending = async_rollouts.pending
    if note is not None:
        log(note)
    elif pending:
        steps = f"step {step + 1}" if len(pending) == 1 else f"steps {step + 1}-{step + len(pending)}"
        log(f"the batches the rollout worker had drawn ahead ({steps}) come from the checkpoint")
