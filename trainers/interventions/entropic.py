"""EntroPIC ("Towards Stable Long-Term Training of LLMs via Entropy Stabilization with
Proportional-Integral Control", Yang et al. 2025, 2511.15248; yk7333/EntroPIC).

docs/algorithms.md §5. Positive-advantage updates on high-probability tokens lower entropy,
negative ones raise it. A PI controller on the entropy error ``e_k = target - H_k`` (sampling
policy, once per step) sets

    I_k = I_{k-1} + e_k,    alpha_k = clip(kp * e_k + ki * I_k, -alpha_max, alpha_max)

and the token weights are ``1 - alpha`` on high-probability (``p_old >= prob_threshold``) tokens
with ``A > 0`` and ``1 + alpha`` on those with ``A < 0``; all other tokens keep weight 1. Entropy
below target (alpha > 0) damps the entropy-lowering updates and boosts the raising ones. The
integral ``I`` and ``alpha`` are checkpointed. The authors' repository could not be read here:
implemented from the paper; ``kp``, ``ki``, ``prob_threshold`` and ``alpha_max`` are our defaults
(conf/intervention/entropic.yaml says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from .base import Intervention, LossContext, register_intervention


def pi_step(integral: float, entropy: float, target: float, kp: float, ki: float,
            alpha_max: float) -> tuple[float, float]:
    """One PI update: ``(integral', alpha)`` from the sampling entropy (a non-finite reading keeps
    the integral and gives its current action)."""
    e = target - entropy if math.isfinite(entropy) else 0.0
    integral = integral + e
    return integral, min(max(kp * e + ki * integral, -alpha_max), alpha_max)


def entropic_weights(old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, alpha: float,
                     prob_threshold: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(w, pos_high, neg_high)``, ``[B, T]``: ``1 - alpha`` on valid high-probability tokens with
    ``A > 0``, ``1 + alpha`` on those with ``A < 0``, 1 elsewhere."""
    high = (old_logp.detach().exp() >= prob_threshold) & mask.bool()
    pos, neg = high & (advantages > 0), high & (advantages < 0)
    w = torch.ones_like(old_logp)
    w = torch.where(pos, torch.full_like(w, 1.0 - alpha), w)
    return torch.where(neg, torch.full_like(w, 1.0 + alpha), w), pos, neg


@register_intervention("entropic")
class EntroPIC(Intervention):

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/entropic.yaml."""
        target: float  # entropy set point (nats)
        kp: float  # proportional gain
        ki: float  # integral gain
        alpha_max: float  # |alpha| bound (weights stay in [1 - alpha_max, 1 + alpha_max])
        prob_threshold: float  # a token is high-probability when p_old >= this

        def validate(self, name: str) -> None:
            if self.kp < 0 or self.ki < 0 or not 0.0 < self.alpha_max <= 1.0 or not 0.0 <= self.prob_threshold < 1.0:
                raise UserError(f"algo.{name}: need kp, ki >= 0, 0 < alpha_max <= 1, 0 <= prob_threshold < 1")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.integral = 0.0
        self.alpha = 0.0

    def begin_step(self, sampling_entropy: float) -> None:
        p = self.params
        self.integral, self.alpha = pi_step(self.integral, float(sampling_entropy), p.target, p.kp, p.ki, p.alpha_max)

    def apply(self, ctx: LossContext) -> None:
        w, pos, neg = entropic_weights(ctx.old_logp, ctx.advantages, ctx.pg_mask, self.alpha, self.params.prob_threshold)
        ctx.scale(w)
        n = max(int(ctx.pg_mask.bool().sum().item()), 1)
        ctx.metrics["entropic/pos_high_frac"] = float(pos.sum().item()) / n
        ctx.metrics["entropic/neg_high_frac"] = float(neg.sum().item()) / n

    def step_metrics(self) -> dict[str, float]:
        return {"entropic/alpha": self.alpha, "entropic/integral": self.integral}

    def state_dict(self) -> dict:
        return {"integral": self.integral, "alpha": self.alpha}

    def load_state_dict(self, state: dict) -> None:
        self.integral, self.alpha = float(state["integral"]), float(state["alpha"])
