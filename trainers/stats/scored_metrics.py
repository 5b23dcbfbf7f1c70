"""The observers of the scored batch: metrics read off a step's batch once the sampling policy's
token statistics and the advantages are in it (``StepObserver.after_score``), changing nothing.
Each is built only when its metrics are on (``scored_observers``), and takes what it needs when
built, never the config:

- ``SamplerGapObserver`` (always): the sampler's log-probs against the trainer's recompute, where
  the engine reported them (``tis.sampler_mismatch_metrics``), and the stale ratio against the clip
  range by entropy quartile (``async/stale_clip_frac*``, 0 where the trained policy sampled the
  batch itself; ``update_tokens.stale_clip_metrics``);
- ``ControllerEntropyObserver`` (``trainer.staleness >= 1``): the entropy the controllers read,
  and whether it was the behaviour policy's (``async/controller_entropy*``);
- ``EntropyQuantileObserver`` (``diagnostics.entropy_quantiles``): ``entropy/p10``, ... over every
  rank's tokens, reported by rank 0;
- ``QuadrantObserver`` (``diagnostics.quadrants``): the four quadrants' token shares and predicted
  entropy change at the sampling policy (``quadrant/q1/share``, ...);
- ``ToolTokenObserver`` (a rollout with tools): ``entropy/kind/<kind>``, ``entropy/turn/*``;
- ``GroupObserver`` (always): ``groups/all_equal_frac``;
- ``ReflectionTokenObserver`` (``diagnostics.reflection`` words with ``entropy``): the entropy
  where the policy turns (``reflection/entropy_*``).
"""

from __future__ import annotations

from typing import Callable

from ...evals.reflection import ReflectionMatcher, TokenPieces
from ..algos.core_algos import all_equal_group_share
from ..algos.step_batch import StepBatch
from ..interventions.tis import sampler_mismatch_metrics
from ..parallel import distributed
from ..parallel.distributed import DistInfo
from .diagnostics import entropy_quantile_metrics, quadrant_metrics
from .observers import StepObserver
from .reflection import reflection_entropy_metrics, reflection_token_masks
from .tool_stats import token_kind_metrics
from .update_tokens import entropy_quartile_edges, stale_clip_metrics

__all__ = [
    "SamplerGapObserver",
    "ControllerEntropyObserver",
    "EntropyQuantileObserver",
    "QuadrantObserver",
    "ToolTokenObserver",
    "GroupObserver",
    "ReflectionTokenObserver",
    "scored_observers",
]


class SamplerGapObserver(StepObserver):
    """How far the sampler's log-probs (``batch.sampler_logp``) are from the trainer's recompute
    (``old_logp``): their mismatch, and the share of tokens whose stale ratio lies outside the
    algorithm's clip range ``[1 - eps_low, 1 + eps_high]``, by entropy quartile, which
    ``clip/frac`` (current over proximal) never sees."""

    def __init__(self, eps_low: float, eps_high: float) -> None:
        self.eps_low, self.eps_high = eps_low, eps_high

    def after_score(self, batch: StepBatch, metrics: dict) -> dict[str, float]:
        out: dict[str, float] = {}
        if batch.sampler_logp is not None:  # the sampler reported log-probs (vLLM, the rollout worker)
            out.update(sampler_mismatch_metrics(batch.old_logp, batch.sampler_logp, batch.mask))
        edges = entropy_quartile_edges(batch.entropy, batch.mask)
        clip_range = {"eps_low": self.eps_low, "eps_high": self.eps_high}
        out.update(stale_clip_metrics(batch.old_logp, batch.sampler_logp, batch.entropy, batch.mask, edges, **clip_range))
        return out


class ControllerEntropyObserver(StepObserver):
    """The batch entropy the controllers read this step (``reading``: ``Algorithm.controller_reading``
    of the scoring's ``entropy`` and the worker's ``batch.behaviour_entropy``) and whether the
    algorithm reads the behaviour policy's (``from_behaviour``)."""

    def __init__(self, reading: Callable[[float, float | None], float], from_behaviour: bool) -> None:
        self.reading, self.from_behaviour = reading, from_behaviour

    def after_score(self, batch: StepBatch, metrics: dict) -> dict[str, float]:
        return {
            "async/controller_entropy": self.reading(metrics["entropy"], batch.behaviour_entropy),
            "async/controller_entropy_behaviour": float(self.from_behaviour),
        }


