"""The lab's claim table: what the papers claim, measured on the lab's runs, per seed.

Pure functions of metric rows (``metrics.jsonl`` of each run), so they are tested on synthetic
rows. ``runs`` maps a lab variant (``grpo``, ``stare``, ``steer``, ``clip_cov``, ``kl_cov``,
``sample_reweight``, ``high_entropy_mask``, ``grpo_extreme``, ``steer_extreme``) to
``{seed: rows}``. Every claim is ``{"id", "claim", "measured", "reproduced", "per_seed"}``;
``reproduced`` is None when the runs a claim needs are missing, and a claim that is not
reproduced names the measured reason (the regime warnings and flags of the runs involved).

Every claim can fail on its null control: the rows of a run in which the method did nothing
(entropy flat at its start, GRPO's rows under the method's name, a gate that never opened) give
``reproduced`` False (``null_controls.py`` declares each claim's null and a synthetic positive;
``tests/sweeps/test_claim_nulls.py`` runs both). So a claim that a method holds a target
(``target_hold``) also needs the method to have acted (STARE: its gate open on at least
``GATE_MIN_OPEN_SHARE`` of the steps) and entropy to have reached the target from where it started
(crossed it): a run that sat in the band from its first step, untouched, is no evidence. A claim
that a gate follows entropy needs the gate to have both opened and closed.

One function per claim, assembled in the report's order by ``compute_claims``; the per-run measures
(``claim_measures.py``) and the helpers that make a claim row (the study kit, ``kit.py``) are importable
from here too.
"""

from __future__ import annotations

import math

import numpy as np

from ...trainers.run.regime import entropy_flags
from .claim_measures import (
    BAND,
    GATE_KEY,
    GATE_MIN_OPEN_SHARE,
    acted_share,
    crossing_step,
    entropy_ends,
    final_value,
    hold_text,
    step_change_std,
    target_hold,
)
from .kit import finite_values, fmt, join_phrases, make_claim, regime_reasons, seeds_with

__all__ = [
    "compute_claims",
    "stare_hold_claim",
    "entropy_ends",
    "step_change_std",
    "final_value",
    "quadrant_claim",
    "target_hold",
    "hold_text",
    "crossing_step",
    "acted_share",
    "THEORY",
    "BAND",
    "GATE_KEY",
    "GATE_MIN_OPEN_SHARE",
    "make_claim",
    "seeds_with",
    "finite_values",
    "fmt",
    "regime_reasons",
    "join_phrases",
]

# the kit's helpers under the names the studies imported from here before the kit was public (kit.py)
_claim, _fmt, _join, _reasons, _seeds, _vals = make_claim, fmt, join_phrases, regime_reasons, seeds_with, finite_values


# Quadrant sign theory (diagnostics.py): Q1 exploitation and Q3 suppression lower entropy,
# Q2 exploration and Q4 error-correction raise it.
THEORY = {"q1": -1, "q2": +1, "q3": -1, "q4": +1}
COV_VARIANTS = ("clip_cov", "kl_cov")


def _steer_weights(runs: dict, variant: str) -> str:
    """STEER's measured lever: its mean token weight over the run's steps (1.0 = plain GRPO), per seed."""
    per = []
    for _seed, rows in sorted((runs.get(variant) or {}).items()):
        w = finite_values(rows, "steer/weight_mean")
        if w:
            per.append(f"{np.mean(w):.3f} (lowest {min(w):.3f})")
    return f"{variant}: mean token weight {', '.join(per)}, 1.0 = plain GRPO" if per else ""


def _extreme_accuracy(runs: dict) -> str:
    """Final validation accuracy of the stress-test runs per seed: 0 means the policy broke, whatever its entropy."""
    per = [
        f"{v} {'/'.join(fmt(final_value(rows, 'val/acc')) for _s, rows in sorted(runs[v].items()))}"
        for v in ("grpo_extreme", "steer_extreme")
        if runs.get(v)
    ]
    return "final val acc " + ", ".join(per) if per else ""


