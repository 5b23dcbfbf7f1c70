"""What a method's paper says about entropy, declared beside the method, in the form the lab measures.

An intervention carries its ``lab_claim`` as a class attribute; an objective passes it to
``register_objective``. The lab (``sweeps/lab/method_claims.py``) reads every registered method's
claim from the registries, so a new method with a claim appears in the lab's table without touching
the lab, and the lab names a method's logged levers when its claim does not reproduce.

    lab_claim = LabClaim(
        "above_grpo",
        "Lp-Reg protects low-probability tokens: entropy ends above GRPO",
        levers=(Lever("lp_reg/frac", "protected tokens", "frac"),),
        added_term="loss/lp_reg",
    )
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LabClaim", "Lever", "CLAIM_KINDS", "LEVER_KINDS"]

#: above_grpo: the last tenth of its entropy curve ends above GRPO's, seed by seed.
#: holds_target: its controller holds entropy near its ``target`` parameter (last third within 30 %).
#: none: the paper claims nothing about an entropy level the lab can measure (``text`` says why).
CLAIM_KINDS = ("above_grpo", "holds_target", "none")
#: frac: a share of tokens it selects (a mean below 0.1 % means it selected nothing); value: a coefficient or weight.
LEVER_KINDS = ("frac", "value")


@dataclass(frozen=True)
class Lever:
    """A logged metric through which the method acts, named in the lab's report when its claim fails."""

    metric: str  # the logged metric, e.g. "lp_reg/frac"
    what: str  # what it is, in words
    kind: str = "value"  # one of LEVER_KINDS
    final: bool = False  # a controller's state: the report also gives where it ended

    def __post_init__(self):
        if self.kind not in LEVER_KINDS:
            raise ValueError(f"Lever.kind must be one of {LEVER_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class LabClaim:
    """The method's entropy claim (``kind``, one of ``CLAIM_KINDS``) and ``text``: the claim in the
    lab's words, or for ``none`` why there is none. ``levers``: the metrics it acts through;
    ``added_term``: the loss term it adds (``loss/<name>``), reported when it is under 1 % of the
    policy loss."""

    kind: str
    text: str
    levers: tuple[Lever, ...] = ()
    added_term: str | None = None

    def __post_init__(self):
        if self.kind not in CLAIM_KINDS:
            raise ValueError(f"LabClaim.kind must be one of {CLAIM_KINDS}, got {self.kind!r}")
