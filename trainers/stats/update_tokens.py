"""Which tokens a step's updates clipped or corrected, and how far apart its policies are: pure
functions of what each micro-batch loss returned (``LossOutput.tokens``, the ``LossContext``),
computed beside the loss by the loop (``trainer._update``), never inside it.

- Entropy quartiles: the step's quartile edges ``entropy_quartile_edges`` are computed once per
  step from the batch's valid tokens (``StepBatch.entropy``: the policy at the start of the step,
  the tensor behind the logged ``entropy``); each token of a micro-batch then falls in a quarter
  ``q1`` (lowest entropy) .. ``q4`` (highest) by its entropy in that same tensor
  (``ctx.sampling_entropy``).
- ``clip/frac/entropy_q<i>``: the clipped tokens of quarter ``i`` (``ctx.clipped``, what
  ``clip/frac`` counts) over the valid tokens of that quarter, summed over the step's updates
  (every micro-batch of every mini-batch and epoch). This is the update's own clip, of
  ``pi_theta / pi_prox``: stale samples reach it only through the gradient they let through, so
  M2PO's observation (stale ratios leave the clip range on high-entropy tokens first) is read on
  ``async/stale_clip_frac/entropy_q<i>`` below, not here.
- ``<metric>/entropy_q<i>`` for each per-token mask an intervention reports under the name of the
  metric that counts it (``ctx.token_masks``): the ``tis`` corrections' truncated or masked tokens
  give ``rollout/tis_clip_frac/entropy_q<i>``; the denominator is the quarter's valid tokens.
- ``async/stale_clip_frac``: the stale ratio itself, ``pi_prox / pi_behav`` (``old_logp``, the
  trainer's recompute at the start of the step, over ``sampler_logp``, the policy that generated
  the batch): the share of valid tokens whose ratio lies outside the clip range
  ``[1 - clip.low, 1 + clip.high]``, and ``async/stale_clip_frac/entropy_q<i>`` the same within each
  quarter (``stale_clip_metrics``). The PPO clip compares the policy being updated with
  ``pi_prox``, so ``clip/frac`` never sees this ratio (on a step's first mini-batch it is 0 at any
  staleness); this is the measure of how far outside the trust region the stale samples start.
  With no behaviour log-probs (the trained model sampled the batch itself, ``k = 0`` on the
  ``hf`` engine) behaviour and proximal policy are the same weights and every share is 0.
- Log-prob gaps (``logp_gaps=True``, the loop asks under ``trainer.staleness``): the mean absolute
  token gap between the proximal policy (``old_logp``, recomputed at the start of the step) and
  the current one (``logp``, the policy being updated) ``async/logp_gap/proximal_current``, and
  between the behaviour policy (``sampler_logp``, the rollout worker's) and the current one
  ``async/logp_gap/behaviour_current``; each a mean over the step's micro-batch losses. The third
  gap, behaviour vs proximal, is ``rollout/logp_diff_mean`` (``interventions/tis.py``).

A quarter with no valid token in a step gives NaN (logged as missing).
"""

from __future__ import annotations

import torch

from ..interventions.base import LossContext
from .diagnostics import sorted_quantiles

__all__ = [
    "QUARTILES",
    "entropy_quartile_edges",
    "entropy_quartile",
    "quartile_counts",
    "quartile_shares",
    "masked_abs_gap",
    "stale_clip_metrics",
    "UpdateTokenStats",
]

QUARTILES = 4


