"""GTPO ("GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy",
Tan et al. 2025, 2508.04349).

docs/algorithms.md §5. The response-level GRPO advantage ``A_i`` is spread over the tokens by
their entropy, within each prompt group and position ``t``, among the ``n_t`` responses of the same
advantage sign still running at ``t``:

    A > 0:  A_{i,t} = A_i (alpha1 + alpha2 n_t H_{i,t} / sum_k H_{k,t})
    A < 0:  A_{i,t} = A_i (alpha1 + alpha2 n_t H_{i,t}^-1 / sum_k H_{k,t}^-1)

so the high-entropy tokens of correct responses get more credit and the confident tokens of wrong
ones more blame; the entropy share averages to 1 over each position's same-sign responses, so the
group's total credit is GRPO's times ``alpha1 + alpha2``. It shapes advantages (``Algorithm.advantages``
with the sampling entropy), not the loss. No public code was available here: implemented from our
reading of the paper; the alphas in conf/intervention/gtpo.yaml are ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.lab_claim import LabClaim, Lever
from .base import Intervention, LossContext, register_intervention

H_FLOOR = 1e-6  # entropy floor before 1/H


def gtpo_advantages(
    adv: torch.Tensor, entropy: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor, alpha1: float, alpha2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(shaped [B, T], share [B, T])`` from token advantages ``adv [B, T]`` (constant per response),
    sampling entropy ``[B, T]``, ``group_ids [B]`` and ``mask [B, T]``; ``share`` is the entropy share
    ``n_t x_{i,t} / sum_k x_{k,t}`` (1 where nothing is shaped)."""
    valid = mask.bool()
    h = entropy.detach().to(adv.dtype).clamp(min=H_FLOOR)
    sign = torch.sign(adv) * valid
    share = torch.ones_like(adv)
    for g in torch.unique(group_ids):
        rows = group_ids == g
        for s in (1.0, -1.0):
            same = rows.unsqueeze(-1) & (sign == s)  # [B, T]
            x = torch.where(same, h if s > 0 else 1.0 / h, torch.zeros_like(h))
            total = x.sum(0, keepdim=True)  # [1, T]
            n_t = same.sum(0, keepdim=True).to(adv.dtype)
            share = torch.where(same, n_t * x / total.clamp(min=torch.finfo(adv.dtype).tiny), share)
    shaped = adv * (alpha1 + alpha2 * share)
    return torch.where(valid & (sign != 0), shaped, adv), share


@register_intervention("gtpo")
class GTPO(Intervention):
    logged_metrics = ("gtpo/share_max",)
    lab_claim = LabClaim(
        "above_grpo",
        "GTPO's entropy-shaped token rewards keep entropy higher than GRPO",
        levers=(Lever("gtpo/share_max", "largest token share n_t x / sum x"),),
    )

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/gtpo.yaml."""

        alpha1: float  # weight of the response's own advantage
        alpha2: float  # weight of its entropy-shaped share

        def validate(self, name: str) -> None:
            if self.alpha1 < 0 or self.alpha2 < 0 or self.alpha1 + self.alpha2 <= 0:
                raise UserError(f"algo.{name}: need alpha1, alpha2 >= 0 with alpha1 + alpha2 > 0")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.share_max = float("nan")

    def shape_advantages(
        self, adv: torch.Tensor, entropy: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        shaped, share = gtpo_advantages(adv, entropy, group_ids, mask, self.params.alpha1, self.params.alpha2)
        valid = mask.bool()
        self.share_max = float(share[valid].max().item()) if valid.any() else float("nan")
        return shaped

    def apply(self, ctx: LossContext) -> None:
        pass  # the advantages already carry the shaping

    def step_metrics(self) -> dict[str, float]:
        return {"gtpo/share_max": self.share_max}
