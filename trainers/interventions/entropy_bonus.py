"""Entropy regularisation: a fixed bonus (``entropy_bonus``) and a closed-loop one
(``adaptive_entropy``).

docs/algorithms.md §3/§5: the loss gains ``-beta * agg(H)`` with the configured loss aggregation (as
verl's ``agg_loss(entropy, mask, loss_agg_mode)``). Both need d(entropy)/d(theta), so
the algorithm reports ``needs_entropy_grad`` and the loop computes a differentiable entropy.

``adaptive_entropy`` moves beta once per step toward a target entropy, in the spirit of
Skywork-OR1's adaptive entropy control: ``beta += delta`` while the sampling policy's batch entropy
is below target, ``beta -= delta`` above it, clipped to ``[coef_min, coef_max]``; a non-finite
entropy reading leaves beta unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.errors import UserError
from ..algos.core_algos import entropy_bonus_term
from .base import Intervention, LossContext, register_intervention


class _EntropyTerm(Intervention):
    needs_entropy_grad = True
    coef: float = 0.0

    def apply(self, ctx: LossContext) -> None:
        if ctx.logp.requires_grad and not ctx.entropy.requires_grad:
            raise RuntimeError(
                f"{self.name}: entropy has no gradient; compute it with entropy_grad=True (Algorithm.needs_entropy_grad is True)"
            )
        ctx.extra_terms["entropy_bonus"] = entropy_bonus_term(ctx.entropy, ctx.mask, self.coef, ctx.loss_agg, ctx.loss_agg_norm)

    def step_metrics(self) -> dict[str, float]:
        return {"entropy_bonus/coef": float(self.coef)}


@register_intervention("entropy_bonus")
class EntropyBonus(_EntropyTerm):
    logged_metrics = ("entropy_bonus/coef",)

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/entropy_bonus.yaml."""

        coef: float  # beta

        def validate(self, name: str) -> None:
            if self.coef < 0:
                raise UserError(f"algo.{name}.coef must be >= 0, got {self.coef}")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.coef = float(params.coef)


@register_intervention("adaptive_entropy")
class AdaptiveEntropy(_EntropyTerm):
    logged_metrics = ("entropy_bonus/coef",)
    target_param = "target"

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/adaptive_entropy.yaml."""

        init_coef: float
        target: float  # nats; the same set point as STARE's h_tgt
        delta: float  # step per training step
        coef_min: float
        coef_max: float

        def validate(self, name: str) -> None:
            if not (0.0 <= self.coef_min <= self.init_coef <= self.coef_max) or self.delta < 0:
                raise UserError(f"algo.{name}: need 0 <= coef_min <= init_coef <= coef_max and delta >= 0")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.coef = float(params.init_coef)

    def begin_step(self, sampling_entropy: float) -> None:
        h = float(sampling_entropy)
        if not math.isfinite(h):
            return
        p = self.params
        step = p.delta if h < p.target else (-p.delta if h > p.target else 0.0)
        self.coef = min(max(self.coef + step, p.coef_min), p.coef_max)

    def state_dict(self) -> dict:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        self.coef = float(state["coef"])
