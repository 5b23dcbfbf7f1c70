"""Every claim of every study with its null control and a synthetic positive.

A claim that a run in which the method did nothing also passes is not a claim. Each claim id the lab
(``claims.compute_claims``), the registered methods (``method_claims.method_claims``), the tool study
(``tool_claims.tool_claims``), the staleness study (``staleness_claims.staleness_claims``) and the
real-model study (``real_model_claims.real_model_claims``) can emit is declared here with

- ``null``: the null control in words, shown beside the claim in ``report.md`` and ``lab.json``
  (``declare_nulls``): the rows of a run in which the method did nothing (entropy flat at its start,
  GRPO's rows under the method's name, a gate that never opened, staleness that changed nothing);
- ``build_null`` and ``build_positive``: the study's inputs (``{"runs", "h_tgt", "quadrants"}``) made of
  synthetic metric rows of that null run, and of a run that shows the effect.

Each study declares where its entries come from: ``Study.null_controls`` in ``sweeps/studies.py``,
a "module:function" returning its ``NullControl`` list (the four studies here point to ``lab_nulls``,
``tool_nulls``, ``staleness_nulls`` and ``real_model_nulls``). ``registry()`` gathers them from every
registered study, so a study declared from outside the package (a plugin) has its claims checked too;
its entries carry their study's claims function (``claims``), since ``_study_claims`` knows only the
package's studies.

``evaluate(entry, inputs)`` runs the claim's study on the inputs and returns the claim.
``tests/sweeps/test_claim_nulls.py`` asserts, for every entry, that the null gives ``reproduced`` False
and the positive True, and that every claim id a study emits has an entry, so a new claim cannot skip
its null. Descriptive rows (``descriptive``: no direction claimed) and methods without an entropy claim
are declared too, and must stay unreproduced (None) on both. The synthetic rows and each study's
inputs are built in ``null_inputs.py``.
"""

# size: one table of every in-package claim's null control and positive, a list per study; the code that gathers and evaluates them is short
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..studies import STUDIES as DECLARED_STUDIES
from .claims import compute_claims
from .method_claims import _acted_key, _target, method_claims, registered_lab_claims
from .null_inputs import (
    LAB_H,
    REAL_H,
    TOOL_H,
    _attribution_rows,
    _decay,
    _extreme,
    _flat,
    _grpo,
    _inputs,
    _keeps,
    _pass_at_k,
    _quadrant_inputs,
    _real_above,
    _real_acc,
    _real_inputs,
    _rows,
    _seeds,
    _spread,
    _stale_collapse,
    _stale_corrections,
    _stale_quarter_inputs,
    _stale_vs_grpo,
    _stare,
    _stare_band,
    _stare_idle,
    _to_target,
)
from .real_model_claims import EXTRA_METHODS, METHODS, SCHEDULE_CONTROLS, real_model_claims
from .staleness_claims import staleness_claims
from .tool_claims import tool_claims

__all__ = [
    "NullControl",
    "registry",
    "evaluate",
    "declare_nulls",
    "emitted_ids",
    "STUDIES",
    "lab_nulls",
    "tool_nulls",
    "staleness_nulls",
    "real_model_nulls",
]

STUDIES = ("lab", "method", "tool", "staleness", "real_model")  # the package's claim sets, as _study_claims knows them
STARE_NULL = "STARE's entropy flat at its start inside the band of h_tgt, its gate never open"


@dataclass(frozen=True)
class NullControl:
    """One claim id's null control (``null``, in words) and the builders of its null and positive inputs."""

    claim_id: str
    study: str  # one of STUDIES, or the name of a study declared outside the package
    null: str
    build_null: Callable[[], dict]
    build_positive: Callable[[], dict]
    descriptive: bool = False  # claims no direction (a descriptive row, a method without a claim): always None
    claims: Callable[[dict], list[dict]] | None = None  # the study's claims on inputs; None: _study_claims's