def _grpo_collapses(runs: dict, algo_cfgs: dict) -> dict:
    per = []
    for s in seeds_with(runs, "grpo"):
        first, last = entropy_ends(runs["grpo"][s])
        per.append({"seed": s, "first_tenth": first, "last_tenth": last, "ratio": last / first, "ok": last < 0.5 * first})
    return make_claim(
        "grpo_collapses",
        "GRPO's entropy collapses: last tenth < 0.5 x first tenth",
        per,
        "ok",
        "last/first tenth " + ", ".join(fmt(p["ratio"]) for p in per),
        regime_reasons(runs, ("grpo",), algo_cfgs),
    )


def stare_hold_claim(runs: dict, h_tgt: float, algo_cfgs: dict, id_: str, claim: str, band: float = BAND) -> dict:
    """The claim ``id_`` that STARE holds entropy at ``h_tgt`` (``target_hold`` per seed, within ``band``):
    the lab, the tool study and the real-model study word it their own way and measure it alike."""
    per = [{"seed": s, "h_tgt": h_tgt, **target_hold(runs["stare"][s], h_tgt, band=band)} for s in seeds_with(runs, "stare")]
    return make_claim(
        id_,
        claim,
        per,
        "ok",
        "last third " + ", ".join(hold_text(p) for p in per),
        join_phrases(
            "; ".join(f"seed {p['seed']}: {p['why_not']}" for p in per if p["why_not"]),
            regime_reasons(runs, ("stare",), algo_cfgs),
        ),
    )


def _stare_holds_target(runs: dict, h_tgt: float, algo_cfgs: dict) -> dict:
    return stare_hold_claim(
        runs,
        h_tgt,
        algo_cfgs,
        "stare_holds_target",
        f"STARE holds entropy at its target: last third within +/-{BAND:.0%} of h_tgt={h_tgt}, entropy reached "
        f"h_tgt from its start, and the gate open on at least {GATE_MIN_OPEN_SHARE:.0%} of steps (a run that sat in "
        "the band with its gate shut is not STARE holding it)",
    )


def _stare_gate_follows_entropy(runs: dict, h_tgt: float, algo_cfgs: dict) -> dict:
    per = []
    for s in seeds_with(runs, "stare"):
        pairs = [
            (r["stare/gate_on"], r["entropy"])
            for r in runs["stare"][s]
            if r.get("stare/gate_on") is not None and r.get("entropy") is not None
        ]
        match = float(np.mean([float(g) == float(h < h_tgt) for g, h in pairs])) if pairs else float("nan")
        open_share = float(np.mean([float(g) > 0.5 for g, _ in pairs])) if pairs else float("nan")
        per.append(
            {
                "seed": s,
                "steps": len(pairs),
                "match": match,
                "open_share": open_share,
                # a gate that never opened (or never closed) matches a curve that stayed on one side
                # without ever deciding anything: both states must be seen
                "both_states": bool(pairs) and 0.0 < open_share < 1.0,
                "ok": bool(pairs) and match == 1.0 and 0.0 < open_share < 1.0,
            }
        )
    return make_claim(
        "stare_gate_follows_entropy",
        "STARE's gate is open exactly on the steps whose entropy is below h_tgt, and it both opened and closed "
        "(a gate shut on every step of a curve that stayed above h_tgt matches it without deciding anything)",
        per,
        "ok",
        "gate == (H < h_tgt) on " + ", ".join(f"{p['match']:.0%} (open {p['open_share']:.0%})" for p in per),
        regime_reasons(runs, ("stare",), algo_cfgs),
    )


def _change_std_vs_grpo(runs: dict, variant: str, key: str, lower: bool) -> list[dict]:
    """Per seed both ran: the std of the per-step entropy change of GRPO and of ``variant`` (under
    ``key``), ok when ``variant``'s is lower (``lower``) or higher than GRPO's."""
    per = []
    for s in seeds_with(runs, "grpo", variant):
        g, v = step_change_std(runs["grpo"][s]), step_change_std(runs[variant][s])
        per.append({"seed": s, "std_grpo": g, key: v, "ok": v < g if lower else v > g})
    return per


