"""The first-order entropy change a step's loss asks for, per quadrant: a diagnostics step of the
loop (``diagnostics.quadrants``), run on what ``Algorithm.loss`` returned, before its backward.

The effective per-token coefficient is ``g_t = -d(sum_t omega_t L_t)/d logp_t`` over the tokens that
reach the aggregation: advantage x ratio x intervention weights x clip mask (and KL-Cov's penalty
slope), read off the autograd graph when ``logp`` carries gradient (one extra ``autograd.grad``
that keeps the graph for the backward). The base is plain GRPO's ``A rho`` with the configured
clip, on the same tokens. Both go through ``diagnostics.effective_entropy_change``; summed over the
micro-batches of a step they give ``quadrant/q*/pred_dH`` and ``entropy_change/predicted`` (and
``..._base``); the difference is the intervention's predicted effect.
"""

from __future__ import annotations

import torch

from ..algos.loss_agg import zero_padding
from .diagnostics import QUADRANTS, effective_entropy_change, quadrant_ids

__all__ = ["micro_batch_prediction", "EntropyPrediction"]


def micro_batch_prediction(tokens, token_loss: torch.Tensor) -> dict[str, float]:
    """First-order entropy change of one micro-batch loss, ``{metric: float}``.

    ``tokens``: the ``LossContext`` the loss was built from (``LossOutput.tokens``: ``logp``,
    ``entropy``, ``advantages``, ``mask``, ``pg_mask``, ``weights``, ``clipped``, ``surrogate``; all
    ``[b, T]``); ``token_loss``: ``[b, T]`` the weighted per-token policy loss the aggregation saw.
    """
    ctx = tokens
    with torch.no_grad():
        valid = ctx.mask.bool()
        base = ctx.advantages * ctx.surrogate.ratio * (~ctx.surrogate.clipped).to(ctx.advantages.dtype)
    if ctx.logp.requires_grad and torch.is_grad_enabled():
        summed = zero_padding(token_loss, ctx.pg_mask).sum()
        (grad,) = torch.autograd.grad(summed, ctx.logp, retain_graph=True, allow_unused=True)
        eff = torch.zeros_like(base) if grad is None else -grad.detach()
    else:
        with torch.no_grad():
            w = ctx.weights if ctx.weights is not None else torch.ones_like(base)
            eff = ctx.advantages * ctx.surrogate.ratio * w * (~ctx.clipped).to(base.dtype) * ctx.pg_mask.to(base.dtype)
    out: dict[str, float] = {}
    with torch.no_grad():
        lp, h = ctx.logp.detach(), ctx.entropy.detach()
        ids = quadrant_ids(lp, h, ctx.advantages, valid)
        d_eff = effective_entropy_change(eff, lp, h, valid)
        d_base = effective_entropy_change(base, lp, h, valid)
        for i, q in enumerate(QUADRANTS, start=1):
            sel = ids == i
            out[f"quadrant/{q}/pred_dH"] = float(d_eff[sel].sum().item())
            out[f"quadrant/{q}/pred_dH_base"] = float(d_base[sel].sum().item())
        for key, d in (
            ("entropy_change/predicted", d_eff),
            ("quadrant/pred_dH", d_eff),
            ("entropy_change/predicted_base", d_base),
            ("quadrant/pred_dH_base", d_base),
        ):
            out[key] = float(d.sum().item())
    return out


class EntropyPrediction:
    """The prediction summed over the micro-batch losses of one step (a fresh one per step)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    def add(self, out) -> None:
        """Add one micro-batch's ``LossOutput`` (call before its backward: the graph is read)."""
        for key, value in micro_batch_prediction(out.tokens, out.token_loss).items():
            self.sums[key] = self.sums.get(key, 0.0) + value

    def metrics(self) -> dict[str, float]:
        return dict(self.sums)