def entropy_quartile_edges(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[3]`` float64: the 25th, 50th and 75th percentiles of ``entropy [B, T]`` over the valid
    tokens of ``mask [B, T]`` (linear interpolation, ``torch.quantile``'s rule, any size); NaN
    without a valid token."""
    values = entropy.detach()[mask.bool()]
    return torch.tensor(sorted_quantiles(values, (0.25, 0.5, 0.75)), dtype=torch.float64)


def entropy_quartile(entropy: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """``[b, T]`` long in ``0..3``: the quarter of each token's ``entropy [b, T]``, with
    ``edges [3]``: 0 for ``H <= e1``, 1 for ``e1 < H <= e2``, 2 for ``e2 < H <= e3``, 3 above."""
    return torch.bucketize(entropy.detach().double(), edges.to(entropy.device, torch.float64), right=False)


def quartile_counts(flags: torch.Tensor, quartile: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[2, 4]`` float64: row 0 the valid tokens (``mask [b, T]``) that ``flags [b, T]`` marks,
    per quarter (``quartile [b, T]`` in ``0..3``); row 1 the valid tokens per quarter."""
    valid = mask.bool()
    q = quartile[valid]
    marked = flags.bool().to(valid.device)[valid].double()
    out = torch.zeros(2, QUARTILES, dtype=torch.float64, device=q.device)
    out[0].index_add_(0, q, marked)
    out[1].index_add_(0, q, torch.ones_like(marked))
    return out.cpu()


def quartile_shares(prefix: str, counts: torch.Tensor) -> dict[str, float]:
    """``{f"{prefix}/entropy_q{i}": marked / tokens}`` for ``i = 1..4`` from ``counts [2, 4]``
    (``quartile_counts``, summed); NaN for a quarter without tokens."""
    return {
        f"{prefix}/entropy_q{i + 1}": float(counts[0, i] / counts[1, i]) if counts[1, i] > 0 else float("nan")
        for i in range(QUARTILES)
    }


def masked_abs_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``|a - b|`` over the valid tokens of ``mask`` (all ``[b, T]``); NaN without one."""
    valid = mask.bool()
    n = int(valid.sum())
    if n == 0:
        return float("nan")
    d = (a.detach().double() - b.detach().to(a.device).double()).abs()[valid]
    return float(d.sum() / n)


def stale_clip_metrics(
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor | None,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    edges: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> dict[str, float]:
    """``async/stale_clip_frac`` and ``async/stale_clip_frac/entropy_q1`` .. ``q4``: the share of
    valid tokens (``mask [B, T]``) whose stale ratio ``exp(prox_logp - behav_logp)`` lies outside
    ``[1 - eps_low, 1 + eps_high]``, over all of them and within each entropy quarter of
    ``entropy [B, T]`` (``edges [3]`` from ``entropy_quartile_edges``; ``q1`` lowest). ``prox_logp``:
    ``[B, T]`` the proximal policy (the trainer's recompute at the start of the step);
    ``behav_logp``: ``[B, T]`` the behaviour policy's, None when the proximal policy sampled the
    batch itself (every share 0). NaN for the whole share without a valid token and for a quarter
    without one."""
    valid = mask.bool()
    if behav_logp is None:
        outside = torch.zeros_like(valid)
    else:
        log_ratio = prox_logp.detach().double() - behav_logp.detach().to(prox_logp.device).double()
        ratio = torch.exp(log_ratio)
        outside = ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)) & valid
    n = int(valid.sum())
    counts = quartile_counts(outside, entropy_quartile(entropy, edges), mask)
    return {
        "async/stale_clip_frac": float(outside.sum()) / n if n else float("nan"),
        **quartile_shares("async/stale_clip_frac", counts),
    }


class UpdateTokenStats:
    """One step's accumulator of the metrics above: built with the step's ``edges`` (from
    ``entropy_quartile_edges``), given each micro-batch loss's context (``add``), read at the end
    of the step (``metrics``)."""

    def __init__(self, edges: torch.Tensor, *, logp_gaps: bool = False):
        self.edges = edges
        self.logp_gaps = bool(logp_gaps)
        self.counts: dict[str, torch.Tensor] = {}
        self.gaps: dict[str, list[float]] = {}

    def add(self, ctx: LossContext) -> None:
        """One micro-batch loss's context (``LossOutput.tokens``)."""
        entropy = ctx.entropy if ctx.sampling_entropy is None else ctx.sampling_entropy
        quartile = entropy_quartile(entropy, self.edges)
        for prefix, flags in {"clip/frac": ctx.clipped, **ctx.token_masks}.items():
            counts = quartile_counts(flags, quartile, ctx.mask)
            self.counts[prefix] = counts if prefix not in self.counts else self.counts[prefix] + counts
        if self.logp_gaps:
            pairs = {"async/logp_gap/proximal_current": ctx.old_logp}
            if ctx.sampler_logp is not None:
                pairs["async/logp_gap/behaviour_current"] = ctx.sampler_logp
            for key, other in pairs.items():
                self.gaps.setdefault(key, []).append(masked_abs_gap(ctx.logp, other, ctx.mask))

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for prefix, counts in self.counts.items():
            out.update(quartile_shares(prefix, counts))
        for key, values in self.gaps.items():
            finite = [v for v in values if v == v]
            out[key] = sum(finite) / len(finite) if finite else float("nan")
        return out
