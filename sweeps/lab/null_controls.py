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

``evaluate(entry, inputs)`` runs the claim's study on the inputs and returns the claim.
``tests/sweeps/test_claim_nulls.py`` asserts, for every entry, that the null gives ``reproduced`` False
and the positive True, and that every claim id a study emits has an entry, so a new claim cannot skip
its null. Descriptive rows (``descriptive``: no direction claimed) and methods without an entropy claim
are declared too, and must stay unreproduced (None) on both.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

from .claims import compute_claims
from .method_claims import _acted_key, _target, method_claims, registered_lab_claims
from .real_model_claims import EXTRA_METHODS, METHODS, real_model_claims
from .staleness_claims import STALE_QUARTER_KEYS, staleness_claims
from .tool_claims import tool_claims

__all__ = ["NullControl", "registry", "evaluate", "declare_nulls", "emitted_ids", "STUDIES"]

STUDIES = ("lab", "method", "tool", "staleness", "real_model")
N = 60  # steps of a synthetic run
SEEDS = (0, 1)
LAB_H = 0.5  # h_tgt of the synthetic lab and staleness STARE runs
TOOL_H = 0.08  # the tool preset's h_tgt: its warm start (about 0.098 nats) sits inside the +/-30 % band
REAL_H = 0.5  # the real-model study's h_tgt (conf/ablation/real_model.yaml)


@dataclass(frozen=True)
class NullControl:
    """One claim id's null control (``null``, in words) and the builders of its null and positive inputs."""

    claim_id: str
    study: str  # one of STUDIES
    null: str
    build_null: Callable[[], dict]
    build_positive: Callable[[], dict]
    descriptive: bool = False  # claims no direction (a descriptive row, a method without a claim): always None


# -- synthetic rows ---------------------------------------------------------------------------------
def _rows(entropy: Callable[[int], float], n: int = N, **extra) -> list[dict]:
    """``n`` metric rows: ``entropy(i)`` and each ``extra`` key (``a__b`` is ``a/b``), a value or ``f(i)``."""
    return [
        {"step": i + 1, "entropy": entropy(i), **{k.replace("__", "/"): (v(i) if callable(v) else v) for k, v in extra.items()}}
        for i in range(n)
    ]


def _seeds(make: Callable[[], list[dict]]) -> dict[int, list[dict]]:
    return {s: make() for s in SEEDS}


def _same(by_seed: dict) -> dict:
    """A copy of another variant's rows: the method did nothing but run under its own name."""
    return copy.deepcopy(by_seed)


def _decay(rate: float, start: float = 1.0) -> Callable[[int], float]:
    return lambda i: start * math.exp(-rate * i)


def _flat(level: float) -> Callable[[int], float]:
    return lambda i: level


def _to_target(h: float) -> Callable[[int], float]:
    """Falls from 2h to h over 20 steps, then holds at h +/- 5 %."""
    return lambda i: max(h * (1.0 + 0.05 * (-1) ** i), 2.0 * h * (1.0 - i / 20.0))


def _stare(h: float) -> list[dict]:
    """STARE that works: entropy reaches h_tgt and holds there, its gate open exactly below it."""
    e = _to_target(h)
    return _rows(e, **{"stare/gate_on": lambda i: float(e(i) < h)})


def _stare_idle(h: float) -> list[dict]:
    """STARE's null: entropy flat at its start inside the band (10 % above h_tgt), the gate never open."""
    return _rows(_flat(1.1 * h), **{"stare/gate_on": 0.0})


def _alternating(amplitude: float, key: str = "entropy_change/realized") -> dict:
    return {key: lambda i: -0.01 + amplitude * (-1) ** i}


def _inputs(runs: dict, h_tgt: float = LAB_H, quadrants: dict | None = None) -> dict:
    return {"runs": runs, "h_tgt": h_tgt, "quadrants": quadrants}


def _grpo() -> dict:
    return _seeds(lambda: _rows(_decay(0.05), **{"val/pass_at_8": 0.4}))


