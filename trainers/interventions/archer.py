"""Archer ("Stabilizing Knowledge, Promoting Reasoning: Dual-Token Constraints for RLVR",
Wang et al. 2025, 2507.15778; wizard-III/ArcherCodeR).

docs/algorithms.md §5. Tokens are classed per response: the ones above the response's
``quantile`` (0.8) of entropy (valid tokens, linear interpolation) are the high-entropy
"reasoning" tokens; they get a looser clip (``high_clip_low``/``high_clip_high``, 0.5) and a weaker
KL to the reference (``high_kl_coef``, 0 in the published runs); the others (knowledge tokens)
keep the tight clip (0.2) and the KL (``low_kl_coef``, 0.001). Each KL part is aggregated over its
own tokens with the configured aggregation. The dual clip is the algorithm's ``dual_c``.
Cross-checked against wizard-III/ArcherCodeR@8a1785be (``compute_policy_loss`` with
``use_token_entropy_separate``, the two-part KL in ``dp_actor.py``; tests/golden/archer.json).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.core_algos import LOG_RATIO_CLAMP, agg_loss, low_var_kl
from ..algos.lab_claim import LabClaim, Lever
from .base import Intervention, LossContext, register_intervention


def response_entropy_quantile(entropy: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """``[B, 1]``: each response's ``q``-quantile of entropy over its valid tokens (linear, as
    ``torch.nanquantile``); nan for a response without valid tokens."""
    masked = torch.where(mask.bool(), entropy.detach(), torch.full_like(entropy, float("nan")))
    return torch.nanquantile(masked, q, dim=-1, keepdim=True)


def dual_clip_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, dual_c: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clip with per-token ranges ``lo``/``hi`` (``[B, T]``): ``(loss, ratio_clipped, dual)``."""
    l1 = -advantages * ratio
    l2 = -advantages * torch.minimum(torch.maximum(ratio, 1.0 - lo), 1.0 + hi)
    lclip = torch.maximum(l1, l2)
    rc = l2 > l1
    if dual_c is None:
        return lclip, rc, torch.zeros_like(rc)
    l3 = -advantages * dual_c
    dual = (advantages < 0) & (lclip > l3)
    return torch.where(advantages < 0, torch.minimum(lclip, l3), lclip), rc, dual


@register_intervention("archer")
class Archer(Intervention):
    logged_metrics = ("archer/high_frac", "archer/kl_low", "loss/archer_kl")
    lab_claim = LabClaim(
        "above_grpo",
        "Archer's dual-token constraints keep entropy higher than GRPO",
        levers=(Lever("archer/high_frac", "high-entropy tokens", "frac"), Lever("archer/kl_low", "KL of the low-entropy tokens")),
    )

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/archer.yaml."""

        quantile: float  # per-response entropy quantile above which a token is high-entropy
        low_clip_low: float  # clip of the low-entropy tokens
        low_clip_high: float
        high_clip_low: float  # clip of the high-entropy tokens
        high_clip_high: float
        low_kl_coef: float  # KL coefficient on low-entropy tokens
        high_kl_coef: float  # KL coefficient on high-entropy tokens

        def validate(self, name: str) -> None:
            if not 0.0 < self.quantile < 1.0:
                raise UserError(f"algo.{name}.quantile must be in (0, 1), got {self.quantile}")
            if min(self.low_clip_low, self.low_clip_high, self.high_clip_low, self.high_clip_high) < 0:
                raise UserError(f"algo.{name}: clip ranges must be >= 0")
            if self.low_kl_coef < 0 or self.high_kl_coef < 0:
                raise UserError(f"algo.{name}: KL coefficients must be >= 0")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.needs_ref = params.low_kl_coef > 0 or params.high_kl_coef > 0

    def apply(self, ctx: LossContext) -> None:
        p = self.params
        valid = ctx.mask.bool()
        high = (ctx.entropy.detach() > response_entropy_quantile(ctx.entropy, ctx.mask, p.quantile)) & valid
        low = valid & ~high
        dt = ctx.logp.dtype
        base = torch.zeros_like(ctx.logp, requires_grad=False).detach()
        lo = torch.where(high, base + p.high_clip_low, base + p.low_clip_low)
        hi = torch.where(high, base + p.high_clip_high, base + p.low_clip_high)
        ratio = torch.exp(torch.clamp(ctx.logp - ctx.old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        loss, rc, dual = dual_clip_loss(ratio, ctx.advantages, lo, hi, ctx.dual_c)
        ctx.pg_loss, ctx.clipped, ctx.dual_clipped = loss, rc | dual, dual
        n = max(int(valid.sum().item()), 1)
        ctx.metrics["archer/high_frac"] = float(high.sum().item()) / n
        if self.needs_ref:
            if ctx.ref_logp is None:
                raise RuntimeError("archer: KL coefficients > 0 need ref_logp (Algorithm.needs_ref is True)")
            kld = low_var_kl(ctx.logp, ctx.ref_logp)
            kl_low = agg_loss(kld, low.to(dt), ctx.loss_agg, ctx.loss_agg_norm)
            kl_high = agg_loss(kld, high.to(dt), ctx.loss_agg, ctx.loss_agg_norm)
            ctx.extra_terms["archer_kl"] = p.low_kl_coef * kl_low + p.high_kl_coef * kl_high
            ctx.metrics["archer/kl_low"] = float(kl_low.detach().item())
            ctx.metrics["archer/kl_high"] = float(kl_high.detach().item())
