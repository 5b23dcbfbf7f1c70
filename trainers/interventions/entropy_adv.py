"""Entropy advantage shaping ("Reasoning with Exploration: An Entropy Perspective", Cheng et al.
2025, 2506.14758).

docs/algorithms.md §5. Each token's advantage gains a detached, clipped entropy term

    psi_t = min(alpha * sg(H_t), |A_t| / kappa),   A'_t = A_t + psi_t

(alpha = 0.4, kappa = 2): high-entropy tokens of correct responses are pushed harder and those of
wrong responses less, and the clip keeps the term from flipping an advantage's sign. The policy
loss is rebuilt from the configured objective with ``A'``; list it first in
``algo.interventions``. No public code was available here: implemented from the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.lab_claim import LabClaim, Lever
from .base import Intervention, LossContext, register_intervention


def entropy_advantage_term(
    entropy: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, alpha: float, kappa: float
) -> torch.Tensor:
    """``psi [B, T] = min(alpha * H, |A| / kappa)`` on valid tokens (0 elsewhere), detached."""
    psi = torch.minimum(alpha * entropy.detach(), advantages.detach().abs() / kappa)
    return psi * mask.to(psi.dtype)


@register_intervention("entropy_adv")
class EntropyAdvantage(Intervention):
    logged_metrics = ("entropy_adv/psi_mean", "entropy_adv/alpha")
    lab_claim = LabClaim(
        "none",
        "its claims are on reasoning length and pass@k, not an entropy level",
        levers=(
            Lever("entropy_adv/psi_mean", "entropy term psi"),
            Lever("entropy_adv/clip_frac", "tokens capped at |A|/kappa", "frac"),
        ),
    )

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/entropy_adv.yaml."""

        alpha: float  # scale of the entropy term
        kappa: float  # the term is clipped at |A| / kappa

        def validate(self, name: str) -> None:
            if self.alpha < 0 or not self.kappa > 1.0:
                raise UserError(f"algo.{name}: need alpha >= 0 and kappa > 1, got {self.alpha}, {self.kappa}")

    def apply(self, ctx: LossContext) -> None:
        psi = entropy_advantage_term(ctx.entropy, ctx.advantages, ctx.pg_mask, self.params.alpha, self.params.kappa)
        valid = ctx.pg_mask.bool()
        n = max(int(valid.sum().item()), 1)
        ctx.metrics["entropy_adv/psi_mean"] = float(psi.sum().item()) / n
        capped = (self.params.alpha * ctx.entropy.detach() > ctx.advantages.abs() / self.params.kappa) & valid
        ctx.metrics["entropy_adv/clip_frac"] = float(capped.sum().item()) / n
        ctx.set_advantages(ctx.advantages + psi)

    def step_metrics(self) -> dict[str, float]:
        return {"entropy_adv/alpha": float(self.params.alpha)}
