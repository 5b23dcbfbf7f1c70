"""Positive/negative sample reweighting ("The Surprising Effectiveness of Negative Reinforcement in
LLM Reasoning", Zhu et al. 2025: W-REINFORCE with lambda+ = 0.1).

docs/algorithms.md §5. The loss of positive-advantage responses is scaled by ``pos_weight`` and that of
negative-advantage responses by ``neg_weight``. Learning from negatives keeps entropy up, so a
small ``pos_weight`` slows collapse.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from .base import Intervention, LossContext, register_intervention


@register_intervention("sample_reweight")
class SampleReweight(Intervention):
    #: the share of valid tokens whose weight is not 1 (what it changed: 0 with pos_weight = neg_weight
    #: = 1), the shares of positive (scaled by pos_weight) and negative (by neg_weight) tokens, and the
    #: mean token weight
    logged_metrics = (
        "sample_reweight/reweighted_frac",
        "sample_reweight/pos_frac",
        "sample_reweight/neg_frac",
        "sample_reweight/weight_mean",
    )

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/sample_reweight.yaml."""

        pos_weight: float  # lambda+
        neg_weight: float  # lambda-

        def validate(self, name: str) -> None:
            if self.pos_weight < 0 or self.neg_weight < 0:
                raise UserError(f"algo.{name}: pos_weight and neg_weight must be >= 0")

    def apply(self, ctx: LossContext) -> None:
        a = ctx.advantages
        w = torch.where(
            a > 0,
            torch.full_like(ctx.pg_loss, self.params.pos_weight),
            torch.where(a < 0, torch.full_like(ctx.pg_loss, self.params.neg_weight), torch.ones_like(ctx.pg_loss)),
        )
        ctx.scale(w)
        valid = ctx.mask.bool()
        n = max(int(valid.sum().item()), 1)
        ctx.metrics["sample_reweight/reweighted_frac"] = float(((w != 1.0) & valid).sum().item()) / n
        ctx.metrics["sample_reweight/pos_frac"] = float(((a > 0) & valid).sum().item()) / n
        ctx.metrics["sample_reweight/neg_frac"] = float(((a < 0) & valid).sum().item()) / n
        ctx.metrics["sample_reweight/weight_mean"] = float(w.detach()[valid].sum().item()) / n
