"""EntroPIC ("Towards Stable Long-Term Training of LLMs via Entropy Stabilization with
Proportional-Integral Control", Yang et al. 2025, 2511.15248).

docs/algorithms.md §5. Updates on high-probability tokens move entropy: positive ones lower it,
negative ones raise it. A PI controller on the entropy error sets, in every micro-batch loss,

    e = H - target,   alpha = clip(kp * e + ki * I, -alpha_max, alpha_max),   then I <- I + e * b / B

(``H``: the current policy's entropy aggregated over the micro-batch as the loss is; ``I``: the
integral before this micro-batch; ``b / B``: the micro-batch's share of its mini-batch's rows), and
adds to the policy loss

    alpha * agg_{valid, pi(y) > prob_threshold}( -rho * |A| ),   rho = exp(clip(logp - old_logp, -20, 20))

(unclipped ratio, aggregated over the high-probability tokens only). Entropy above target
(alpha > 0) pushes both signs of high-probability tokens up (positive ones as 1 + alpha, negative
ones as 1 - alpha), lowering entropy; below target the opposite. The integral is checkpointed and
moves in ``record`` after each loss. As in the reference each rank's controller reads its own
micro-batches (no ``scope``). Cross-checked against the authors' code (yk7333/EntroPIC@2470730c core_algos.py
compute_policy_loss_entropic, dp_actor.py); tests/trainers/test_entropy_methods.py reproduces it.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.core_algos import agg_loss
from ..algos.lab_claim import LabClaim, Lever
from .base import Intervention, LossContext, TokenBatch, register_intervention

ROWS_KEY = "entropic/mini_rows"


def pi_alpha(integral: float, entropy: float, target: float, kp: float, ki: float, alpha_max: float) -> float:
    """The control signal from the integral *before* this reading (a non-finite entropy: 0 error)."""
    e = entropy - target if math.isfinite(entropy) else 0.0
    return min(max(kp * e + ki * integral, -alpha_max), alpha_max)


def entropic_term(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    prob_threshold: float,
    loss_agg: str = "token-mean",
    loss_agg_norm: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(alpha * agg_high(-rho |A|), high)``: the scalar added to the loss and the bool ``[B, T]``
    high-probability valid tokens (``logp > log prob_threshold``, current policy)."""
    high = mask.bool() & (logp.detach() > math.log(prob_threshold))
    rho = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
    adj = agg_loss(-rho * advantages.abs(), high.to(logp.dtype), loss_agg, loss_agg_norm)
    return alpha * adj, high


@register_intervention("entropic")
class EntroPIC(Intervention):
    logged_metrics = ("entropic/alpha", "entropic/integral", "entropic/high_frac", "loss/entropic")
    target_param = "target"
    lab_claim = LabClaim(
        "holds_target",
        "EntroPIC holds entropy near its target",
        levers=(
            Lever("entropic/alpha", "alpha", "value", final=True),
            Lever("entropic/high_frac", "high-probability tokens", "frac"),
            Lever("entropic/pos_high_frac", "high-probability A>0 tokens", "frac"),
            Lever("entropic/neg_high_frac", "high-probability A<0 tokens", "frac"),
        ),
    )

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/entropic.yaml."""

        target: float  # entropy set point (nats)
        kp: float  # proportional gain
        ki: float  # integral gain
        alpha_max: float  # |alpha| bound
        prob_threshold: float  # a token is high-probability when pi(y) > this (current policy)

        def validate(self, name: str) -> None:
            if self.kp < 0 or self.ki < 0 or not 0.0 < self.alpha_max or not 0.0 < self.prob_threshold < 1.0:
                raise UserError(f"algo.{name}: need kp, ki >= 0, alpha_max > 0 and 0 < prob_threshold < 1")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.integral = 0.0
        self.alpha = 0.0
        self._replay: weakref.ref | None = None  # the logp of the last committed loss
        self._replay_alpha = 0.0
        self.scope = "mini"  # select() records each mini-batch's row count (the integral's b / B)

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        rows = batch.mask.shape[0]
        return {ROWS_KEY: torch.full(batch.mask.shape, float(rows), dtype=torch.float32, device=batch.mask.device)}

    def apply(self, ctx: LossContext) -> None:
        p = self.params
        h = float(agg_loss(ctx.entropy.detach(), ctx.mask, ctx.loss_agg, ctx.loss_agg_norm).item())
        replay = self._replay() if self._replay is not None else None
        # the same micro-batch rebuilt after record (the attribution's loss prefixes) keeps the
        # alpha its loss used, so the rebuilt loss equals it
        alpha = self._replay_alpha if replay is ctx.logp else pi_alpha(self.integral, h, p.target, p.kp, p.ki, p.alpha_max)
        term, high = entropic_term(
            ctx.logp, ctx.old_logp, ctx.advantages, ctx.pg_mask, alpha, p.prob_threshold, ctx.loss_agg, ctx.loss_agg_norm
        )
        ctx.extra_terms["entropic"] = term
        n = max(int(ctx.pg_mask.bool().sum().item()), 1)
        ctx.metrics["entropic/high_frac"] = float(high.sum().item()) / n
        ctx.metrics["entropic/alpha"] = alpha
        ctx.metrics["entropic/entropy"] = h
        # the integral moves by this micro-batch's error times its rows' share of the mini-batch
        # (a direct loss call without the selection counts as a whole mini-batch); record commits
        # it, so a recomputed loss gives the same value
        e = h - p.target if math.isfinite(h) else 0.0
        rows = ctx.extras.get(ROWS_KEY)
        share = 1.0 if rows is None or rows.numel() == 0 else ctx.logp.shape[0] / float(rows.reshape(-1)[0].item())
        ctx.metrics["entropic/d_integral"] = 0.0 if replay is ctx.logp else e * share

    def record(self, ctx: LossContext) -> None:
        if "entropic/alpha" not in ctx.metrics:
            return
        self.alpha = self._replay_alpha = float(ctx.metrics["entropic/alpha"])
        self.integral += float(ctx.metrics["entropic/d_integral"])
        self._replay = weakref.ref(ctx.logp)

    def step_metrics(self) -> dict[str, float]:
        return {"entropic/alpha": self.alpha, "entropic/integral": self.integral}

    def state_dict(self) -> dict:
        return {"integral": self.integral, "alpha": self.alpha}

    def load_state_dict(self, state: dict) -> None:
        self.integral, self.alpha = float(state["integral"]), float(state["alpha"])
