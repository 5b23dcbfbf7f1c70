"""Loss aggregations: how a per-token loss ``[B, T]`` becomes a scalar, registered by name, each
with the normaliser it divides by (docs/algorithms.md §3), and the masked reductions they use.

Pure functions of tensors, shapes in docstrings; ``mask [B, T]`` is 1 on valid tokens. A config
string (``algo.loss_agg``) selects an aggregation and an unknown name fails with the valid ones.
Gradient accumulation (``part_weight``) and data-parallel scaling (``distributed``) read the
registered normaliser, so a new aggregation needs no edit elsewhere:

    register_loss_agg("seq-sum", denominator=None)(lambda loss, mask, norm: (loss * mask).sum())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...core.registry import Registry

__all__ = [
    "LOSS_AGGREGATIONS",
    "LossAggregation",
    "register_loss_agg",
    "loss_aggregation",
    "part_weight",
    "agg_loss",
    "masked_mean",
    "zero_padding",
]


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1 (0 if there are none).

    Args: ``x``, ``mask`` of the same shape; ``dim`` None for the global mean. Entries outside the
    mask are zeroed before multiplying, so a NaN or inf in padding cannot reach the result.
    """
    x = zero_padding(x, mask)
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def zero_padding(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with 0 wherever ``mask`` is 0 (``[...]`` -> ``[...]``).

    ``x * mask`` alone would keep ``nan * 0 = nan``; ``where`` also gives padding a zero gradient.
    """
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _token_mean(loss_mat, mask, norm):
    return masked_mean(loss_mat, mask)


def _seq_mean_token_mean(loss_mat, mask, norm):
    loss_mat = zero_padding(loss_mat, mask)
    m = mask.to(loss_mat.dtype)
    tokens = m.sum(-1)
    seq = (loss_mat * m).sum(-1) / tokens.clamp(min=1.0)
    has = (tokens > 0).to(loss_mat.dtype)
    return (seq * has).sum() / has.sum().clamp(min=1.0)


def _seq_mean_token_sum_norm(loss_mat, mask, norm):
    if norm is None:
        norm = loss_mat.shape[-1]  # verl's fallback: the padded length
    loss_mat = zero_padding(loss_mat, mask)
    return (loss_mat * mask.to(loss_mat.dtype)).sum() / float(norm)


@dataclass(frozen=True)
class LossAggregation:
    """A loss aggregation and the normaliser it divides by.

    ``fn(loss_mat [B, T], mask [B, T], norm) -> scalar``. ``denominator(mask [b, T]) -> scalar``:
    what ``fn`` divides the summed loss of a batch by (valid tokens, responses with any token), or
    ``None`` when it divides by a constant. Gradient accumulation over micro-batches and
    data-parallel scaling over ranks weight each part by its share of that denominator, so an
    aggregation registered with the wrong (or no) normaliser cannot silently change the gradient.
    """

    fn: Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]
    denominator: Callable[[torch.Tensor], torch.Tensor] | None


def _valid_tokens(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum()


def _valid_responses(mask: torch.Tensor) -> torch.Tensor:
    return (mask.sum(-1) > 0).sum()


LOSS_AGGREGATIONS: Registry = Registry(
    "algo.loss_agg",
    {
        "token-mean": LossAggregation(_token_mean, _valid_tokens),
        "seq-mean-token-mean": LossAggregation(_seq_mean_token_mean, _valid_responses),
        "seq-mean-token-sum-norm": LossAggregation(_seq_mean_token_sum_norm, None),  # sum / constant
    },
)


def register_loss_agg(name: str, *, denominator: Callable[[torch.Tensor], torch.Tensor] | None):
    """Register ``fn(loss_mat [B, T], mask [B, T], norm) -> scalar`` under ``name``.

    ``denominator(mask) -> scalar`` is what ``fn`` divides a batch's summed loss by, or ``None``
    for a constant (the parts of a batch then simply add up); it is required so that gradient
    accumulation and data-parallel scaling treat the new aggregation correctly."""

    def deco(fn):
        LOSS_AGGREGATIONS[name] = LossAggregation(fn, denominator)
        return fn

    return deco


def loss_aggregation(mode: str) -> LossAggregation:
    """The registered aggregation ``mode`` (a one-line error naming the valid ones if unknown)."""
    return LOSS_AGGREGATIONS.lookup(mode)


def part_weight(mode: str, part_mask: torch.Tensor, whole_mask: torch.Tensor) -> float:
    """Factor on the loss of a part of a batch (a micro-batch) so that the parts' weighted losses
    add up to the loss of the whole: ``denominator(part) / denominator(whole)``, or 1 for an
    aggregation with a constant normaliser. ``[b, T], [B, T] -> float``."""
    denominator = loss_aggregation(mode).denominator
    if denominator is None:
        return 1.0
    return float(denominator(part_mask) / denominator(whole_mask).clamp(min=1))


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", norm: float | None = None) -> torch.Tensor:
    """Aggregate a per-token loss ``[B, T]`` over valid tokens to a scalar.

    ``token-mean``: sum / number of valid tokens. ``seq-mean-token-mean``: per-response mean, then the
    mean over responses with any valid token. ``seq-mean-token-sum-norm`` (Dr.GRPO): sum / ``norm``
    (a constant, the max response length; defaults to ``T``).
    """
    return loss_aggregation(mode).fn(loss_mat, mask, norm)