class EntropyQuantileObserver(StepObserver):
    """Quantiles ``quantiles`` of the valid tokens' entropy, every rank's tokens gathered (the same
    figures on 1 or N ranks); rank 0 reports them."""

    def __init__(self, quantiles: tuple[float, ...], dist: DistInfo) -> None:
        self.quantiles, self.dist = list(quantiles), dist

    def after_score(self, batch: StepBatch, metrics: dict) -> dict[str, float]:
        values = distributed.gather_values(batch.entropy[batch.mask.bool()], self.dist)
        quantiles = entropy_quantile_metrics(values, self.quantiles)
        return quantiles if self.dist.is_main else {}


class QuadrantObserver(StepObserver):
    """The four quadrants (the advantage's sign, the token's surprisal above or below its entropy)
    at the sampling policy: each one's token share and predicted entropy change."""

    def after_score(self, batch: StepBatch, metrics: dict) -> dict[str, float]:
        return quadrant_metrics(batch.old_logp, batch.old_logp, batch.entropy, batch.advantages, batch.mask)


class ToolTokenObserver(StepObserver):
    """The policy's token entropy by kind (text, code, after a tool output) and by turn, in a batch
    of tool runs."""

    def after_score(self, batch: StepBatch, metrics: dict) -> dict[str, float]:
        trace = batch.responses.tools
        return {} if trace is None else token_kind_metrics(batch.entropy, batch.mask, trace)


class GroupObserver(StepObserver):
    """The share of the batch's groups whose rewards are all equal (no learning signal)."""

    def after_score(self, batch: StepBatch, metrics: dict) -> dict[str, float]:
        return {"groups/all_equal_frac": all_equal_group_share(batch.rewards, batch.group_ids)}


class ReflectionTokenObserver(StepObserver):
    """The reflection words (``matcher``) mapped onto the policy's own tokens (``pieces``: token id
    -> text; a tool's output is never the policy's reflection), and the entropy and surprisal there,
    at the first token of each word and just before it."""

    def __init__(self, pieces: TokenPieces, matcher: ReflectionMatcher) -> None:
        self.pieces, self.matcher = pieces, matcher

    def after_score(self, batch: StepBatch, metrics: dict) -> dict[str, float]:
        roll = batch.responses
        at, before, first = reflection_token_masks(
            roll.response_ids, roll.policy_mask, self.pieces, self.matcher, facts=batch.facts
        )
        return reflection_entropy_metrics(batch.entropy, batch.old_logp, batch.mask, at, before, batch.advantages, first=first)


def scored_observers(
    *,
    eps_low: float,
    eps_high: float,
    dist: DistInfo,
    controller: tuple[Callable[[float, float | None], float], bool] | None,
    entropy_quantiles: tuple[float, ...],
    quadrants: bool,
    tools: bool,
    reflection: tuple[TokenPieces, ReflectionMatcher] | None,
) -> list[StepObserver]:
    """The scored-batch observers switched on. ``controller``: ``(Algorithm.controller_reading,
    reads the behaviour entropy)`` under a rollout worker, else None; ``tools``: the rollout has
    tools; ``reflection``: ``(token pieces, matcher)`` when the words are mapped onto tokens."""
    out: list[StepObserver] = [SamplerGapObserver(eps_low, eps_high)]
    if controller is not None:
        out.append(ControllerEntropyObserver(*controller))
    if entropy_quantiles:
        out.append(EntropyQuantileObserver(entropy_quantiles, dist))
    if quadrants:
        out.append(QuadrantObserver())
    if tools:
        out.append(ToolTokenObserver())
    out.append(GroupObserver())
    if reflection is not None:
        out.append(ReflectionTokenObserver(*reflection))
    return out