# -- the lab's claims ----------------------------------------------------------------------------------
def _lab() -> list[NullControl]:
    return [
        NullControl(
            "grpo_collapses",
            "lab",
            "GRPO's entropy flat at its start",
            lambda: _inputs({"grpo": _seeds(lambda: _rows(_flat(1.0)))}),
            lambda: _inputs({"grpo": _grpo()}),
        ),
        NullControl(
            "stare_holds_target",
            "lab",
            STARE_NULL,
            lambda: _inputs({"stare": _seeds(lambda: _stare_idle(LAB_H))}),
            lambda: _inputs({"stare": _seeds(lambda: _stare(LAB_H))}),
        ),
        NullControl(
            "stare_gate_follows_entropy",
            "lab",
            STARE_NULL + " (it matches H < h_tgt on every step without ever deciding)",
            lambda: _inputs({"stare": _seeds(lambda: _stare_idle(LAB_H))}),
            lambda: _inputs({"stare": _seeds(lambda: _stare(LAB_H))}),
        ),
        NullControl(
            "quadrant_signs",
            "lab",
            "every quadrant's restricted update changes entropy by 0",
            lambda: _quadrant_inputs(True),
            lambda: _quadrant_inputs(False),
        ),
        NullControl(
            "steer_moderates_change",
            "lab",
            "GRPO's rows under STEER's name",
            lambda: _spread("steer", True, False),
            lambda: _spread("steer", False, False),
        ),
        NullControl(
            "steer_extreme_stable",
            "lab",
            "GRPO's stress-test rows under STEER's name",
            lambda: _extreme(True),
            lambda: _extreme(False),
        ),
        NullControl(
            "cov_keeps_entropy",
            "lab",
            "GRPO's rows under Clip-Cov's and KL-Cov's names",
            lambda: _keeps(("clip_cov", "kl_cov"), True),
            lambda: _keeps(("clip_cov", "kl_cov"), False),
        ),
        NullControl(
            "negative_samples_keep_entropy",
            "lab",
            "GRPO's rows under the sample-reweighting run's name",
            lambda: _keeps(("sample_reweight",), True),
            lambda: _keeps(("sample_reweight",), False),
        ),
        NullControl(
            "high_entropy_amplification_fluctuates",
            "lab",
            "GRPO's rows under the high-entropy mask's name",
            lambda: _spread("high_entropy_mask", True, True),
            lambda: _spread("high_entropy_mask", False, True),
        ),
        NullControl(
            "pass_at_k_preserved",
            "lab",
            "GRPO's rows under every intervention's name",
            lambda: _pass_at_k(True),
            lambda: _pass_at_k(False),
        ),
    ]


# -- the registered methods' claims (one entry per registered method, by its claim's kind) --------------
def _methods() -> list[NullControl]:
    out = []
    for v, claim in registered_lab_claims().items():
        if claim.kind == "above_grpo":
            out.append(
                NullControl(
                    f"{v}_keeps_entropy",
                    "method",
                    f"GRPO's rows under {v}'s name",
                    lambda v=v: _keeps((v,), True),
                    lambda v=v: _keeps((v,), False),
                )
            )
        elif claim.kind == "holds_target":
            target, key = _target(v, {}), _acted_key(v)
            out.append(
                NullControl(
                    f"{v}_holds_target",
                    "method",
                    f"{v}'s entropy flat at its start inside the band of its target, {key} 0 on every step",
                    lambda v=v, t=target, k=key: _inputs({v: _seeds(lambda: _rows(_flat(1.1 * t), **{k: 0.0}))}),
                    lambda v=v, t=target, k=key: _inputs(
                        {v: _seeds(lambda: _rows(_to_target(t), **{k: lambda i: _to_target(t)(i) - t}))}
                    ),
                )
            )
        else:
            out.append(
                NullControl(
                    f"{v}_no_claim",
                    "method",
                    f"none: {v} states no entropy claim the lab can measure",
                    lambda v=v: _keeps((v,), True),
                    lambda v=v: _keeps((v,), False),
                    descriptive=True,
                )
            )
    return out


# -- the tool study -----------------------------------------------------------------------------------------
def tool_nulls() -> list[NullControl]:
    kinds = {"entropy/kind/text": 0.5, "entropy/kind/code": 0.3}
    return [
        NullControl(
            "tool_grpo_collapses",
            "tool",
            "GRPO's entropy flat at its start",
            lambda: _inputs({"grpo": _seeds(lambda: _rows(_flat(0.3)))}, TOOL_H),
            lambda: _inputs({"grpo": _seeds(lambda: _rows(_decay(0.05, 0.3)))}, TOOL_H),
        ),
        NullControl(
            "tool_stare_holds_target",
            "tool",
            f"STARE's entropy flat at the warm start's 0.098 nats (inside +/-30 % of h_tgt={TOOL_H}), its gate never open",
            lambda: _inputs({"stare": _seeds(lambda: _rows(_flat(0.098), **{"stare/gate_on": 0.0}))}, TOOL_H),
            lambda: _inputs({"stare": _seeds(lambda: _stare(TOOL_H))}, TOOL_H),
        ),
        NullControl(
            "tool_entropy_by_kind",
            "tool",
            "none: descriptive, no direction claimed",
            lambda: _inputs({"grpo": _seeds(lambda: _rows(_flat(0.3), **kinds))}, TOOL_H),
            lambda: _inputs({"grpo": _seeds(lambda: _rows(_decay(0.05, 0.3), **kinds))}, TOOL_H),
            descriptive=True,
        ),
    ]


