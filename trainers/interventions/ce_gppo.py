"""CE-GPPO / GPPO ("Controlling Entropy via Gradient-Preserving Clipping Policy Optimization",
Kwai-Klear, 2509.20712; the clip of KlearReasoner's GPPO with general betas).

docs/algorithms.md §5. PPO's clip drops the gradient of every token whose ratio left the trust
region on the improving side. CE-GPPO keeps it, bounded and scaled: with ``rho`` the ratio,
``sg`` stop-gradient and ``eps_low``/``eps_high`` the configured clip,

    A < 0, rho < 1 - eps_low:   L = -beta1 (1 - eps_low) rho / sg(rho) A    (value of the clip bound)
    A > 0, rho > 1 + eps_high:  L = -beta2 (1 + eps_high) rho / sg(rho) A
    otherwise:                  L = -rho A

and the dual clip ``min(L, -A c)`` for ``A < 0``. The forward value equals the clipped
surrogate's (times beta); the gradient of an out-of-range token is ``beta (1 +- eps) A`` instead
of 0. Cross-checked against Kwai-Klear/CE-GPPO@10558fe0 ``compute_gppo_loss_general_beta``
(tests/golden/ce_gppo.json).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.lab_claim import LabClaim, Lever
from .base import Intervention, LossContext, register_intervention


def gppo_token_loss(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_c: float | None,
    beta1: float,
    beta2: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, low, high, dual)``, all ``[B, T]``: the per-token GPPO loss (``ratio`` carries the
    gradient) and the bool masks of the low-side, high-side and dual-clipped tokens."""
    rd = ratio.detach()
    low = (rd < 1.0 - eps_low) & (advantages < 0)
    high = (rd > 1.0 + eps_high) & (advantages > 0)
    live = ratio / rd  # value 1, gradient d log rho
    loss = torch.where(
        low,
        -beta1 * (1.0 - eps_low) * live * advantages,
        torch.where(high, -beta2 * (1.0 + eps_high) * live * advantages, -ratio * advantages),
    )
    if dual_c is None:
        return loss, low, high, torch.zeros_like(low)
    bound = -advantages * dual_c
    dual = (advantages < 0) & (loss > bound)
    return torch.where(advantages < 0, torch.minimum(loss, bound), loss), low, high, dual


@register_intervention("ce_gppo")
class CEGPPO(Intervention):
    logged_metrics = ("ce_gppo/low_frac", "ce_gppo/high_frac", "ce_gppo/beta1")
    lab_claim = LabClaim(
        "above_grpo",
        "CE-GPPO keeps entropy higher than clipping alone: ends above GRPO",
        levers=(
            Lever("ce_gppo/low_frac", "out-of-clip tokens kept, A<0 side", "frac"),
            Lever("ce_gppo/high_frac", "out-of-clip tokens kept, A>0 side", "frac"),
        ),
    )

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/ce_gppo.yaml."""

        beta1: float  # gradient scale of low-side (A < 0, rho < 1 - eps_low) tokens
        beta2: float  # gradient scale of high-side (A > 0, rho > 1 + eps_high) tokens

        def validate(self, name: str) -> None:
            if self.beta1 < 0 or self.beta2 < 0:
                raise UserError(f"algo.{name}: beta1 and beta2 must be >= 0, got {self.beta1}, {self.beta2}")

    def apply(self, ctx: LossContext) -> None:
        p = self.params
        loss, low, high, dual = gppo_token_loss(
            ctx.surrogate.ratio, ctx.advantages, ctx.eps_low, ctx.eps_high, ctx.dual_c, float(p.beta1), float(p.beta2)
        )
        ctx.pg_loss = loss
        ctx.clipped = dual  # only the dual clip still cuts a gradient
        ctx.dual_clipped = dual
        valid = ctx.mask.bool()
        n = max(int(valid.sum().item()), 1)
        ctx.metrics["ce_gppo/low_frac"] = float((low & valid).sum().item()) / n
        ctx.metrics["ce_gppo/high_frac"] = float((high & valid).sum().item()) / n

    def step_metrics(self) -> dict[str, float]:
        return {"ce_gppo/beta1": float(self.params.beta1), "ce_gppo/beta2": float(self.params.beta2)}
