"""The staleness study's grid and its measures: how a variant is named (``parse_variant``:
``<method>_k<k>[_<tag>]``), the staleness levels each method runs at, the metric keys of the update's and
the stale ratio's clipping, per-run measures (``step_mean``, ``last_third``), how per-seed verdicts
combine (``all_or_none``), the reason a claim is not run (``_not_run``), and the per-variant table of
the report (``staleness_table``). ``staleness_claims.py`` re-exports the public names.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..aggregate import first_step_below, series
from .claims import entropy_ends, final_value
from .kit import finite_values, fmt

VARIANT_NAME = re.compile(r"^(?P<method>[A-Za-z0-9_]+?)_k(?P<k>\d+)(?:_(?P<tag>.+))?$")
GRPO_KS = (0, 1, 2, 4)  # the staleness levels GRPO runs at in the grid
STALE_K = 4  # the grid's largest staleness: where the collapse is claimed
COLLAPSE_RATIO = 0.5  # the lab's collapse ratio (claims.grpo_collapses), here against the k = 0 run
BAND = 0.3  # the lab's band: last third within +/-30 % of h_tgt (claims.stare_holds_target)
STARE_KS = (0, 2, 4)  # the staleness levels STARE runs at in the grid
CORRECTION_K = 2  # the staleness the corrections run at
CORRECTIONS = ("tis", "icepop", "dec", "m2po")  # the tis modes at k = 2, as the variants name them
CLAIMED_CORRECTIONS = ("dec", "m2po")  # the ones a direction is claimed for
METHOD_KS = (0, 2)  # Clip-Cov and STEER: synchronous and k = 2
QUARTER_KEYS = tuple(f"clip/frac/entropy_q{i}" for i in (1, 2, 3, 4))  # the update's clip, pi_theta / pi_prox
STALE_KEY = "async/stale_clip_frac"  # the stale ratio pi_prox / pi_behav outside the clip range
STALE_QUARTER_KEYS = tuple(f"{STALE_KEY}/entropy_q{i}" for i in (1, 2, 3, 4))
ACTED_EPS = 1e-3  # a correction whose mean weight is within this of 1 and that masked nothing did nothing

# claim id -> the variants whose attribution explains it (explain.explain_claims)
CLAIM_VARIANTS = {
    "stale_grpo_collapses": ("grpo_k0", f"grpo_k{STALE_K}"),
    "stare_band_by_k": tuple(f"stare_k{k}" for k in STARE_KS),
    "stare_k2_dec_holds_band": ("stare_k2_dec",),
    "stare_k2_behav_holds_band": ("stare_k2_behav",),
    "corrections_lower_clipping": tuple(f"grpo_k{CORRECTION_K}_{c}" for c in CLAIMED_CORRECTIONS),
    "clip_cov_keeps_entropy_stale": tuple(f"clip_cov_k{k}" for k in METHOD_KS),
    "steer_moderates_change_stale": tuple(f"steer_k{k}" for k in METHOD_KS),
}


def parse_variant(name: str) -> tuple[str, int, str] | None:
    """``"grpo_k2_m2po"`` -> ``("grpo", 2, "m2po")``, ``"clip_cov_k0"`` -> ``("clip_cov", 0, "")``;
    None for a name that is not ``<method>_k<k>[_<tag>]``."""
    m = VARIANT_NAME.match(name)
    return (m["method"], int(m["k"]), m["tag"] or "") if m else None


def step_mean(rows: list[dict], key: str) -> float:
    """Mean of ``key`` over the steps that logged it finite; NaN when none did."""
    vals = finite_values(rows, key)
    return float(np.mean(vals)) if vals else float("nan")


def last_third(rows: list[dict], key: str = "entropy") -> float:
    """Mean of the last third of ``key``'s finite values (the lab's band measure); NaN when none."""
    vals = finite_values(rows, key)
    return float(np.mean(vals[-max(1, len(vals) // 3) :])) if vals else float("nan")


def all_or_none(oks: list[bool | None]) -> bool | None:
    """False when any is False (one failure decides), None when any is unknown, else True."""
    if any(o is False for o in oks):
        return False
    if not oks or any(o is None for o in oks):
        return None
    return True


def _finite(*xs: float) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def _missing(runs: dict, variants) -> list[str]:
    return [v for v in variants if not runs.get(v)]


def _not_run(out: dict, runs: dict, variants, extra: str = "") -> dict:
    """``out`` with the reason it is not run, when it is not (``reproduced`` None)."""
    if out["reproduced"] is None:
        missing = _missing(runs, variants)
        why = [f"missing runs: {', '.join(missing)}" if missing else "", extra]
        out["reason"] = "; ".join(w for w in why if w) or "no seed measured it"
    return out


def _grpo_ks(runs: dict, method: str = "grpo") -> list[int]:
    """The staleness levels ``method`` ran at without a correction, sorted."""
    ks = {p[1] for v in runs if (p := parse_variant(v)) and p[0] == method and not p[2] and runs[v]}
    return sorted(ks)


def _ratio(a: float, b: float) -> float:
    return a / b if _finite(a, b) and b > 0 else float("nan")


def _ratios_text(per: list[dict], key: str) -> str:
    return ", ".join(f"{fmt(p.get(key, float('nan')))}x" for p in per)


def staleness_table(runs: dict[str, dict[int, list[dict]]], *, h_tgt: float, pass_key: str = "val/pass_at_8") -> list[dict]:
    """Per variant, one value per seed (the seeds in ``seeds``' order): entropy last tenth, the first
    step below ``h_tgt`` (None: never), ``clip/frac`` (the update's clip) and its bottom and top entropy
    quarters, ``async/stale_clip_frac`` (the stale ratio's) and its bottom and top quarters (means over
    steps), final ``pass_key`` and ``val/acc``, STARE's gate open share (``stare/gate_on``, mean
    over steps) and the mean lag ``async/staleness/mean`` (NaN where a run did not log one: k = 0,
    or no gate)."""
    out = []
    for v, by_seed in runs.items():
        parsed = parse_variant(v)
        seeds = sorted(by_seed)
        rows_list = [by_seed[s] for s in seeds]
        out.append(
            {
                "variant": v,
                "method": parsed[0] if parsed else v,
                "k": parsed[1] if parsed else None,
                "tag": parsed[2] if parsed else "",
                "seeds": seeds,
                "entropy_last_tenth": [entropy_ends(r)[1] for r in rows_list],
                "first_step_below": [first_step_below(*series(r, "entropy"), h_tgt) for r in rows_list],
                "clip_frac": [step_mean(r, "clip/frac") for r in rows_list],
                "clip_q1": [step_mean(r, QUARTER_KEYS[0]) for r in rows_list],
                "clip_q4": [step_mean(r, QUARTER_KEYS[3]) for r in rows_list],
                "stale_clip_frac": [step_mean(r, STALE_KEY) for r in rows_list],
                "stale_q1": [step_mean(r, STALE_QUARTER_KEYS[0]) for r in rows_list],
                "stale_q4": [step_mean(r, STALE_QUARTER_KEYS[3]) for r in rows_list],
                "pass": [final_value(r, pass_key) for r in rows_list],
                "val_acc": [final_value(r, "val/acc") for r in rows_list],
                "gate_open": [step_mean(r, "stare/gate_on") for r in rows_list],
                "staleness_mean": [step_mean(r, "async/staleness/mean") for r in rows_list],
            }
        )
    return out
