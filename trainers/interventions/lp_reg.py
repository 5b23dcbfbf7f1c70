"""Lp-Reg ("Low-probability Tokens Sustain Exploration in Reinforcement Learning with Verifiable
Reward", CarlanLark/Lp-Reg, 2510.03222).

docs/algorithms.md §5. Negative updates wipe out low-probability "reasoning spark" tokens. Lp-Reg
builds a proxy of the current policy with the presumed noise removed (every token below
``kappa * max pi`` dropped, the rest re-normalised, detached) and adds the forward KL
``KL(proxy || pi)`` on the tokens it protects: valid, ``A < 0``, sampled token of probability below
the ``rho``-quantile of the micro-batch's sampled-token probabilities, and kept by the proxy
(``pi(token) >= kappa * max pi``). The term is ``coef * sum_sel KL / n_valid``. The proxy filter
is per token (the token's own distribution); the ``rho``-quantile ranks a token against the others
of the batch, so it has a ``scope``: micro (each micro-batch, the current log-probs: our default)
or mini / batch / global (the low-probability mask taken before the update from the sampling
log-probs; global: over all ranks' mini-batch, the same tokens on 1 or N ranks). The authors'
repository could not be read here: implemented from the paper's description; conf/intervention/
lp_reg.yaml marks our numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from .base import Intervention, LossContext, TokenBatch, register_intervention

KL_KEY, MAX_KEY = "lp_reg/proxy_kl", "lp_reg/max_logp"


def low_probability_mask(logp: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """Bool ``[b, T]``: valid tokens whose sampled-token log-prob is below the ``rho``-quantile
    (linear, ``torch.quantile``) of the valid tokens' log-probs of ``logp [b, T]``."""
    valid = mask.bool()
    lp = logp.detach()
    if not valid.any():
        return valid
    return valid & (lp < torch.quantile(lp[valid], rho))


def lp_reg_selection(logp: torch.Tensor, max_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     rho: float, kappa: float, low: torch.Tensor | None = None) -> torch.Tensor:
    """Bool ``[b, T]``: the protected tokens (see the module docstring); ``low``: the
    low-probability mask of a wider scope (``low_probability_mask`` of the whole batch), else
    the quantile of this ``logp``."""
    valid = mask.bool()
    if low is None:
        low = low_probability_mask(logp, mask, rho)
    return valid & low.bool() & (advantages < 0) & (logp.detach() >= max_logp.detach() + math.log(kappa))


@register_intervention("lp_reg")
class LpReg(Intervention):

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/lp_reg.yaml."""
        coef: float  # beta of the KL term
        kappa: float  # min-p filter of the proxy: tokens below kappa * max prob are noise
        rho: float  # low-probability quantile of the sampled tokens
        scope: str  # where the rho-quantile is taken: micro | mini | batch | global

        def validate(self, name: str) -> None:
            if self.coef < 0 or not 0 < self.kappa < 1 or not 0 < self.rho <= 1:
                raise UserError(f"algo.{name}: need coef >= 0, 0 < kappa < 1, 0 < rho <= 1")

    def vocab_stats(self) -> dict:
        return {KL_KEY: ("proxy_kl", {"kappa": float(self.params.kappa)}), MAX_KEY: ("max_logp", {})}

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        """The low-probability mask of a wider scope (``[b, T]`` bool) from the sampling log-probs."""
        return {"lp_reg/low": low_probability_mask(batch.logp, batch.mask, self.params.rho)}

    def apply(self, ctx: LossContext) -> None:
        kl, mx = ctx.extras.get(KL_KEY), ctx.extras.get(MAX_KEY)
        if kl is None or mx is None:
            raise RuntimeError("lp_reg: proxy statistics missing; compute Algorithm.vocab_stats() in the loss loop")
        p = self.params
        low = None if self.scope == "micro" else self.selection(ctx)["lp_reg/low"]
        sel = lp_reg_selection(ctx.logp, mx, ctx.advantages, ctx.mask, p.rho, p.kappa, low=low)
        n = ctx.mask.to(kl.dtype).sum().clamp(min=1.0)
        ctx.extra_terms["lp_reg"] = p.coef * torch.where(sel, kl, torch.zeros_like(kl)).sum() / n
        ctx.metrics["lp_reg/frac"] = float(sel.sum().item()) / float(n.item())