def _steer_moderates_change(runs: dict, algo_cfgs: dict) -> dict:
    per = _change_std_vs_grpo(runs, "steer", "std_steer", lower=True)
    return make_claim(
        "steer_moderates_change",
        "STEER's per-step entropy change has a lower std than GRPO's",
        per,
        "ok",
        "std steer/grpo " + ", ".join(f"{fmt(p['std_steer'])}/{fmt(p['std_grpo'])}" for p in per),
        join_phrases(regime_reasons(runs, ("steer",), algo_cfgs), _steer_weights(runs, "steer")),
    )


def _steer_extreme_stable(runs: dict, algo_cfgs: dict) -> dict:
    per = []
    for s in seeds_with(runs, "grpo_extreme", "steer_extreme"):
        g_flags = [f["id"] for f in entropy_flags(runs["grpo_extreme"][s], algo_cfgs.get("grpo_extreme", {}))]
        s_flags = [f["id"] for f in entropy_flags(runs["steer_extreme"][s], algo_cfgs.get("steer_extreme", {}))]
        per.append(
            {
                "seed": s,
                "grpo_flags": g_flags,
                "steer_flags": s_flags,
                "last_tenth_grpo": entropy_ends(runs["grpo_extreme"][s])[1],
                "last_tenth_steer": entropy_ends(runs["steer_extreme"][s])[1],
                "ok": bool(g_flags) and not s_flags,
            }
        )
    return make_claim(
        "steer_extreme_stable",
        "Under an extreme clip (0.99/5) with several updates per batch GRPO "
        "collapses or explodes while STEER stays within a band",
        per,
        "ok",
        "flags grpo/steer " + ", ".join(f"{p['grpo_flags'] or 'none'}/{p['steer_flags'] or 'none'}" for p in per),
        join_phrases(
            regime_reasons(runs, ("grpo_extreme", "steer_extreme"), algo_cfgs),
            _extreme_accuracy(runs),
            _steer_weights(runs, "steer_extreme"),
        ),
    )


def _keeps_entropy(runs: dict, cid: str, variants: tuple[str, ...], text: str, algo_cfgs: dict) -> dict:
    """``cid``: each of ``variants`` (those that ran) ends with a higher entropy than GRPO on every seed."""
    per = []
    present = [v for v in variants if runs.get(v)]
    for s in seeds_with(runs, "grpo", *present) if present else []:
        g = entropy_ends(runs["grpo"][s])[1]
        ends = {v: entropy_ends(runs[v][s])[1] for v in present}
        per.append(
            {
                "seed": s,
                "last_tenth_grpo": g,
                **{f"last_tenth_{v}": e for v, e in ends.items()},
                "ok": all(e > g for e in ends.values()),
            }
        )
    return make_claim(
        cid,
        text,
        per,
        "ok",
        "last tenth "
        + ", ".join("/".join(fmt(p[f"last_tenth_{v}"]) for v in present) + f" vs grpo {fmt(p['last_tenth_grpo'])}" for p in per),
        regime_reasons(runs, tuple(present), algo_cfgs),
    )


def _high_entropy_amplification(runs: dict, algo_cfgs: dict) -> dict:
    per = _change_std_vs_grpo(runs, "high_entropy_mask", "std_high_entropy", lower=False)
    return make_claim(
        "high_entropy_amplification_fluctuates",
        "Training only on high-entropy tokens makes the per-step entropy change fluctuate more than GRPO's",
        per,
        "ok",
        "std high-entropy/grpo " + ", ".join(f"{fmt(p['std_high_entropy'])}/{fmt(p['std_grpo'])}" for p in per),
        regime_reasons(runs, ("high_entropy_mask",), algo_cfgs),
    )


