"""The measures every study's claim table is built from: per-run numbers read from metric rows
(entropy at the ends, the step the entropy reached a target, how often a method acted, whether it held
a target, the last value of a metric). The helpers that assemble a claim row from per-seed measures
(``make_claim``, ``seeds_with``, ``regime_reasons``, ...) are the study kit's (``kit.py``), importable
from here too.

Pure functions of metric rows (``metrics.jsonl`` of each run). ``claims.py`` re-exports the names other
studies import from it.
"""

from __future__ import annotations

import math

import numpy as np

from .kit import finite_values, fmt
from .kit import make_claim as make_claim  # with seeds_with, regime_reasons: importable from here as before
from .kit import regime_reasons as regime_reasons
from .kit import seeds_with as seeds_with

BAND = 0.3  # a target is held when the last third is within +/-30 % of it
GATE_KEY = "stare/gate_on"  # STARE's gate, 1 on the steps it was open
#: A "holds target" claim needs the method to have acted on at least this share of the steps (STARE's
#: gate open, a controller's coefficient non-zero): entropy that sat at the target while the method was
#: idle on 9 steps in 10 was held by something else.
GATE_MIN_OPEN_SHARE = 0.1
ACT_EPS = 1e-9  # a lever's value this close to 0 did nothing on that step


def metric_ends(rows: list[dict], key: str) -> tuple[float, float]:
    """(first-tenth mean, last-tenth mean) of ``key`` over the steps that logged it finite (a token kind
    with no token in a step is NaN there and is skipped)."""
    vals = finite_values(rows, key)
    if not vals:
        return float("nan"), float("nan")
    tenth = max(1, len(vals) // 10)
    return float(np.mean(vals[:tenth])), float(np.mean(vals[-tenth:]))


def entropy_ends(rows: list[dict]) -> tuple[float, float]:
    """(first-tenth mean, last-tenth mean) of the sampling entropy."""
    return metric_ends(rows, "entropy")


def crossing_step(rows: list[dict], target: float) -> int | None:
    """The first step at which the entropy reached ``target`` from where it started: the first logged
    step on the other side of ``target`` from the first step's entropy (or on it); None when it never
    did (a curve that stayed on one side, however close, never reached the target)."""
    ent = [
        (int(r.get("step", i + 1)), float(r["entropy"]))
        for i, r in enumerate(rows)
        if isinstance(r.get("entropy"), (int, float)) and math.isfinite(r["entropy"])
    ]
    if not ent or not math.isfinite(target):
        return None
    side = np.sign(ent[0][1] - target)
    if side == 0:
        return ent[0][0]
    return next((s for s, h in ent[1:] if np.sign(h - target) != side), None)


def acted_share(rows: list[dict], key: str) -> float:
    """Share of the steps that logged ``key`` on which it was non-zero (a 0/1 gate: the share of steps
    it was open; a coefficient: the steps it acted); NaN when no step logged it."""
    vals = finite_values(rows, key)
    return float(np.mean([abs(v) > ACT_EPS for v in vals])) if vals else float("nan")


def target_hold(rows: list[dict], target: float, acted_key: str = GATE_KEY, band: float = BAND) -> dict:
    """Whether a controller held entropy at ``target`` on one run: the last third within ``band`` of it
    (``in_band``), entropy reached it from its start (``crossed_at_step``, ``crossing_step``) and the
    method acted on at least ``GATE_MIN_OPEN_SHARE`` of the steps (``acted_share`` of ``acted_key``,
    STARE's gate). ``ok`` is all three; ``why_not`` names the ones that failed."""
    ent = finite_values(rows, "entropy")
    m = float(np.mean(ent[-max(1, len(ent) // 3) :])) if ent else float("nan")
    rel = m / target - 1.0 if math.isfinite(m) and target > 0 else float("nan")
    in_band = bool(abs(rel) <= band) if math.isfinite(rel) else False
    crossed = crossing_step(rows, target)
    share = acted_share(rows, acted_key)
    acted = math.isfinite(share) and share >= GATE_MIN_OPEN_SHARE
    why = []
    if not in_band:
        why.append(f"last third {fmt(m)} outside +/-{band:.0%} of {target:g}")
    if crossed is None:
        why.append(f"entropy never reached {target:g} from its start {fmt(ent[0]) if ent else 'nan'}")
    if not acted:
        why.append(
            f"{acted_key} logged on no step"
            if not math.isfinite(share)
            else f"{acted_key} non-zero on {share:.0%} of steps (< {GATE_MIN_OPEN_SHARE:.0%}): the method barely acted"
        )
    return {
        "last_third": m,
        "rel_error": rel,
        "in_band": in_band,
        "start": ent[0] if ent else float("nan"),
        "crossed_at_step": crossed,
        "acted_key": acted_key,
        "acted_share": share,
        "ok": bool(in_band and crossed is not None and acted),
        "why_not": "; ".join(why),
    }


def hold_text(p: dict) -> str:
    """One seed's measured cell of a "holds target" claim: the last third and its error, the share of
    steps the method acted (the gate open) and the step it reached the target."""
    share = p.get("acted_share", float("nan"))
    acted = "nan" if not math.isfinite(share) else f"{share:.0%}"
    what = "gate open" if p.get("acted_key") == GATE_KEY else f"{p.get('acted_key')} non-zero"
    crossed = p.get("crossed_at_step")
    rel = p.get("rel_error", float("nan"))
    return f"{fmt(p['last_third'])} ({'nan' if not math.isfinite(rel) else f'{rel:+.0%}'}), {what} {acted} of steps, " + (
        f"reached target at step {crossed}" if crossed is not None else "never reached target"
    )


def step_change_std(rows: list[dict]) -> float:
    """Std of the per-step entropy change: the probe's realised change when measured, else the
    step-to-step difference of the sampling entropy."""
    realized = finite_values(rows, "entropy_change/realized")
    if len(realized) >= 3:
        return float(np.std(realized))
    ent = finite_values(rows, "entropy")
    return float(np.std(np.diff(ent))) if len(ent) >= 3 else float("nan")


def final_value(rows: list[dict], key: str) -> float:
    vals = finite_values(rows, key)
    return vals[-1] if vals else float("nan")