# -- the staleness study --------------------------------------------------------------------------------
def staleness_nulls() -> list[NullControl]:
    return [
        NullControl(
            "stale_grpo_collapses",
            "staleness",
            "staleness that changed nothing: the k=0 run's rows at k=4",
            lambda: _stale_collapse(True),
            lambda: _stale_collapse(False),
        ),
        NullControl(
            "stale_clips_high_entropy_first",
            "staleness",
            "staleness that changed nothing: the stale ratio inside the clip range (async/stale_clip_frac 0) at every k",
            lambda: _stale_quarter_inputs(True),
            lambda: _stale_quarter_inputs(False),
        ),
        NullControl(
            "stare_band_by_k",
            "staleness",
            STARE_NULL + " at every k",
            lambda: _stare_band(("stare_k0", "stare_k2", "stare_k4"), True),
            lambda: _stare_band(("stare_k0", "stare_k2", "stare_k4"), False),
        ),
        NullControl(
            "stare_k2_dec_holds_band",
            "staleness",
            STARE_NULL,
            lambda: _stare_band(("stare_k2_dec",), True),
            lambda: _stare_band(("stare_k2_dec",), False),
        ),
        NullControl(
            "stare_k2_behav_holds_band",
            "staleness",
            STARE_NULL,
            lambda: _stare_band(("stare_k2_behav",), True),
            lambda: _stare_band(("stare_k2_behav",), False),
        ),
        NullControl(
            "corrections_lower_clipping",
            "staleness",
            "GRPO's k=2 rows under the decoupled and M2PO runs' names (no weight, no mask, the same clip/frac)",
            lambda: _stale_corrections(True),
            lambda: _stale_corrections(False),
        ),
        NullControl(
            "clip_cov_keeps_entropy_stale",
            "staleness",
            "GRPO's rows under Clip-Cov's name at each k",
            lambda: _stale_vs_grpo("clip_cov", True),
            lambda: _stale_vs_grpo("clip_cov", False),
        ),
        NullControl(
            "steer_moderates_change_stale",
            "staleness",
            "GRPO's rows under STEER's name at each k",
            lambda: _stale_vs_grpo("steer", True),
            lambda: _stale_vs_grpo("steer", False),
        ),
        NullControl(
            "stale_pass_at_k",
            "staleness",
            "none: descriptive, no direction claimed",
            lambda: _inputs({"grpo_k0": _seeds(lambda: _rows(_flat(1.0), **{"val/pass_at_8": 0.4}))}),
            lambda: _inputs({"grpo_k0": _seeds(lambda: _rows(_decay(0.05), **{"val/pass_at_8": 0.6}))}),
            descriptive=True,
        ),
    ]


# -- the real-model study ---------------------------------------------------------------------------
def real_model_nulls() -> list[NullControl]:
    text = {"repetition/score/mean": lambda i: 0.1 + 0.005 * i, "reflection/density": 2.0, "response_length/mean": 40.0}
    return [
        NullControl(
            "real_model_grpo_collapses",
            "real_model",
            "GRPO's entropy flat at its start",
            lambda: _real_inputs({"grpo": _seeds(lambda: _rows(_flat(0.8)))}),
            lambda: _real_inputs({"grpo": _grpo()}),
        ),
        NullControl(
            "real_model_stare_holds_target",
            "real_model",
            "GRPO's rows under STARE's name, its gate never open",
            lambda: _real_inputs({"stare": _seeds(lambda: _rows(_decay(0.05), **{"stare/gate_on": 0.0}))}),
            lambda: _real_inputs({"stare": _seeds(lambda: _stare(REAL_H))}),
        ),
        *[
            NullControl(
                f"real_model_{m}_above_grpo",
                "real_model",
                f"GRPO's rows under {m}'s name",
                lambda m=m: _real_above(m, True),
                lambda m=m: _real_above(m, False),
            )
            for m in (*METHODS, *EXTRA_METHODS)
        ],
        *[
            NullControl(
                f"real_model_{m}_above_its_schedule",
                "real_model",
                f"{c}'s rows under {m}'s name",
                lambda m=m, c=c: _real_above(m, True, baseline=c),
                lambda m=m, c=c: _real_above(m, False, baseline=c),
            )
            for m, c in SCHEDULE_CONTROLS.items()
        ],
        NullControl(
            "real_model_attribution_tracks",
            "real_model",
            "a prediction that says nothing: entropy_change/predicted_net 0 on every measured step",
            lambda: _real_inputs({"grpo": _seeds(lambda: _attribution_rows(lambda q: 0.0))}),
            lambda: _real_inputs({"grpo": _seeds(lambda: _attribution_rows(lambda q: 0.9 * q))}),
        ),
        NullControl(
            "real_model_accuracy",
            "real_model",
            "none: descriptive, no direction claimed",
            lambda: _real_acc(True),
            lambda: _real_acc(False),
            descriptive=True,
        ),
        NullControl(
            "real_model_text",
            "real_model",
            "none: descriptive, no direction claimed",
            lambda: _real_inputs({"grpo": _seeds(lambda: _rows(_flat(0.8), **text))}),
            lambda: _real_inputs({"grpo": _seeds(lambda: _rows(_decay(0.05), **text))}),
            descriptive=True,
        ),
    ]


