"""SIREN (selective entropy regularisation, 2509.25133).

docs/algorithms.md §5. The entropy regulariser is restricted twice: (1) a top-p mask, the entropy
is that of the re-normalised nucleus (``vocab_stats.topp_entropy``), so the tail does not drive it;
(2) a peak-entropy mask, only the ``peak_frac`` of valid tokens of highest entropy count. It is
self-anchored: the first step's masked entropy is kept as the anchor ``H_0`` and the loss gains
``coef * (mean_peak(H_p) - H_0)^2``, which pulls the regulated entropy back to where the run
started instead of pushing it up without bound. The top-p mask is per token (its nucleus is the
token's own distribution); the peak-entropy mask ranks tokens against the others of the batch, so
it has a ``scope``: micro (each micro-batch, the current entropy: our default) or mini / batch /
global (selected before the update from the sampling entropy; global: over all ranks' mini-batch,
the same tokens on 1 or N ranks). No public code was available here: implemented
from the paper's description; conf/intervention/siren.yaml marks our numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.core_algos import select_top_fraction
from .base import Intervention, LossContext, TokenBatch, register_intervention

KEY = "siren/topp_entropy"


@register_intervention("siren")
class Siren(Intervention):
    needs_entropy_grad = False

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/siren.yaml."""
        top_p: float  # nucleus of the top-p mask
        peak_frac: float  # fraction of valid tokens (highest entropy) the regulariser sees
        coef: float  # weight of the anchored term
        scope: str  # where the peak-entropy mask is taken: micro | mini | batch | global

        def validate(self, name: str) -> None:
            if not 0 < self.top_p <= 1 or not 0 < self.peak_frac <= 1 or self.coef < 0:
                raise UserError(f"algo.{name}: need 0 < top_p <= 1, 0 < peak_frac <= 1, coef >= 0")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.anchor: float | None = None

    def vocab_stats(self) -> dict:
        return {KEY: ("topp_entropy", {"p": float(self.params.top_p)})}

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        """The peak-entropy mask of a wider scope (``[b, T]`` bool) from the sampling entropy."""
        return {"siren/peak": select_top_fraction(batch.entropy, batch.mask.bool(), self.params.peak_frac)}

    def apply(self, ctx: LossContext) -> None:
        h = ctx.extras.get(KEY)
        if h is None:
            raise RuntimeError(f"siren: extras['{KEY}'] missing; compute Algorithm.vocab_stats() in the loss loop")
        if self.scope == "micro":
            peak = select_top_fraction(ctx.entropy.detach(), ctx.mask.bool(), self.params.peak_frac)
        else:
            peak = self.selection(ctx)["siren/peak"].bool() & ctx.mask.bool()
        m = peak.to(h.dtype)
        regulated = (torch.where(peak, h, torch.zeros_like(h)) * m).sum() / m.sum().clamp(min=1.0)
        if self.anchor is None:
            self.anchor = float(regulated.detach().item())
        ctx.extra_terms["siren"] = self.params.coef * (regulated - self.anchor) ** 2
        ctx.metrics["siren/anchor"] = self.anchor
        ctx.metrics["siren/regulated_entropy"] = float(regulated.detach().item())
        ctx.metrics["siren/peak_frac"] = float(m.sum().item()) / max(float(ctx.mask.sum().item()), 1.0)

    def step_metrics(self) -> dict[str, float]:
        return {} if self.anchor is None else {"siren/anchor": self.anchor}

    def state_dict(self) -> dict:
        return {"anchor": self.anchor}

    def load_state_dict(self, state: dict) -> None:
        self.anchor = None if state.get("anchor") is None else float(state["anchor"])
