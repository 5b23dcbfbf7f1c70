"""AEnt ("Entropy Regularization with Adaptive Coefficient", antgroup/AEnt on verl, 2025).

docs/algorithms.md §5. The entropy bonus is taken on a *clamped* distribution: the ``top_k`` most
probable tokens, re-normalised (``vocab_stats.topk_entropy``), so the long tail of the vocabulary
cannot inflate the bonus. The loss gains ``-coef * agg(H_k)``; once per step ``coef`` moves by
``delta`` toward keeping the previous step's mean clamped entropy inside ``[low, high]`` (up below
``low``, down above ``high``), clipped to ``[coef_min, coef_max]``. That mean is recorded after each
micro-batch loss (``record``) and has a ``scope``: micro (ours: the mean of this rank's micro-batch
means) or global (the token mean over every rank's tokens of the step, summed over ranks at the
next ``begin_step``: the same coefficient on 1 or N ranks). The authors' repository could not
be read here: implemented from the paper's description; the numbers in conf/intervention/aent.yaml
are ours where marked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.core_algos import agg_loss, masked_mean
from .base import Intervention, LossContext, register_intervention

AENT_SCOPES = ("micro", "global")

KEY = "aent/topk_entropy"


def adjust_coef(coef: float, h: float, low: float, high: float, delta: float, lo: float, hi: float) -> float:
    """One step of the coefficient: ``+delta`` below ``low``, ``-delta`` above ``high``, clipped."""
    if not math.isfinite(h):
        return coef
    step = delta if h < low else (-delta if h > high else 0.0)
    return min(max(coef + step, lo), hi)


@register_intervention("aent")
class AEnt(Intervention):

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/aent.yaml."""
        top_k: int  # tokens kept in the clamped distribution
        init_coef: float  # coefficient at step 0
        delta: float  # coefficient step per training step
        low: float  # clamped-entropy band [low, high] (nats)
        high: float
        coef_min: float
        coef_max: float
        scope: str  # the controller's mean: micro (mean of micro-batch means) | global (all ranks' token mean)

        def validate(self, name: str) -> None:
            if self.scope not in AENT_SCOPES:
                raise UserError(f"algo.{name}.scope: '{self.scope}' is not one of {', '.join(AENT_SCOPES)} "
                                f"(the coefficient reads a step mean, not a token selection)")
            if self.top_k < 2 or not 0 <= self.coef_min <= self.init_coef <= self.coef_max or self.delta < 0 \
                    or not self.low <= self.high:
                raise UserError(f"algo.{name}: need top_k >= 2, 0 <= coef_min <= init_coef <= coef_max, "
                                f"delta >= 0 and low <= high")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.coef = float(params.init_coef)
        self._sum, self._n = 0.0, 0
        self._tokens = torch.zeros(2, dtype=torch.float64)     # clamped-entropy sum, token count
        self.last_h = float("nan")

    def vocab_stats(self) -> dict:
        return {KEY: ("topk_entropy", {"k": int(self.params.top_k)})}

    def reduce_step(self, reduce) -> None:
        if self.scope == "global":
            self._tokens = torch.as_tensor(reduce(self._tokens), dtype=torch.float64).cpu()

    def begin_step(self, sampling_entropy: float) -> None:
        p = self.params
        total, count = (float(v) for v in self._tokens)
        seen = count > 0 if self.scope == "global" else self._n > 0
        if seen:
            self.last_h = total / count if self.scope == "global" else self._sum / self._n
            self.coef = adjust_coef(self.coef, self.last_h, p.low, p.high, p.delta, p.coef_min, p.coef_max)
        self._sum, self._n = 0.0, 0
        self._tokens = torch.zeros(2, dtype=torch.float64)

    def apply(self, ctx: LossContext) -> None:
        h = ctx.extras.get(KEY)
        if h is None:
            raise RuntimeError(f"aent: extras['{KEY}'] missing; compute Algorithm.vocab_stats() in the loss loop")
        ctx.extra_terms["aent"] = -self.coef * agg_loss(h, ctx.mask, ctx.loss_agg, ctx.loss_agg_norm)
        ctx.metrics["aent/clamped_entropy"] = float(masked_mean(h.detach(), ctx.mask).item())

    def record(self, ctx: LossContext) -> None:
        h = ctx.extras[KEY].detach()
        self._sum, self._n = self._sum + float(masked_mean(h, ctx.mask).item()), self._n + 1
        h, valid = h.double(), ctx.mask.detach().double()
        self._tokens = self._tokens + torch.stack([(h * valid).sum().cpu(), valid.sum().cpu()])

    def step_metrics(self) -> dict[str, float]:
        return {"aent/coef": self.coef, "aent/last_clamped_entropy": self.last_h}

    def state_dict(self) -> dict:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        self.coef = float(state["coef"])
