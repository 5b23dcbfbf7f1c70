"""Lp-Reg ("Low-probability Tokens Sustain Exploration in Reinforcement Learning with Verifiable
Reward", CarlanLark/Lp-Reg, 2510.03222).

docs/algorithms.md §5. Negative updates wipe out low-probability "reasoning spark" tokens. Lp-Reg
builds a proxy of the current policy with the presumed noise removed (every token below
``kappa * max pi`` dropped, the rest re-normalised, detached) and adds the forward KL
``KL(proxy || pi)`` on the tokens it protects: valid, ``A < 0``, sampled token of probability below
the ``rho``-quantile of the micro-batch's sampled-token probabilities, and kept by the proxy
(``pi(token) >= kappa * max pi``). The term is ``coef * sum_sel KL / n_valid``. The authors'
repository could not be read here: implemented from the paper's description; conf/intervention/
lp_reg.yaml marks our numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from .base import Intervention, LossContext, register_intervention

KL_KEY, MAX_KEY = "lp_reg/proxy_kl", "lp_reg/max_logp"


def lp_reg_selection(logp: torch.Tensor, max_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     rho: float, kappa: float) -> torch.Tensor:
    """Bool ``[b, T]``: the protected tokens (see the module docstring)."""
    valid = mask.bool()
    lp = logp.detach()
    if not valid.any():
        return valid
    thr = torch.quantile(lp[valid], rho)
    return valid & (advantages < 0) & (lp < thr) & (lp >= max_logp.detach() + math.log(kappa))


@register_intervention("lp_reg")
class LpReg(Intervention):

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/lp_reg.yaml."""
        coef: float  # beta of the KL term
        kappa: float  # min-p filter of the proxy: tokens below kappa * max prob are noise
        rho: float  # low-probability quantile of the sampled tokens

        def validate(self, name: str) -> None:
            if self.coef < 0 or not 0 < self.kappa < 1 or not 0 < self.rho <= 1:
                raise UserError(f"algo.{name}: need coef >= 0, 0 < kappa < 1, 0 < rho <= 1")

    def vocab_stats(self) -> dict:
        return {KL_KEY: ("proxy_kl", {"kappa": float(self.params.kappa)}), MAX_KEY: ("max_logp", {})}

    def apply(self, ctx: LossContext) -> None:
        kl, mx = ctx.extras.get(KL_KEY), ctx.extras.get(MAX_KEY)
        if kl is None or mx is None:
            raise RuntimeError("lp_reg: proxy statistics missing; compute Algorithm.vocab_stats() in the loss loop")
        p = self.params
        sel = lp_reg_selection(ctx.logp, mx, ctx.advantages, ctx.mask, p.rho, p.kappa)
        n = ctx.mask.to(kl.dtype).sum().clamp(min=1.0)
        ctx.extra_terms["lp_reg"] = p.coef * torch.where(sel, kl, torch.zeros_like(kl)).sum() / n
        ctx.metrics["lp_reg/frac"] = float(sel.sum().item()) / float(n.item())
