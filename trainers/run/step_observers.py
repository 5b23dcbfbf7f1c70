"""What watches a run's steps without changing them, built once at set-up and only when switched on:
the quadrants' prediction (``stats/observers.py``), the entropy probe (``stats/probe.py``), the
attribution of its change (``stats/attribution.py``), and the metrics of the scored batch
(``stats/scored_metrics.py``). The trainer calls each observer at the step's moments
(``StepObserver``: begin, after scoring, each micro-batch loss, around each optimizer step, end).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
from omegaconf import DictConfig

from ...evals.reflection import TokenPieces
from ...rollout.base import Rollout
from ...rollout.settings import ToolSettings
from ..algos.algorithm import Algorithm
from ..parallel.distributed import DistInfo
from ..settings import StepSettings
from ..stats.attribution import build_attribution
from ..stats.observers import StepObserver, build_observers
from ..stats.policy_stats import batch_token_stats, response_token_stats
from ..stats.probe import ProbeBatch, build_probe
from ..stats.reflection import ReflectionSettings
from ..stats.scored_metrics import scored_observers

__all__ = ["ObservedParts", "build_step_observers"]


class ObservedParts(Protocol):
    """What the observers are built from, as the trainer holds it once set up: its step settings,
    algorithm, prompt source and rollout engine (the probe's prompts and samples), policy, tokenizer
    (the reflection words' token positions), ranks, reflection settings and log."""

    settings: StepSettings
    algo: Algorithm
    source: Any
    rollout: Rollout
    model: torch.nn.Module
    tokenizer: Any
    dist: DistInfo
    reflect: ReflectionSettings
    log: Callable[..., None]


def build_step_observers(cfg: DictConfig, parts: ObservedParts, staleness: int) -> tuple[ProbeBatch | None, list[StepObserver]]:
    """``(the probe batch or None, the run's step observers)``, the observers in the order the
    trainer calls them: the quadrants' prediction (``diagnostics.quadrants``), the probe's realised
    change (``diagnostics.entropy_change``), the attribution (``diagnostics.attribution``), then the
    scored batch's metrics, which under a rollout worker (``staleness >= 1``) also report the
    entropy the controllers read."""
    settings, algo, dist, reflect = parts.settings, parts.algo, parts.dist, parts.reflect
    probe = build_probe(
        cfg,
        parts.source,
        parts.rollout,
        lambda net, roll: batch_token_stats(net, roll, settings.micro_batch_responses, **settings.stats),
    )
    attribution = build_attribution(
        cfg,
        probe,
        dist,
        lambda net, roll: (response_token_stats(net, roll, entropy_grad=True, **settings.stats)[1]),
        parts.model,
        log=parts.log,
    )
    observers: list[StepObserver] = build_observers(quadrants=settings.quadrants, probe=probe, attribution=attribution)
    observers += scored_observers(
        eps_low=algo.eps_low,
        eps_high=algo.eps_high,
        dist=dist,
        # under a rollout worker: the entropy the controllers read, and whether it is the worker's
        controller=(algo.controller_reading, algo.controller_entropy == "behaviour") if staleness > 0 else None,
        entropy_quantiles=settings.entropy_quantiles,
        quadrants=settings.quadrants,
        tools=ToolSettings.from_config(cfg.get("tools")).enabled,
        # token id -> its text, for the reflection words' positions
        reflection=(TokenPieces.for_tokenizer(parts.tokenizer), reflect.matcher) if reflect.token_metrics else None,
    )
    return probe, observers
