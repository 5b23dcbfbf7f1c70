"""Pure tensor math of GRPO-family RLVR (docs/algorithms.md §2-4).

Every function is a pure function of tensors, in the style of verl's ``core_algos.py``: no state,
no I/O, shapes in docstrings. ``B`` responses, ``T`` response positions; ``mask [B, T]`` is 1 on
the tokens that count ("valid tokens"). Advantage estimators and loss aggregations are registered
by name (``ADVANTAGE_ESTIMATORS``, ``LOSS_AGGREGATIONS``) so a config string selects them and an
unknown name fails with the list of valid ones. The loss aggregations, their registry and the
masked reductions they use live in ``loss_agg.py``; their names are importable from here too.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ...core.errors import UserError
from ...core.registry import Registry
from .loss_agg import (
    LOSS_AGGREGATIONS,
    LossAggregation,
    agg_loss,
    loss_aggregation,
    masked_mean,
    part_weight,
    register_loss_agg,
    zero_padding,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "LossAggregation",
    "register_advantage",
    "register_loss_agg",
    "loss_aggregation",
    "part_weight",
    "compute_advantages",
    "group_stats",
    "masked_mean",
    "zero_padding",
    "masked_whiten",
    "grpo_advantage",
    "drgrpo_advantage",
    "rloo_advantage",
    "opo_advantage",
    "reinforce_pp_baseline_advantage",
    "broadcast_advantages",
    "SurrogateOutput",
    "clipped_surrogate",
    "agg_loss",
    "low_var_kl",
    "entropy_bonus_term",
    "filter_all_equal_groups",
    "all_equal_group_share",
    "overlong_penalty",
    "selection_count",
    "select_top_fraction",
    "token_covariance",
]

GRPO_EPS = 1e-6  # GRPO's std floor (docs/algorithms.md §2)
WHITEN_EPS = 1e-8  # REINFORCE++ whitening variance floor
LOG_RATIO_CLAMP = 20.0  # |log rho| bound before exp, so a wild token cannot overflow the ratio


# --------------------------------------------------------------------------------------------
# masked whitening (masked_mean and zero_padding live in loss_agg.py)
# --------------------------------------------------------------------------------------------


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = WHITEN_EPS) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and *unbiased* variance over valid entries.

    ``x``, ``mask``: ``[B, T]``. Returns ``[B, T]`` (values on invalid entries are not meaningful;
    callers multiply by the mask).
    """
    m = mask.to(x.dtype)
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1.0)
    var = (((x - mean) ** 2) * m).sum() / (n - 1.0).clamp(min=1.0)  # Bessel, as verl's masked_var
    return (x - mean) * torch.rsqrt(var + eps)


# --------------------------------------------------------------------------------------------
# §2 advantages
# --------------------------------------------------------------------------------------------


def group_stats(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-response statistics of the response's prompt group.

    Args:
        values: ``[B]`` float.
        group_ids: ``[B]`` long; responses with equal ids form a group (any id values, any order).

    Returns:
        ``(count [B], sum [B], mean [B], unbiased_std [B])`` of each response's group, gathered back
        to the responses. A group of one has std 0 here (callers apply their convention).
    """
    if values.dim() != 1 or group_ids.shape != values.shape:
        raise ValueError(f"expected rewards [B] and group_ids [B], got {tuple(values.shape)} and {tuple(group_ids.shape)}")
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max().item()) + 1 if inv.numel() else 0
    count = torch.zeros(g, dtype=values.dtype, device=values.device).index_add_(0, inv, torch.ones_like(values))
    total = torch.zeros(g, dtype=values.dtype, device=values.device).index_add_(0, inv, values)
    mean = total / count
    sq = torch.zeros(g, dtype=values.dtype, device=values.device).index_add_(0, inv, (values - mean[inv]) ** 2)
    std = torch.sqrt(sq / (count - 1.0).clamp(min=1.0))
    return count[inv], total[inv], mean[inv], std[inv]


def broadcast_advantages(adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` per-response advantages -> ``[B, T]`` token advantages, 0 on masked tokens."""
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)


