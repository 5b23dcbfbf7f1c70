"""High-entropy token mask ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning", Wang et al. 2025).

docs/algorithms.md §5. Only the top-rho fraction (rho = 0.2) of valid tokens by entropy H_t (the
"forking" tokens) keep their policy-gradient loss; the others get weight 0. The aggregation
denominator is unchanged (the paper adds the indicator inside the DAPO objective).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.core_algos import select_top_fraction
from .base import Intervention, LossContext, TokenBatch, register_intervention


@register_intervention("high_entropy_mask")
class HighEntropyMask(Intervention):
    logged_metrics = ("high_entropy_mask/frac",)

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/high_entropy_mask.yaml."""

        rho: float  # fraction of valid tokens kept (highest entropy)
        scope: str  # where the top-rho is taken: micro | mini | batch | global

        def validate(self, name: str) -> None:
            if not 0.0 < self.rho <= 1.0:
                raise UserError(f"algo.{name}.rho must be in (0, 1], got {self.rho}")

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        keep = select_top_fraction(batch.entropy, batch.mask.bool(), self.params.rho)
        return {"high_entropy_mask/keep": keep}

    def apply(self, ctx: LossContext) -> None:
        keep = self.selection(ctx)["high_entropy_mask/keep"].bool()
        valid = ctx.mask.bool()
        ctx.metrics["high_entropy_mask/frac"] = float((keep & valid).sum().item()) / max(int(valid.sum().item()), 1)
        ctx.scale(keep.to(ctx.pg_loss.dtype))
