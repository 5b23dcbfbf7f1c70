"""``none``: no intervention (omega = 1). Listing it is the same as an empty list; it exists so a
sweep axis can name the baseline explicitly (``algo.interventions=[none]``)."""

from __future__ import annotations

from .base import Intervention, LossContext, register_intervention


@register_intervention("none")
class NoIntervention(Intervention):
    """Leaves the loss untouched, so the result is plain GRPO/DAPO bit for bit."""

    def apply(self, ctx: LossContext) -> None:
        return None