# -- each study's entries, as its Study.null_controls names them ---------------------------------------
def lab_nulls() -> list[NullControl]:
    """The lab study's entries: the lab's claims and the registered methods' (its report computes both)."""
    return [*_lab(), *_methods()]


def _declared(at: str) -> list[NullControl]:
    module, _, function = at.partition(":")
    return list(getattr(importlib.import_module(module), function)())


def registry() -> dict[str, NullControl]:
    """``claim id -> NullControl`` of every registered study's claims (``sweeps/studies.py``'s ``STUDIES``,
    each from its ``Study.null_controls``; the methods' from the registries, so a new method with a claim
    is here without an edit). A claim id two studies declare is refused: one of them would go unchecked."""
    entries: dict[str, NullControl] = {}
    for study in DECLARED_STUDIES.values():
        for e in _declared(study.null_controls) if study.null_controls else []:
            if e.claim_id in entries:
                raise ValueError(f"study {study.name}: claim {e.claim_id} already has a null control")
            entries[e.claim_id] = e
    return entries


def _study_claims(study: str, inputs: dict) -> list[dict]:
    runs, h_tgt = inputs["runs"], inputs["h_tgt"]
    if study == "lab":
        return compute_claims(runs, h_tgt=h_tgt, quadrants=inputs.get("quadrants"))
    if study == "method":
        return method_claims(runs)
    if study == "tool":
        return tool_claims(runs, h_tgt=h_tgt)
    if study == "real_model":
        return real_model_claims(runs, h_tgt=h_tgt)
    return staleness_claims(runs, h_tgt=h_tgt)


def evaluate(entry: NullControl, inputs: dict) -> dict:
    """The claim ``entry.claim_id`` as its study computes it on ``inputs`` (``entry.claims`` when the
    entry carries its study's claims function)."""
    claims = entry.claims(inputs) if entry.claims else _study_claims(entry.study, inputs)
    return next(c for c in claims if c["id"] == entry.claim_id)


def emitted_ids() -> dict[str, set[str]]:
    """Per claim set of the package (``STUDIES``), every claim id it emits: the lab, tool and staleness
    studies emit all of theirs on no runs; the methods' ids need a run of each registered method; the
    real-model study's extra methods' and schedule controls' ids need their runs."""
    one = {0: [{"step": 1, "entropy": 1.0}]}
    return {
        "lab": {c["id"] for c in compute_claims({}, h_tgt=LAB_H)},
        "method": {c["id"] for c in method_claims({"grpo": one, **{v: one for v in registered_lab_claims()}})},
        "tool": {c["id"] for c in tool_claims({}, h_tgt=TOOL_H)},
        "staleness": {c["id"] for c in staleness_claims({}, h_tgt=LAB_H)},
        "real_model": {
            c["id"]
            for c in real_model_claims(
                {"grpo": one, **{m: one for m in EXTRA_METHODS}, **{c: one for c in SCHEDULE_CONTROLS.values()}}, h_tgt=REAL_H
            )
        },
    }


def declare_nulls(claims: list[dict]) -> list[dict]:
    """``claims`` with each one's null control in words (``null_control``) where the registry has it."""
    entries = registry()
    for c in claims:
        if c["id"] in entries and not entries[c["id"]].descriptive:
            c["null_control"] = entries[c["id"]].null
    return claims
