"""The synthetic runs the claims' null controls and positives are made of (``null_controls.py``):
metric rows of ``N`` steps per seed of ``SEEDS`` (``_rows``: an entropy curve and any other keys), the
curves (decaying, flat, falling to a target and holding it), STARE that works and STARE that sat idle,
GRPO's rows under another method's name (``_same``), and each study's inputs ``{"runs", "h_tgt",
"quadrants"}`` built from them for a null (``null=True``) or a positive.
"""

from __future__ import annotations

import copy
import math
from typing import Callable

from .staleness_claims import STALE_QUARTER_KEYS

N = 60  # steps of a synthetic run
SEEDS = (0, 1)
LAB_H = 0.5  # h_tgt of the synthetic lab and staleness STARE runs
TOOL_H = 0.08  # the tool preset's h_tgt: its warm start (about 0.098 nats) sits inside the +/-30 % band
REAL_H = 0.5  # the real-model study's h_tgt (conf/ablation/real_model.yaml)


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


# -- the lab's inputs ------------------------------------------------------------------------------
def _quadrant_inputs(null: bool) -> dict:
    """Each quadrant's restricted update moving entropy with the theory's sign, or by 0 (the null)."""
    theory = {"q1": [-1e-3, -2e-3], "q2": [1e-3, 5e-4], "q3": [-3e-3, -1e-3], "q4": [2e-4, 1e-4]}
    zero = {q: [0.0, 0.0] for q in theory}
    return _inputs({}, quadrants={s: copy.deepcopy(zero if null else theory) for s in SEEDS})


def _extreme(null: bool) -> dict:
    """The stress test: GRPO collapsing, STEER falling slowly (or GRPO's rows under STEER's name)."""
    grpo = _seeds(lambda: _rows(_decay(0.1)))
    steer = _same(grpo) if null else _seeds(lambda: _rows(lambda i: 1.0 - 0.002 * i))
    return _inputs({"grpo_extreme": grpo, "steer_extreme": steer})


def _pass_at_k(null: bool) -> dict:
    """STARE ending with a higher pass@8 than GRPO, or GRPO's rows under STARE's and STEER's names."""
    if null:
        grpo = _grpo()
        return _inputs({"grpo": grpo, "stare": _same(grpo), "steer": _same(grpo)})
    return _inputs({"grpo": _grpo(), "stare": _seeds(lambda: _rows(_decay(0.05), **{"val/pass_at_8": 0.6}))})


# -- the staleness study's inputs ----------------------------------------------------------------------
def _stale_quarters(k: int, null: bool) -> dict:
    """The stale ratio's clipped share per entropy quartile at staleness ``k``: 0 at k = 0 (and in the
    null at every k), else rising with k and with the quartile."""
    return {key: 0.0 if null or k == 0 else 0.005 * k * (q + 1) for q, key in enumerate(STALE_QUARTER_KEYS)}


def _stale_collapse(null: bool) -> dict:
    k0 = _seeds(lambda: _rows(_decay(0.002)))
    return _inputs({"grpo_k0": k0, "grpo_k4": _same(k0) if null else _seeds(lambda: _rows(_decay(0.05)))})


def _stale_quarter_inputs(null: bool) -> dict:
    return _inputs({f"grpo_k{k}": _seeds(lambda k=k: _rows(_decay(0.02), **_stale_quarters(k, null))) for k in (0, 1, 2, 4)})


def _stare_band(variants: tuple[str, ...], null: bool) -> dict:
    return _inputs({v: _seeds(lambda: _stare_idle(LAB_H) if null else _stare(LAB_H)) for v in variants})


def _stale_corrections(null: bool) -> dict:
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


def _stale_vs_grpo(method: str, null: bool) -> dict:
    runs = {}
    for k in (0, 2):
        grpo = _seeds(lambda: _rows(_decay(0.05), **_alternating(0.03)))
        own = _seeds(lambda: _rows(_decay(0.01), **_alternating(0.01)))
        runs[f"grpo_k{k}"], runs[f"{method}_k{k}"] = grpo, _same(grpo) if null else own
    return _inputs(runs)


# -- the real-model study's inputs ---------------------------------------------------------------------
def _attribution_rows(predicted: Callable[[float], float]) -> list[dict]:
    """GRPO's decaying rows with the attribution measured every 10th step: a realised probe change of
    about -0.01 (-0.008 and -0.012 in turn) and ``predicted(realised)`` as the prediction."""
    rows = _rows(_decay(0.05))
    for i, r in enumerate(rows):
        if (i + 1) % 10 == 0 or i == 0:
            realised = -0.01 + 0.002 * (-1) ** i
            r["entropy_change/realized"], r["entropy_change/predicted_net"] = realised, predicted(realised)
    return rows


def _real_inputs(runs: dict) -> dict:
    return _inputs(runs, REAL_H)


def _real_above(method: str, null: bool, baseline: str = "grpo") -> dict:
    base = _grpo()
    return _real_inputs({baseline: base, method: _same(base) if null else _seeds(lambda: _rows(_decay(0.01)))})


def _real_acc(null: bool) -> dict:
    grpo = _seeds(lambda: _rows(_decay(0.05), **{"val/acc": 0.5, "val/pass_at_4": 0.7}))
    own = _seeds(lambda: _rows(_decay(0.01), **{"val/acc": 0.4, "val/pass_at_4": 0.7}))
    return _real_inputs({"grpo": grpo, "stare": _same(grpo) if null else own})