def _keeps(variants: tuple[str, ...], null: bool) -> dict:
    grpo = _grpo()
    return _inputs({"grpo": grpo, **{v: _same(grpo) if null else _seeds(lambda: _rows(_decay(0.01))) for v in variants}})


def _spread(variant: str, null: bool, wider: bool) -> dict:
    """GRPO's per-step change spread 0.03; ``variant``'s 0.01 (``wider`` False) or 0.09, or GRPO's own."""
    grpo = _seeds(lambda: _rows(_decay(0.05), **_alternating(0.03)))
    own = _seeds(lambda: _rows(_decay(0.05), **_alternating(0.09 if wider else 0.01)))
    return _inputs({"grpo": grpo, variant: _same(grpo) if null else own})


# -- the lab's claims ----------------------------------------------------------------------------------
def _lab() -> list[NullControl]:
    stare_null = "STARE's entropy flat at its start inside the band of h_tgt, its gate never open"
    theory = {"q1": [-1e-3, -2e-3], "q2": [1e-3, 5e-4], "q3": [-3e-3, -1e-3], "q4": [2e-4, 1e-4]}
    zero = {q: [0.0, 0.0] for q in theory}
    extreme = lambda null: _inputs(  # noqa: E731
        (lambda g: {"grpo_extreme": g, "steer_extreme": _same(g) if null else _seeds(lambda: _rows(lambda i: 1.0 - 0.002 * i))})(
            _seeds(lambda: _rows(_decay(0.1)))
        )
    )
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
            stare_null,
            lambda: _inputs({"stare": _seeds(lambda: _stare_idle(LAB_H))}),
            lambda: _inputs({"stare": _seeds(lambda: _stare(LAB_H))}),
        ),
        NullControl(
            "stare_gate_follows_entropy",
            "lab",
            stare_null + " (it matches H < h_tgt on every step without ever deciding)",
            lambda: _inputs({"stare": _seeds(lambda: _stare_idle(LAB_H))}),
            lambda: _inputs({"stare": _seeds(lambda: _stare(LAB_H))}),
        ),
        NullControl(
            "quadrant_signs",
            "lab",
            "every quadrant's restricted update changes entropy by 0",
            lambda: _inputs({}, quadrants={s: copy.deepcopy(zero) for s in SEEDS}),
            lambda: _inputs({}, quadrants={s: copy.deepcopy(theory) for s in SEEDS}),
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
            lambda: extreme(True),
            lambda: extreme(False),
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
            lambda: (lambda g: _inputs({"grpo": g, "stare": _same(g), "steer": _same(g)}))(_grpo()),
            lambda: _inputs({"grpo": _grpo(), "stare": _seeds(lambda: _rows(_decay(0.05), **{"val/pass_at_8": 0.6}))}),
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
def _tool() -> list[NullControl]:
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
def _stale_quarters(k: int, null: bool) -> dict:
    """The stale ratio's clipped share per entropy quartile at staleness ``k``: 0 at k = 0 (and in the
    null at every k), else rising with k and with the quartile."""
    return {key: 0.0 if null or k == 0 else 0.005 * k * (q + 1) for q, key in enumerate(STALE_QUARTER_KEYS)}


def _staleness() -> list[NullControl]:
    def collapse(null: bool) -> dict:
        k0 = _seeds(lambda: _rows(_decay(0.002)))
        return _inputs({"grpo_k0": k0, "grpo_k4": _same(k0) if null else _seeds(lambda: _rows(_decay(0.05)))})

    def quarters(null: bool) -> dict:
        return _inputs({f"grpo_k{k}": _seeds(lambda k=k: _rows(_decay(0.02), **_stale_quarters(k, null))) for k in (0, 1, 2, 4)})

    def band(variants: tuple[str, ...], null: bool) -> dict:
        return _inputs({v: _seeds(lambda: _stare_idle(LAB_H) if null else _stare(LAB_H)) for v in variants})

    def corrections(null: bool) -> dict:
        base = _seeds(lambda: _rows(_decay(0.02), **{"clip/frac": 0.02, "async/stale_clip_frac": 0.05}))
        fixed = lambda: _seeds(  # noqa: E731
            lambda: _rows(
                _decay(0.01),
                **{
                    "clip/frac": 0.01,
                    "async/stale_clip_frac": 0.05,
                    "rollout/tis_weight_mean": 0.97,
                    "rollout/tis_clip_frac": 0.01,
                },
            )
        )
        return _inputs({"grpo_k2": base, **{f"grpo_k2_{c}": _same(base) if null else fixed() for c in ("dec", "m2po")}})

    def vs_grpo(method: str, null: bool) -> dict:
        runs = {}
        for k in (0, 2):
            grpo = _seeds(lambda: _rows(_decay(0.05), **_alternating(0.03)))
            own = _seeds(lambda: _rows(_decay(0.01), **_alternating(0.01)))
            runs[f"grpo_k{k}"], runs[f"{method}_k{k}"] = grpo, _same(grpo) if null else own
        return _inputs(runs)

    stare_null = "STARE's entropy flat at its start inside the band of h_tgt, its gate never open"
    return [
        NullControl(
            "stale_grpo_collapses",
            "staleness",
            "staleness that changed nothing: the k=0 run's rows at k=4",
            lambda: collapse(True),
            lambda: collapse(False),
        ),
        NullControl(
            "stale_clips_high_entropy_first",
            "staleness",
            "staleness that changed nothing: the stale ratio inside the clip range (async/stale_clip_frac 0) at every k",
            lambda: quarters(True),
            lambda: quarters(False),
        ),
        NullControl(
            "stare_band_by_k",
            "staleness",
            stare_null + " at every k",
            lambda: band(("stare_k0", "stare_k2", "stare_k4"), True),
            lambda: band(("stare_k0", "stare_k2", "stare_k4"), False),
        ),
        NullControl(
            "stare_k2_dec_holds_band",
            "staleness",
            stare_null,
            lambda: band(("stare_k2_dec",), True),
            lambda: band(("stare_k2_dec",), False),
        ),
        NullControl(
            "stare_k2_behav_holds_band",
            "staleness",
            stare_null,
            lambda: band(("stare_k2_behav",), True),
            lambda: band(("stare_k2_behav",), False),
        ),
        NullControl(
            "corrections_lower_clipping",
            "staleness",
            "GRPO's k=2 rows under the decoupled and M2PO runs' names (no weight, no mask, the same clip/frac)",
            lambda: corrections(True),
            lambda: corrections(False),
        ),
        NullControl(
            "clip_cov_keeps_entropy_stale",
            "staleness",
            "GRPO's rows under Clip-Cov's name at each k",
            lambda: vs_grpo("clip_cov", True),
            lambda: vs_grpo("clip_cov", False),
        ),
        NullControl(
            "steer_moderates_change_stale",
            "staleness",
            "GRPO's rows under STEER's name at each k",
            lambda: vs_grpo("steer", True),
            lambda: vs_grpo("steer", False),
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
def _attribution_rows(predicted: Callable[[float], float]) -> list[dict]:
    """GRPO's decaying rows with the attribution measured every 10th step: a realised probe change of
    about -0.01 (-0.008 and -0.012 in turn) and ``predicted(realised)`` as the prediction."""
    rows = _rows(_decay(0.05))
    for i, r in enumerate(rows):
        if (i + 1) % 10 == 0 or i == 0:
            realised = -0.01 + 0.002 * (-1) ** i
            r["entropy_change/realized"], r["entropy_change/predicted_net"] = realised, predicted(realised)
    return rows


def _real_model() -> list[NullControl]:
    def inputs(runs: dict) -> dict:
        return _inputs(runs, REAL_H)

    def above(method: str, null: bool) -> dict:
        grpo = _grpo()
        return inputs({"grpo": grpo, method: _same(grpo) if null else _seeds(lambda: _rows(_decay(0.01)))})

    def acc(null: bool) -> dict:
        grpo = _seeds(lambda: _rows(_decay(0.05), **{"val/acc": 0.5, "val/pass_at_4": 0.7}))
        own = _seeds(lambda: _rows(_decay(0.01), **{"val/acc": 0.4, "val/pass_at_4": 0.7}))
        return inputs({"grpo": grpo, "stare": _same(grpo) if null else own})

    text = {"repetition/score/mean": lambda i: 0.1 + 0.005 * i, "reflection/density": 2.0, "response_length/mean": 40.0}
    return [
        NullControl(
            "real_model_grpo_collapses",
            "real_model",
            "GRPO's entropy flat at its start",
            lambda: inputs({"grpo": _seeds(lambda: _rows(_flat(0.8)))}),
            lambda: inputs({"grpo": _grpo()}),
        ),
        NullControl(
            "real_model_stare_holds_target",
            "real_model",
            "GRPO's rows under STARE's name, its gate never open",
            lambda: inputs({"stare": _seeds(lambda: _rows(_decay(0.05), **{"stare/gate_on": 0.0}))}),
            lambda: inputs({"stare": _seeds(lambda: _stare(REAL_H))}),
        ),
        *[
            NullControl(
                f"real_model_{m}_above_grpo",
                "real_model",
                f"GRPO's rows under {m}'s name",
                lambda m=m: above(m, True),
                lambda m=m: above(m, False),
            )
            for m in (*METHODS, *EXTRA_METHODS)
        ],
        NullControl(
            "real_model_attribution_tracks",
            "real_model",
            "a prediction that says nothing: entropy_change/predicted_net 0 on every measured step",
            lambda: inputs({"grpo": _seeds(lambda: _attribution_rows(lambda q: 0.0))}),
            lambda: inputs({"grpo": _seeds(lambda: _attribution_rows(lambda q: 0.9 * q))}),
        ),
        NullControl(
            "real_model_accuracy",
            "real_model",
            "none: descriptive, no direction claimed",
            lambda: acc(True),
            lambda: acc(False),
            descriptive=True,
        ),
        NullControl(
            "real_model_text",
            "real_model",
            "none: descriptive, no direction claimed",
            lambda: inputs({"grpo": _seeds(lambda: _rows(_flat(0.8), **text))}),
            lambda: inputs({"grpo": _seeds(lambda: _rows(_decay(0.05), **text))}),
            descriptive=True,
        ),
    ]


def registry() -> dict[str, NullControl]:
    """``claim id -> NullControl`` of every study's claims (the methods' from the registries, so a new
    method with a claim is here without an edit)."""
    return {e.claim_id: e for e in (*_lab(), *_methods(), *_tool(), *_staleness(), *_real_model())}


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
    """The claim ``entry.claim_id`` as its study computes it on ``inputs``."""
    return next(c for c in _study_claims(entry.study, inputs) if c["id"] == entry.claim_id)


def emitted_ids() -> dict[str, set[str]]:
    """Per study, every claim id it emits: the lab, tool and staleness studies emit all of theirs on no
    runs; the methods' ids need a run of each registered method; the real-model study's extra methods'
    ids need their runs."""
    one = {0: [{"step": 1, "entropy": 1.0}]}
    return {
        "lab": {c["id"] for c in compute_claims({}, h_tgt=LAB_H)},
        "method": {c["id"] for c in method_claims({"grpo": one, **{v: one for v in registered_lab_claims()}})},
        "tool": {c["id"] for c in tool_claims({}, h_tgt=TOOL_H)},
        "staleness": {c["id"] for c in staleness_claims({}, h_tgt=LAB_H)},
        "real_model": {c["id"] for c in real_model_claims({"grpo": one, **{m: one for m in EXTRA_METHODS}}, h_tgt=REAL_H)},
    }


def declare_nulls(claims: list[dict]) -> list[dict]:
    """``claims`` with each one's null control in words (``null_control``) where the registry has it."""
    entries = registry()
    for c in claims:
        if c["id"] in entries and not entries[c["id"]].descriptive:
            c["null_control"] = entries[c["id"]].null
    return claims
