"""Aggregation math over ``metrics.jsonl`` rows: pure functions, no I/O except ``load_rows``.

Per run (one seed of one variant):
- ``final_val_acc``: the last ``val/acc`` logged;
- ``final_val_pass``: the last ``val/pass_at_<k>`` logged, for the largest ``k`` the run logged
  (``val_pass_k``; sampled pass@k with ``val.pass_k``);
- ``tail_entropy``: mean and min entropy over the last ``tail_frac`` of the steps (at least one
  step; the last tenth by default, as the trainer's ``entropy/last_tenth``);
- ``entropy_auc``: area under the entropy curve, trapezoid rule over the step axis (nats x steps;
  0 for a single step);
- ``first_step_below``: the first step whose entropy is below a threshold (``None``: never).

Per variant: mean, standard deviation (``ddof=0``), min and max over seeds of each figure, and
per-step curves (``seed_band``: mean with a min-max band over seeds), the one band both the sweep
report's plots and the lab's figures draw. Missing steps: a step counts only the seeds that logged
a finite value at it, and the band says how many (``n`` per step); a seed that skipped a step (a
validation step, a run cut short) neither drops that step for the others nor counts as zero.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable

import numpy as np

RUN_FIELDS = (
    "final_val_acc",
    "final_val_pass",
    "val_pass_k",
    "entropy_tail_mean",
    "entropy_tail_min",
    "entropy_auc",
    "first_step_below",
    "final_reward",
    "final_acc",
    "steps",
)


def load_rows(output_dir: Path) -> list[dict]:
    """``metrics.jsonl`` rows of a run, sorted by step; a torn last line (a job killed mid-write) is
    skipped; if a step appears twice, its last row wins."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            by_step[int(row["step"])] = row
        except (ValueError, KeyError, TypeError):
            continue
    return [by_step[s] for s in sorted(by_step)]


def series(rows: Iterable[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of metric ``key`` where it is logged and finite."""
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None and math.isfinite(float(r[key]))]
    if not pts:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*pts)
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def tail_count(n: int, frac: float) -> int:
    return max(1, int(math.floor(n * frac + 1e-9))) if n else 0


def tail_stats(values: np.ndarray, frac: float = 0.1) -> tuple[float, float]:
    """(mean, min) of the last ``frac`` of ``values`` (at least one); NaNs when empty."""
    if len(values) == 0:
        return float("nan"), float("nan")
    tail = np.asarray(values)[-tail_count(len(values), frac) :]
    return float(tail.mean()), float(tail.min())


def auc(steps: np.ndarray, values: np.ndarray) -> float:
    """Trapezoid-rule area under ``values`` over ``steps`` (0 for fewer than two points)."""
    if len(steps) < 2:
        return 0.0 if len(steps) == 1 else float("nan")
    s, v = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    return float(np.sum((s[1:] - s[:-1]) * (v[1:] + v[:-1]) / 2.0))


def first_step_below(steps: np.ndarray, values: np.ndarray, threshold: float) -> int | None:
    """The first step whose value is strictly below ``threshold``; ``None`` if none is."""
    below = np.nonzero(np.asarray(values) < threshold)[0]
    return int(steps[below[0]]) if len(below) else None


def last_value(rows: list[dict], key: str) -> float:
    _, v = series(rows, key)
    return float(v[-1]) if len(v) else float("nan")


_PASS_AT = re.compile(r"val/pass_at_(\d+)$")


def pass_k(rows: list[dict]) -> int | None:
    """The largest ``k`` of the ``val/pass_at_<k>`` metrics in ``rows`` (None: none logged)."""
    ks = {int(m.group(1)) for r in rows for key in r if (m := _PASS_AT.match(key))}
    return max(ks) if ks else None


def run_metrics(rows: list[dict], threshold: float = 0.3, tail_frac: float = 0.1) -> dict:
    """The comparison figures of one run (see the module docstring)."""
    steps, ent = series(rows, "entropy")
    tail_mean, tail_min = tail_stats(ent, tail_frac)
    k = pass_k(rows)
    return {
        "final_val_acc": last_value(rows, "val/acc"),
        "final_val_pass": last_value(rows, f"val/pass_at_{k}") if k else float("nan"),
        "val_pass_k": float(k) if k else float("nan"),
        "entropy_tail_mean": tail_mean,
        "entropy_tail_min": tail_min,
        "entropy_auc": auc(steps, ent),
        "first_step_below": first_step_below(steps, ent, threshold),
        "final_reward": last_value(rows, "reward/mean"),
        "final_acc": last_value(rows, "acc/mean"),
        "steps": int(max((r["step"] for r in rows), default=0)),
    }


def _stats(values: list[float]) -> dict:
    vals = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not len(vals):
        return {"mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {
        "mean": float(vals.mean()),
        "std": float(vals.std()),
        "min": float(vals.min()),
        "max": float(vals.max()),
        "n": int(len(vals)),
    }


def variant_summary(runs: list[dict]) -> dict:
    """Aggregate ``run_metrics`` dicts of one variant's seeds: ``{field: {mean, std, min, max, n}}``;
    ``first_step_below`` also gets ``crossed`` (how many seeds ever fell below the threshold)."""
    out = {f: _stats([r.get(f) for r in runs]) for f in RUN_FIELDS if f != "first_step_below"}
    fsb = [r.get("first_step_below") for r in runs]
    crossed = [float(x) for x in fsb if x is not None]
    out["first_step_below"] = {**_stats(crossed), "crossed": len(crossed), "of": len(runs)}
    return out


def seed_band(rows_per_seed: Iterable[list[dict]], key: str) -> dict | None:
    """Mean and min-max band of metric ``key`` over seeds, step by step (see the module docstring
    for missing steps). ``rows_per_seed``: each seed's ``metrics.jsonl`` rows.

    Returns ``{steps, mean, lo, hi, n}`` (arrays over the steps any seed logged; ``n`` = seeds at
    that step) plus ``seeds`` (how many seeds logged ``key`` at all), or None when none did.
    """
    curves = [c for c in (series(rows, key) for rows in rows_per_seed) if len(c[0])]
    if not curves:
        return None
    return {**band(curves), "seeds": len(curves)}


def band(curves: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Mean and min-max band over seeds, step by step (a step counts the seeds that logged it).

    ``curves``: ``[(steps, values), ...]`` one per seed. Returns ``{steps, mean, lo, hi, n}``.
    """
    table: dict[float, list[float]] = {}
    for steps, values in curves:
        for s, v in zip(steps, values):
            table.setdefault(float(s), []).append(float(v))
    steps = np.asarray(sorted(table), dtype=float)
    vals = [np.asarray(table[s]) for s in steps]
    return {
        "steps": steps,
        "mean": np.asarray([v.mean() for v in vals]),
        "lo": np.asarray([v.min() for v in vals]),
        "hi": np.asarray([v.max() for v in vals]),
        "n": np.asarray([len(v) for v in vals]),
    }
