"""The kit every study builds its claim table with: a metric's finite values over a run's rows, a number
as a claim table prints it, the seeds the named variants share, the measured reason of a claim that
failed (its runs' regime warnings and flags), and the claim row itself.

A claim row is ``{"id", "claim", "measured", "reproduced", "per_seed"}`` (``make_claim``):
``reproduced`` is True when every seed that measured the claim is ok, False when one is not (the row
then carries the ``reason``), None when no seed measured it (the runs it needs are missing). The
per-run measures (entropy at the ends, whether a target was held, ...) are in ``claim_measures.py``.
Pure functions of metric rows (``metrics.jsonl`` of each run).
"""

from __future__ import annotations

import math

from ...trainers.run.regime import entropy_flags, regime_warnings

__all__ = ["finite_values", "fmt", "join_phrases", "make_claim", "regime_reasons", "seeds_with"]


def finite_values(rows: list[dict], key: str) -> list[float]:
    """The finite values of metric ``key`` over the rows, in step order (steps that did not log it, or
    logged NaN, are skipped)."""
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def fmt(x: float) -> str:
    """A number as a claim table prints it: 3 significant digits, ``nan`` for none."""
    return "nan" if x is None or not math.isfinite(x) else f"{x:.3g}"


def regime_reasons(runs: dict, variants: tuple[str, ...], algo_cfgs: dict) -> str:
    """The regime warnings and flags of ``variants``' runs, as one phrase (the measured reason)."""
    found = []
    for v in variants:
        for _seed, rows in sorted((runs.get(v) or {}).items()):
            for f in regime_warnings(rows, algo_cfgs.get(v, {})) + entropy_flags(rows, algo_cfgs.get(v, {})):
                tag = f"{v}: {f['id']}"
                if tag not in found:
                    found.append(tag)
    return "; ".join(found)


def join_phrases(*parts: str) -> str:
    """The non-empty phrases joined with ``; `` (a reason made of several, any of them possibly empty)."""
    return "; ".join(p for p in parts if p)


def make_claim(id_: str, claim: str, per_seed: list[dict], ok_key: str, measured: str, reason: str = "") -> dict:
    """The claim row: reproduced when every seed's ``ok_key`` is true (None when no seed has one); a
    claim not reproduced keeps ``reason``."""
    oks = [p[ok_key] for p in per_seed if p.get(ok_key) is not None]
    reproduced = None if not oks else bool(all(oks))
    out = {"id": id_, "claim": claim, "measured": measured, "reproduced": reproduced, "per_seed": per_seed}
    if reproduced is False and reason:
        out["reason"] = reason
    return out


def seeds_with(runs: dict, *variants: str) -> list:
    """The seeds every one of ``variants`` ran, sorted; none when one of them has no run."""
    sets = [set((runs.get(v) or {}).keys()) for v in variants]
    return sorted(set.intersection(*sets)) if sets and all(sets) else []
