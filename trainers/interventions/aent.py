"""AEnt ("On Entropy Control in LLM-RL Algorithms", Shen 2025, 2509.03493): clamped entropy
regularisation with an adaptive coefficient.

docs/algorithms.md §5. The bonus is the entropy of a *clamped* distribution: the
``floor(V * clamp)`` lowest-logit tokens of the vocabulary removed and the rest re-normalised
(``vocab_stats.clamped_entropy``), so the long tail cannot inflate it. The loss gains
``-coef * mean_valid(H_clamp)`` (a token mean over the micro-batch's valid tokens, as the reference).
After each training step past ``warmup_steps`` (when ``adaptive``) the coefficient moves against
the step's token-mean clamped entropy ``H`` by how far it lies outside ``[low, high]``:

    coef <- clip(coef - lr * (min(0, H - low) + max(0, H - high)), coef_min, coef_max)

The step mean has a ``scope``: global (the token mean over every rank's tokens of the step, summed
over ranks at the end of the step, ``Algorithm.end_step``: the reference, whose statistics are reduced over the
data-parallel group; the same coefficient on 1 or N ranks) or micro (this rank's tokens only).
Cross-checked against the authors' code (inclusionAI/AReaL@a0ec9cee recipe/AEnt: functional.py,
actor.py, aent_args.py); tests/trainers/test_entropy_methods.py reproduces it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.core_algos import masked_mean
from ..algos.lab_claim import LabClaim, Lever
from .base import Intervention, LossContext, register_intervention

KEY = "aent/clamped_entropy"
AENT_SCOPES = ("micro", "global")


def adjust_coef(coef: float, h: float, low: float, high: float, lr: float, lo: float, hi: float) -> float:
    """One coefficient update from the step's clamped entropy ``h`` (a non-finite ``h`` keeps it)."""
    if not math.isfinite(h):
        return coef
    coef = coef - lr * (min(0.0, h - low) + max(0.0, h - high))
    return min(max(coef, lo), hi)


@register_intervention("aent")
class AEnt(Intervention):
    logged_metrics = ("aent/coef", "aent/clamped_entropy", "loss/aent")
    lab_claim = LabClaim(
        "above_grpo",
        "AEnt's clamped, adaptive bonus keeps entropy from collapsing: ends above GRPO",
        levers=(Lever("aent/coef", "coef", "value", final=True), Lever("aent/clamped_entropy", "clamped entropy")),
        added_term="loss/aent",
    )

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/aent.yaml."""

        clamp: float  # fraction of the vocabulary (lowest logits) removed before the entropy
        init_coef: float  # coefficient at step 0
        adaptive: bool  # move the coefficient after each step (else it stays init_coef)
        lr: float  # step size of the coefficient update
        low: float  # clamped-entropy band [low, high] (nats)
        high: float
        coef_min: float  # coefficient box
        coef_max: float
        warmup_steps: int  # the coefficient first moves after step warmup_steps + 1
        scope: str  # the step mean: global (all ranks' tokens, the reference) | micro (this rank's)

        def validate(self, name: str) -> None:
            if self.scope not in AENT_SCOPES:
                raise UserError(
                    f"algo.{name}.scope: '{self.scope}' is not one of {', '.join(AENT_SCOPES)} "
                    f"(the coefficient reads a step mean, not a token selection)"
                )
            if (
                not 0 <= self.clamp < 1
                or not 0 <= self.coef_min <= self.coef_max
                or self.lr < 0
                or not self.low <= self.high
                or self.init_coef < 0
                or self.warmup_steps < 0
            ):
                raise UserError(
                    f"algo.{name}: need 0 <= clamp < 1, 0 <= coef_min <= coef_max, init_coef >= 0, "
                    f"lr >= 0, low <= high and warmup_steps >= 0"
                )

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.coef = float(params.init_coef)
        self.step = 0
        self._tokens = torch.zeros(2, dtype=torch.float64)  # clamped-entropy sum, token count
        self.last_h = float("nan")

    def vocab_stats(self) -> dict:
        return {KEY: ("clamped_entropy", {"clamp": float(self.params.clamp)})}

    def begin_step(self, sampling_entropy: float) -> None:
        # the update the reference makes at the end of its step g (0-based) when g > warmup_steps,
        # made here before the next step from step g's token-mean clamped entropy
        p = self.params
        total, count = (float(v) for v in self._tokens)
        if count > 0:
            self.last_h = total / count
            if p.adaptive and self.step - 1 > p.warmup_steps:
                self.coef = adjust_coef(self.coef, self.last_h, p.low, p.high, p.lr, p.coef_min, p.coef_max)
        self._tokens = torch.zeros(2, dtype=torch.float64)
        self.step += 1

    def reduce_step(self, reduce) -> None:
        if self.scope == "global":
            self._tokens = torch.as_tensor(reduce(self._tokens), dtype=torch.float64).cpu()

    def apply(self, ctx: LossContext) -> None:
        h = ctx.extras.get(KEY)
        if h is None:
            raise RuntimeError(f"aent: extras['{KEY}'] missing; compute Algorithm.vocab_stats() in the loss loop")
        valid = ctx.mask.to(h.dtype)
        n = valid.sum()
        term = (h * valid).sum() / n.clamp(min=1.0)
        ctx.extra_terms["aent"] = -self.coef * term
        ctx.metrics["aent/clamped_entropy"] = float(masked_mean(h.detach(), ctx.mask).item())

    def record(self, ctx: LossContext) -> None:
        h, valid = ctx.extras[KEY].detach().double(), ctx.mask.detach().double()
        self._tokens = self._tokens + torch.stack([(h * valid).sum().cpu(), valid.sum().cpu()])

    def step_metrics(self) -> dict[str, float]:
        return {"aent/coef": self.coef, "aent/last_clamped_entropy": self.last_h}

    def state_dict(self) -> dict:
        # the step's sums too: the coefficient moves from them at the next begin_step, which after a
        # resume is the first step of the new process
        return {"coef": self.coef, "step": self.step, "tokens": [float(v) for v in self._tokens], "last_h": self.last_h}

    def load_state_dict(self, state: dict) -> None:
        self.coef = float(state["coef"])
        self.step = int(state.get("step", 0))
        self._tokens = torch.tensor(state.get("tokens", [0.0, 0.0]), dtype=torch.float64)  # older runs: none
        self.last_h = float(state.get("last_h", float("nan")))
