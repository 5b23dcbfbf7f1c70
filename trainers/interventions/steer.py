"""STEER: stabilising token-level entropy change via reweighting ("Rethinking Entropy
Interventions in RLVR: An Entropy Change Perspective", Hao et al.).

docs/algorithms.md §5. Each token's first-order entropy change ``-Omega`` (diagnostics.py) is
estimated; tokens whose predicted change is large in magnitude get smaller weights, so the
step-wise entropy change stays in a moderate band while most tokens keep weight ~1.

- ``exp``: ``k = -ln(lambda_min) / max(m_max, 0.02)``, ``omega = clamp(exp(-k |Omega|), lambda_min, 1)``
  (the token with the largest |Omega| gets exactly lambda_min unless all are tiny).
- ``linear``: ``|Omega|`` mapped linearly from [m_min, m_max] onto [lambda_max, lambda_min].

``entropy_source`` says whose entropy ``H_t`` enters Omega in a micro-batch selection: ``old`` (the
sampling policy's, computed once before the step, as the reference code does on every mini-batch)
or ``current`` (the policy being updated). They agree on the first mini-batch of a step. Wider
scopes (mini, batch) select before the update, from the sampling policy's statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ...core.registry import unknown_choice
from ..stats.diagnostics import entropy_change_estimate
from .base import Intervention, LossContext, TokenBatch, finding, register_intervention

UNIFORM_WEIGHT = 0.99  # mean weight above this: near-uniform scaling that Adam cancels

MAPPINGS = ("exp", "linear")
ENTROPY_SOURCES = ("old", "current")


def steer_weights(
    omega: torch.Tensor,
    mask: torch.Tensor,
    *,
    mapping: str = "exp",
    lambda_min: float = 0.8,
    lambda_max: float = 1.0,
    m_floor: float = 0.02,
) -> torch.Tensor:
    """Token weights ``[b, T]`` from ``Omega [b, T]``; 0 on invalid tokens.

    Extremes ``m_max``/``m_min`` of ``|Omega|`` are taken over the valid tokens passed in (the batch
    that reaches the loss, or the mini/whole batch with a wider scope).
    """
    valid = mask.bool()
    m = omega.detach().abs()
    out = torch.zeros_like(m)
    if not bool(valid.any()):
        return out
    mv = m[valid]
    m_max, m_min = mv.max(), mv.min()
    if mapping == "exp":
        k = -math.log(lambda_min) / torch.clamp(m_max, min=m_floor)
        w = torch.clamp(torch.exp(-k * m), lambda_min, 1.0)
    elif mapping == "linear":
        if bool(m_max == m_min):
            w = torch.full_like(m, (lambda_min + lambda_max) / 2.0)
        else:
            w = lambda_max - (m - m_min) * (lambda_max - lambda_min) / (m_max - m_min)
            w = torch.clamp(w, lambda_min, lambda_max)
    else:
        raise UserError(unknown_choice("algo.steer.mapping", mapping, MAPPINGS))
    return torch.where(valid, w, out)


@register_intervention("steer")
class Steer(Intervention):
    logged_metrics = ("steer/weight_mean", "steer/weight_min")

    @classmethod
    def regime_warnings(cls, series, params: dict) -> list[dict]:
        weights = series("steer/weight_mean")
        if not weights or any(v <= UNIFORM_WEIGHT for _, v in weights):
            return []
        lo = min(v for _, v in weights)
        return [
            finding(
                "steer_uniform",
                f"steer's mean token weight stayed above {UNIFORM_WEIGHT} (lowest {lo:.4f}): near-uniform "
                f"scaling that Adam largely cancels; lower algo.steer.lambda_min or narrow the scope",
                weights[0][0],
            )
        ]

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/steer.yaml."""

        mapping: str  # exp | linear
        lambda_min: float
        lambda_max: float
        m_floor: float  # floor on m_max in the exp mapping (no reweighting of tiny changes)
        scope: str  # extremes over: micro | mini | batch | global
        entropy_source: str  # H in Omega: old (sampling policy, as the reference) | current

        def validate(self, name: str) -> None:
            if self.mapping not in MAPPINGS:
                raise UserError(unknown_choice(f"algo.{name}.mapping", self.mapping, MAPPINGS))
            if not 0.0 < self.lambda_min:
                raise UserError(f"algo.{name}.lambda_min={self.lambda_min:g} is not allowed: it must be > 0")
            if self.lambda_min > self.lambda_max:
                raise UserError(
                    f"algo.{name}.lambda_min={self.lambda_min:g} must be <= algo.{name}.lambda_max={self.lambda_max:g}"
                )
            if self.mapping == "exp" and self.lambda_min > 1.0:
                raise UserError(f"algo.{name}.lambda_min must be <= 1 for the exp mapping")
            if self.entropy_source not in ENTROPY_SOURCES:
                raise UserError(unknown_choice(f"algo.{name}.entropy_source", self.entropy_source, ENTROPY_SOURCES))
            if self.m_floor <= 0:
                raise UserError(f"algo.{name}.m_floor must be > 0")

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        p = self.params
        omega = entropy_change_estimate(batch.logp, batch.old_logp, batch.entropy, batch.advantages, batch.mask)
        w = steer_weights(
            omega, batch.mask, mapping=p.mapping, lambda_min=p.lambda_min, lambda_max=p.lambda_max, m_floor=p.m_floor
        )
        return {"steer/weight": w}

    def apply(self, ctx: LossContext) -> None:
        if self.scope == "micro" and self.params.entropy_source == "old":
            # The step batch's sampling entropy; a direct loss() call without it: the entropy passed in.
            old_h = (ctx.entropy if ctx.sampling_entropy is None else ctx.sampling_entropy).to(ctx.entropy.device)
            b = ctx.batch()
            w = self.select(TokenBatch(b.logp, b.old_logp, old_h.detach(), b.advantages, b.mask))["steer/weight"]
        else:
            w = self.selection(ctx)["steer/weight"]
        valid = ctx.mask.bool()
        if bool(valid.any()):
            ctx.metrics["steer/weight_mean"] = float(w[valid].mean().item())
            ctx.metrics["steer/weight_min"] = float(w[valid].min().item())
        ctx.scale(w)
