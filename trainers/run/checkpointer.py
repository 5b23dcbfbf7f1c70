"""A run's save and resume (``GRPOTrainer.save`` and ``maybe_resume`` delegate here): what a
checkpoint holds of the trained state and how it is put back. A checkpoint keeps the weights (with
LoRA the adapter, and the merged model on request), the optimizer, the algorithm's and the lr
schedule's state, the RNG, and under staleness every rank's batches drawn ahead of the next steps
(``pending.py``), so a resumed run trains what the uninterrupted one would. The files and their
atomic writes are ``checkpoint.py``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from ...core.alive import still_working
from ..algos.algorithm import Algorithm
from ..optim import resume_scheduler
from ..parallel import distributed
from ..parallel.distributed import DistInfo
from ..settings import StepSettings
from . import checkpoint as ckpt
from .pending import pending_records, restore_pending

__all__ = ["Checkpointer", "TrainedParts"]


class TrainedParts(Protocol):
    """What a checkpoint saves and restores, as the trainer holds it: the policy (with LoRA the
    ``lora`` adapter, else None), its optimizer and lr ``scheduler``, the ``algo`` with its
    interventions' state, the rollout engine (``rollout``: an engine holding its own copy of the
    weights gets the restored ones) and the rollout worker's client (``async_rollouts``, or None)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    algo: Algorithm
    lora: Any
    rollout: Any
    async_rollouts: Any


class Checkpointer:
    """Saves and restores one run's trained state (``TrainedParts``) in ``output_dir``;
    ``saved_step`` is the step of the last checkpoint this run wrote or resumed from (0: none yet),
    where a resume would start. A save writes the parts' state at that moment; a resume loads into
    them in place."""

    def __init__(self, output_dir: Path, settings: StepSettings, dist: DistInfo, tokenizer, log: Callable[[str], None]):
        self.output_dir, self.settings, self.dist, self.tokenizer, self.log = output_dir, settings, dist, tokenizer, log
        self.saved_step = 0

    def resume(self, parts: TrainedParts) -> int | None:
        """Load the latest intact checkpoint into ``parts`` (what a save killed mid-write left is
        removed first); returns its step, None when there is none to load."""
        model, lora, async_rollouts = parts.model, parts.lora, parts.async_rollouts
        if self.dist.is_main:
            ckpt.remove_staging(self.output_dir)  # what a save killed mid-write left behind
        with still_working(self.log, f"resuming: reading the latest checkpoint in {self.output_dir}"):
            found = ckpt.load_latest_intact(self.output_dir, dtype=next(model.parameters()).dtype, warn=self.log)
        if found is None:
            return None
        latest, state, weights = found
        if lora is not None:  # an adapter checkpoint: the adapter in, the frozen base as it is
            lora.load_adapter(latest / "model")
            weights = model.state_dict()
        distributed.load_full_state(model, parts.optimizer, weights, state["optimizer"])
        parts.rollout.sync_weights()  # an engine holding its own weights (vLLM) gets the restored ones
        parts.algo.load_state_dict(state.get("algo", {}))
        resume_scheduler(parts.scheduler, state.get("scheduler"), int(state["step"]))  # none before schedules
        ckpt.set_rng_state(state["rng"])
        step = int(state["step"])
        self.log(f"resumed from {latest} (step {step})")
        if async_rollouts is not None:  # the batches its worker drew ahead (pending.py)
            restore_pending(async_rollouts, latest, step, self.dist.rank, self.log)
        self.saved_step = step
        return step

    def save(self, step: int, parts: TrainedParts) -> Path | None:
        """Write the checkpoint of step ``step``; its path on rank 0, None on the other ranks.

        Under FSDP every rank takes part in gathering the full state; rank 0 writes it, with every
        rank's batches drawn ahead of the next steps under staleness. A save that takes long (a large
        model and its optimizer) says it is alive every 30 s."""
        with still_working(self.log, f"checkpoint of step {step}: gathering and writing the model and optimizer"):
            path = self._save(step, parts)
        self.saved_step = step
        return path

    def _save(self, step: int, parts: TrainedParts) -> Path | None:
        pending = pending_records(parts.async_rollouts, step, self.dist, self.log)
        model, optimizer = distributed.checkpoint_views(parts.model, parts.optimizer, self.dist)
        path = None
        if self.dist.is_main:
            export = None
            if parts.lora is not None:  # the adapter only; the merged model too on request
                model, export = parts.lora.checkpoint_parts(self.settings.lora, self.tokenizer)
            path = ckpt.save_checkpoint(
                self.output_dir,
                step,
                model,
                self.tokenizer,
                optimizer,
                extra={"algo": parts.algo.state_dict(), "scheduler": parts.scheduler.state_dict()},
                keep=self.settings.keep_checkpoints,
                export=export,
                config_text=self.settings.config_yaml,
                objects=pending,
            )
        distributed.barrier(self.dist)
        return path