def grpo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """GRPO: ``(r - mean) / (std + 1e-6)``, unbiased std; a group of one gets mean 0, std 1. ``[B] -> [B]``."""
    count, _, mean, std = group_stats(rewards, group_ids)
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return (rewards - mean) / (std + GRPO_EPS)


def drgrpo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO: ``r - mean`` (no std scaling). Group of one: mean 0 (verl's convention). ``[B] -> [B]``."""
    count, _, mean, _ = group_stats(rewards, group_ids)
    return rewards - torch.where(count <= 1, torch.zeros_like(mean), mean)


def rloo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO: ``r_i - mean_{j != i} r_j``; a group of one has no baseline (A = r). ``[B] -> [B]``."""
    count, total, _, _ = group_stats(rewards, group_ids)
    loo_mean = (total - rewards) / (count - 1.0).clamp(min=1.0)
    return torch.where(count <= 1, rewards, rewards - loo_mean)


def opo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """OPO: length-weighted baseline ``b = sum_j |o_j| r_j / sum_j |o_j|``, ``A = r - b``. ``[B] -> [B]``.

    ``lengths [B]``: response lengths (mask sums). A group of one has baseline 0 (verl's convention).
    """
    lengths = lengths.to(rewards.dtype)
    count, len_sum, _, _ = group_stats(lengths, group_ids)
    _, wsum, _, _ = group_stats(lengths * rewards, group_ids)
    baseline = wsum / len_sum.clamp(min=torch.finfo(rewards.dtype).tiny)
    return rewards - torch.where(count <= 1, torch.zeros_like(baseline), baseline)


def reinforce_pp_baseline_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++ with baseline: ``r - group mean`` (group of one: mean 0, as verl), broadcast over
    tokens, then whitened over all valid tokens of the batch. ``[B] -> [B, T]``."""
    count, _, mean, _ = group_stats(rewards, group_ids)
    centred = rewards - torch.where(count <= 1, torch.zeros_like(mean), mean)
    tok = broadcast_advantages(centred, response_mask)
    return masked_whiten(tok, response_mask) * response_mask.to(tok.dtype)


# name -> fn(rewards [B], group_ids [B], response_mask [B, T]) -> advantages [B, T]
ADVANTAGE_ESTIMATORS: Registry = Registry("algo.advantage")


def register_advantage(name: str):
    """Register ``fn(rewards [B], group_ids [B], response_mask [B, T]) -> [B, T]`` under ``name``."""

    def deco(fn):
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


@register_advantage("grpo")
def _grpo(rewards, group_ids, response_mask):
    return broadcast_advantages(grpo_advantage(rewards, group_ids), response_mask)


@register_advantage("drgrpo")
def _drgrpo(rewards, group_ids, response_mask):
    return broadcast_advantages(drgrpo_advantage(rewards, group_ids), response_mask)


@register_advantage("rloo")
def _rloo(rewards, group_ids, response_mask):
    return broadcast_advantages(rloo_advantage(rewards, group_ids), response_mask)


@register_advantage("opo")
def _opo(rewards, group_ids, response_mask):
    lengths = response_mask.to(rewards.dtype).sum(-1)
    return broadcast_advantages(opo_advantage(rewards, group_ids, lengths), response_mask)


@register_advantage("reinforce_pp_baseline")
def _reinforce_pp_baseline(rewards, group_ids, response_mask):
    return reinforce_pp_baseline_advantage(rewards, group_ids, response_mask)


def compute_advantages(name: str, rewards: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level advantages ``[B, T]`` (0 on masked tokens) with estimator ``name``.

    Args:
        rewards: ``[B]`` float outcome rewards. group_ids: ``[B]`` long prompt-group ids.
        response_mask: ``[B, T]`` 1 on response tokens.
    """
    fn = ADVANTAGE_ESTIMATORS.lookup(name)
    if response_mask.dim() != 2 or response_mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"response_mask must be [B, T] with B={rewards.shape[0]}, got {tuple(response_mask.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    with torch.no_grad():
        return fn(rewards, group_ids.long(), response_mask)


# --------------------------------------------------------------------------------------------
# §3 clipped surrogate, KL, entropy bonus (the aggregations: loss_agg.py)
# --------------------------------------------------------------------------------------------


class SurrogateOutput(NamedTuple):
    """Per-token pieces of the clipped surrogate, all ``[B, T]``.

    loss: the final per-token loss (ratio clip, then dual clip for A < 0 when enabled).
    clipped: bool, the token's gradient is cut by a clip (ratio clip active or dual clip active).
    ratio: ``rho = exp(clamp(logp - old_logp, -20, 20))``.
    loss_unclipped: ``L1 = -A * rho``. loss_ratio_clipped: ``max(L1, L2)`` before dual clip.
    ratio_clipped: bool, ``L2 > L1``. dual_clipped: bool, the dual clip bound was taken.
    metrics: what the objective itself did, ``{"<objective>/<what>": 0-d detached tensor}`` (GSPO's
    share of responses clipped, SAPO's gate...); None for the PPO clip, whose clip shares the
    facade logs for every objective (``clip/*``). Returned, never stored: the loss stays pure.
    """

    loss: torch.Tensor
    clipped: torch.Tensor
    ratio: torch.Tensor
    loss_unclipped: torch.Tensor
    loss_ratio_clipped: torch.Tensor
    ratio_clipped: torch.Tensor
    dual_clipped: torch.Tensor
    metrics: dict | None = None


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *, eps_low: float, eps_high: float, dual_c: float | None
) -> SurrogateOutput:
    """PPO clipped surrogate with clip-higher and dual clip (docs/algorithms.md §3).

    ``L = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))``; for ``A < 0`` also
    ``L = min(L, -A c)`` (dual clip, ``dual_c=None`` disables it).

    Args: ``logp``, ``old_logp``, ``advantages``: ``[B, T]``. Returns ``SurrogateOutput`` of ``[B, T]``.
    """
    log_ratio = torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    l_clip = torch.maximum(l1, l2)
    ratio_clipped = l2 > l1
    if dual_c is None:
        loss = l_clip
        dual_clipped = torch.zeros_like(ratio_clipped)
    else:
        l3 = -advantages * dual_c
        dual_clipped = (advantages < 0) & (l_clip > l3)
        loss = torch.where(advantages < 0, torch.minimum(l_clip, l3), l_clip)
    return SurrogateOutput(loss, ratio_clipped | dual_clipped, ratio, l1, l_clip, ratio_clipped, dual_clipped)


def low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || ref) per token: ``exp(ref - logp) - (ref - logp) - 1`` in [-10, 10].

    ``[B, T] -> [B, T]``. The log-ratio is first bounded to [-20, 20] (as verl) so exp cannot
    overflow to inf, whose gradient through the final clamp would be nan; values inside the final
    [-10, 10] band are unaffected.
    """
    kl = torch.clamp(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(kl) - kl - 1.0, -10.0, 10.0)


def entropy_bonus_term(
    entropy: torch.Tensor, mask: torch.Tensor, coef: float, loss_agg: str = "token-mean", norm: float | None = None
) -> torch.Tensor:
    """The loss term ``-coef * agg(H)`` (maximising entropy). ``[B, T] -> scalar``.

    ``agg`` is the configured loss aggregation, as verl's ``agg_loss(entropy, mask, loss_agg_mode)``:
    with ``seq-mean-token-sum-norm`` the micro-batch terms add up like the policy loss does, so the
    coefficient keeps its meaning however the mini-batch is split into micro-batches.
    """
    return -coef * agg_loss(entropy, mask, loss_agg, norm)


# --------------------------------------------------------------------------------------------
# §4 DAPO pieces
# --------------------------------------------------------------------------------------------


def filter_all_equal_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: ``keep [B]`` bool, False for every response of a group whose rewards
    are all equal (all correct or all wrong: zero advantage, no learning signal).

    A group of one is all-equal by definition and dropped.
    """
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max().item()) + 1 if inv.numel() else 0
    big = torch.finfo(rewards.dtype).max if rewards.is_floating_point() else torch.iinfo(rewards.dtype).max
    gmax = torch.full((g,), -big, dtype=rewards.dtype, device=rewards.device).scatter_reduce(0, inv, rewards, "amax")
    gmin = torch.full((g,), big, dtype=rewards.dtype, device=rewards.device).scatter_reduce(0, inv, rewards, "amin")
    return (gmax != gmin)[inv]


def all_equal_group_share(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Share of the groups (``group_ids [B]``) whose ``rewards [B]`` are all equal: no learning
    signal (logged as ``groups/all_equal_frac``). 0.0 for an empty batch."""
    if not rewards.numel():
        return 0.0
    keep = filter_all_equal_groups(rewards.float(), group_ids)
    groups = torch.unique(group_ids)
    mixed = torch.unique(group_ids[keep]).numel()
    return 1.0 - mixed / max(int(groups.numel()), 1)


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """DAPO overlong reward shaping, added to the task reward. ``lengths [B] -> penalty [B]``.

    ``0`` if ``L <= max_len - buffer``; ``(max_len - buffer - L) / buffer`` inside the buffer;
    ``-1`` if ``L > max_len``. Returned as float64 (callers cast to the reward dtype).
    """
    if buffer <= 0 or buffer > max_len:
        raise UserError(f"overlong buffer must be in [1, max_response_length={max_len}], got {buffer}")
    lengths = lengths.to(torch.float64)
    expected = max_len - buffer
    pen = torch.clamp((expected - lengths) / buffer, max=0.0)
    return torch.where(lengths > max_len, torch.full_like(pen, -1.0), pen.clamp(min=-1.0))


# --------------------------------------------------------------------------------------------
# covariance (Clip-Cov / KL-Cov, "The Entropy Mechanism of RL for Reasoning LMs")
# --------------------------------------------------------------------------------------------


def token_covariance(advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Centred covariance per valid token ``(A - mean_valid(A)) * (logp - mean_valid(logp))``.

    ``[B, T] -> [B, T]`` (detached), 0 on invalid tokens.
    """
    with torch.no_grad():
        a = advantages - masked_mean(advantages, mask)
        lp = logp - masked_mean(logp, mask)
        return a * lp * mask.to(a.dtype)


# --------------------------------------------------------------------------------------------
# token selection (shared by STARE and the high-entropy mask)
# --------------------------------------------------------------------------------------------


def selection_count(n: int, frac: float) -> int:
    """``k = min(n, max(1, ceil(n * frac)))``; 0 for an empty pool or ``frac <= 0``.

    The ceiling ignores float noise (``10 * 0.3 = 3.0000000000000004`` selects 3, not 4).
    """
    if n <= 0 or frac <= 0:
        return 0
    return min(n, max(1, int(math.ceil(n * frac - 1e-9))))


def select_top_fraction(scores: torch.Tensor, pool: torch.Tensor, frac: float) -> torch.Tensor:
    """Bool mask of the ``selection_count(|pool|, frac)`` pool entries with the largest ``scores``.

    Args: ``scores`` any shape (detached here), ``pool`` bool of the same shape. Returns bool, same shape.
    """
    pool = pool.bool()
    flat_pool = pool.reshape(-1)
    idx = torch.nonzero(flat_pool, as_tuple=True)[0]
    k = selection_count(int(idx.numel()), float(frac))
    out = torch.zeros_like(flat_pool)
    if k > 0:
        vals = scores.detach().reshape(-1)[idx]
        out[idx[torch.topk(vals, k, largest=True, sorted=False).indices]] = True
    return out.view_as(pool)
