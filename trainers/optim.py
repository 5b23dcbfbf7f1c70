"""The optimizer and its learning-rate schedule, chosen by name from the ``optim`` config section.

Two small registries: ``OPTIMIZERS`` (``optim.name``: a builder ``(params, optim_cfg) -> Optimizer``)
and ``LR_SCHEDULES`` (``optim.scheduler``: a pure factor ``(step, warmup_steps, total_steps,
min_lr_ratio) -> float`` that multiplies ``optim.lr``). Adding one is a decorated function here:

    @register_lr_schedule("inverse_sqrt")
    def _inverse_sqrt(step, warmup_steps, total_steps, min_lr_ratio): ...

The schedule advances once per training step (as verl's actor schedulers do), not per optimizer
(mini-batch) step, so ``optim.warmup_steps`` counts training steps, as in the DAPO recipe's
``lr_warmup_steps``. Warmup follows verl / transformers: the factor is ``step / warmup_steps``
during warmup (0 on the first step).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Iterable

import torch

from ..core.registry import Registry

__all__ = [
    "OPTIMIZERS",
    "LR_SCHEDULES",
    "register_optimizer",
    "register_lr_schedule",
    "check_optim",
    "build_optimizer",
    "build_scheduler",
    "lr_factor",
    "resume_scheduler",
]

OptimizerBuilder = Callable[[Iterable[torch.nn.Parameter], object], torch.optim.Optimizer]
LrFactor = Callable[[int, int, int, float], float]

OPTIMIZERS: Registry = Registry("optim.name")
LR_SCHEDULES: Registry = Registry("optim.scheduler")


def register_optimizer(name: str):
    """Register ``fn(params, optim_cfg) -> torch.optim.Optimizer`` as ``optim.name=<name>``."""

    def deco(fn: OptimizerBuilder) -> OptimizerBuilder:
        OPTIMIZERS[name] = fn
        return fn

    return deco


def register_lr_schedule(name: str):
    """Register ``fn(step, warmup_steps, total_steps, min_lr_ratio) -> factor`` as
    ``optim.scheduler=<name>``; ``step`` is the number of training steps already taken."""

    def deco(fn: LrFactor) -> LrFactor:
        LR_SCHEDULES[name] = fn
        return fn

    return deco


@register_optimizer("adamw")
def _adamw(params, optim_cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        params,
        lr=float(optim_cfg.lr),
        weight_decay=float(optim_cfg.weight_decay),
        betas=tuple(float(b) for b in optim_cfg.betas),
    )


def _warmup(step: int, warmup_steps: int) -> float | None:
    """The warmup factor ``step / warmup_steps`` while warming up, else None."""
    return step / max(1, warmup_steps) if step < warmup_steps else None


def _progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """How far past warmup the run is: 0 at the end of warmup, 1 at ``total_steps``."""
    return min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))


@register_lr_schedule("constant")
def _constant(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    warm = _warmup(step, warmup_steps)
    return 1.0 if warm is None else warm


@register_lr_schedule("linear")
def _linear(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    warm = _warmup(step, warmup_steps)
    if warm is not None:
        return warm
    return 1.0 - (1.0 - min_lr_ratio) * _progress(step, warmup_steps, total_steps)


@register_lr_schedule("cosine")
def _cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    warm = _warmup(step, warmup_steps)
    if warm is not None:
        return warm
    half_wave = 0.5 * (1.0 + math.cos(math.pi * _progress(step, warmup_steps, total_steps)))
    return min_lr_ratio + (1.0 - min_lr_ratio) * half_wave


def _lookup(registry: Registry, key: str, name: str):
    return registry.lookup(name, key)


def check_optim(optim_cfg) -> None:
    """``UserError`` (one line, listing the valid names) for an unknown ``optim.name`` or
    ``optim.scheduler``; the ranges of the numbers are ``core/validation.py``'s."""
    _lookup(OPTIMIZERS, "optim.name", str(optim_cfg.name))
    _lookup(LR_SCHEDULES, "optim.scheduler", str(optim_cfg.scheduler))


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_cfg) -> torch.optim.Optimizer:
    """The optimizer ``optim.name`` over ``params`` at ``optim.lr``."""
    return _lookup(OPTIMIZERS, "optim.name", str(optim_cfg.name))(params, optim_cfg)


def lr_factor(optim_cfg, step: int, total_steps: int) -> float:
    """The multiple of ``optim.lr`` used at training step ``step`` (0-based) of ``total_steps``."""
    schedule = _lookup(LR_SCHEDULES, "optim.scheduler", str(optim_cfg.scheduler))
    return float(
        schedule(
            int(step),
            int(optim_cfg.warmup_steps),
            int(total_steps),
            float(optim_cfg.min_lr_ratio),
        )
    )


def build_scheduler(optimizer: torch.optim.Optimizer, optim_cfg, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying ``optim.scheduler``; call ``.step()`` once per training step.

    The factor is a plain function of the step (not a stateful object) so that a checkpoint keeps
    only the step count, and a resumed run follows its own (possibly longer) ``total_steps``."""

    def factor(step: int) -> float:
        return lr_factor(optim_cfg, step, total_steps)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def advance_scheduler(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """One training step on the schedule. A step whose groups were all equal makes no optimizer
    step but still advances the schedule (it counts training steps, as verl's); torch would warn
    that ``lr_scheduler.step()`` came before ``optimizer.step()`` when that is the run's first step,
    which here is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        scheduler.step()


def resume_scheduler(scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict | None, step: int) -> None:
    """Continue ``scheduler`` at training step ``step``: from its saved ``state`` when the checkpoint
    has one, else (a checkpoint written before schedules existed: a constant lr) by moving it to
    ``step`` and setting the optimizer's lr to that step's value."""
    if state is not None:
        scheduler.load_state_dict(state)
        return
    scheduler.last_epoch = int(step)
    for group, base, fn in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * fn(int(step))
    scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]