def _pass_at_k_preserved(runs: dict, pass_key: str) -> dict:
    per = []
    others = [v for v in runs if v not in ("grpo", "grpo_extreme", "steer_extreme")]
    seeds = seeds_with(runs, "grpo")
    finals = {s: {v: final_value(runs[v][s], pass_key) for v in others if s in runs[v]} for s in seeds}
    grpo_final = {s: final_value(runs["grpo"][s], pass_key) for s in seeds}
    # the same intervention above GRPO on every seed: the best of several per seed would pass on noise alone
    above_all = [
        v
        for v in others
        if seeds
        and all(
            math.isfinite(grpo_final[s]) and math.isfinite(finals[s].get(v, float("nan"))) and finals[s][v] > grpo_final[s]
            for s in seeds
        )
    ]
    for s in seeds:
        g, ends = grpo_final[s], finals[s]
        best = max(ends, key=lambda v: ends[v] if math.isfinite(ends[v]) else -1.0) if ends else None
        per.append(
            {
                "seed": s,
                "grpo": g,
                "best": best,
                "best_value": ends.get(best, float("nan")) if best else float("nan"),
                "above_on_every_seed": above_all,
                "ok": None if best is None or not math.isfinite(g) else bool(above_all),
            }
        )
    return make_claim(
        "pass_at_k_preserved",
        f"An intervention ends with a higher {pass_key} than GRPO on every seed (the same intervention on each; "
        f"{len(others)} compared, no correction for comparing several: a seed-by-seed win is the evidence)",
        per,
        "ok",
        ", ".join(f"{p['best']} {fmt(p['best_value'])} vs grpo {fmt(p['grpo'])}" for p in per)
        + (f"; above GRPO on every seed: {', '.join(above_all) or 'none'}" if per else ""),
    )


def compute_claims(
    runs: dict[str, dict[int, list[dict]]],
    *,
    h_tgt: float,
    algo_cfgs: dict[str, dict] | None = None,
    quadrants: dict | None = None,
    pass_key: str = "val/pass_at_8",
) -> list[dict]:
    """The claim table (see module docstring), in the report's order. ``quadrants``:
    ``{seed: {"q1": [changes], ...}}`` of the quadrant sign experiment, or None."""
    algo_cfgs = algo_cfgs or {}
    return [
        _grpo_collapses(runs, algo_cfgs),
        _stare_holds_target(runs, h_tgt, algo_cfgs),
        _stare_gate_follows_entropy(runs, h_tgt, algo_cfgs),
        quadrant_claim(quadrants),
        _steer_moderates_change(runs, algo_cfgs),
        _steer_extreme_stable(runs, algo_cfgs),
        _keeps_entropy(runs, "cov_keeps_entropy", COV_VARIANTS, "Clip-Cov / KL-Cov end with higher entropy than GRPO", algo_cfgs),
        _keeps_entropy(
            runs,
            "negative_samples_keep_entropy",
            ("sample_reweight",),
            "W-REINFORCE-style weighting (negative samples) ends with higher entropy than GRPO",
            algo_cfgs,
        ),
        _high_entropy_amplification(runs, algo_cfgs),
        _pass_at_k_preserved(runs, pass_key),
    ]


def quadrant_claim(quadrants: dict | None) -> dict:
    """``quadrant_signs`` from the quadrant experiment: per seed, the mean realised change of each
    quadrant's restricted update has the theory's sign."""
    per = []
    for seed, changes in sorted((quadrants or {}).items()):
        row = {"seed": seed}
        ok = True
        for q, sign in THEORY.items():
            vals = np.asarray(changes.get(q, []), dtype=float)
            mean = float(vals.mean()) if vals.size else float("nan")
            row[q] = {
                "mean": mean,
                "std": float(vals.std()) if vals.size else float("nan"),
                "n": int(vals.size),
                "sign_share": float(np.mean(np.sign(vals) == sign)) if vals.size else float("nan"),
            }
            ok = ok and vals.size > 0 and np.sign(mean) == sign
        row["ok"] = bool(ok)
        per.append(row)
    measured = "; ".join(f"seed {p['seed']}: " + " ".join(f"{q} {p[q]['mean']:+.2e}" for q in THEORY) for p in per)
    return make_claim(
        "quadrant_signs",
        "One small update restricted to a quadrant moves entropy with the theory's sign (Q1, Q3 down; Q2, Q4 up)",
        per,
        "ok",
        measured,
    )
