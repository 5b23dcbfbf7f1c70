"""The lab's claim table: what the papers claim, measured on the lab's runs, per seed.

Pure functions of metric rows (``metrics.jsonl`` of each run), so they are tested on synthetic
rows. ``runs`` maps a lab variant (``grpo``, ``stare``, ``steer``, ``clip_cov``, ``kl_cov``,
``sample_reweight``, ``high_entropy_mask``, ``grpo_extreme``, ``steer_extreme``) to
``{seed: rows}``. Every claim is ``{"id", "claim", "measured", "reproduced", "per_seed"}``;
``reproduced`` is None when the runs a claim needs are missing, and a claim that is not
reproduced names the measured reason (the regime warnings and flags of the runs involved).
"""

from __future__ import annotations

import math

import numpy as np

from ...trainers.run.regime import entropy_flags, regime_warnings

__all__ = ["compute_claims", "entropy_ends", "step_change_std", "final_value", "quadrant_claim", "THEORY"]

# Quadrant sign theory (diagnostics.py): Q1 exploitation and Q3 suppression lower entropy,
# Q2 exploration and Q4 error-correction raise it.
THEORY = {"q1": -1, "q2": +1, "q3": -1, "q4": +1}
COV_VARIANTS = ("clip_cov", "kl_cov")


def _vals(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def entropy_ends(rows: list[dict]) -> tuple[float, float]:
    """(first-tenth mean, last-tenth mean) of the sampling entropy."""
    ent = _vals(rows, "entropy")
    if not ent:
        return float("nan"), float("nan")
    tenth = max(1, len(ent) // 10)
    return float(np.mean(ent[:tenth])), float(np.mean(ent[-tenth:]))


def step_change_std(rows: list[dict]) -> float:
    """Std of the per-step entropy change: the probe's realised change when measured, else the
    step-to-step difference of the sampling entropy."""
    realized = _vals(rows, "entropy_change/realized")
    if len(realized) >= 3:
        return float(np.std(realized))
    ent = _vals(rows, "entropy")
    return float(np.std(np.diff(ent))) if len(ent) >= 3 else float("nan")


def final_value(rows: list[dict], key: str) -> float:
    vals = _vals(rows, key)
    return vals[-1] if vals else float("nan")


def _fmt(x: float) -> str:
    return "nan" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _reasons(runs: dict, variants: tuple[str, ...], algo_cfgs: dict) -> str:
    """The regime warnings and flags of ``variants``' runs, as one phrase (the measured reason)."""
    found = []
    for v in variants:
        for _seed, rows in sorted((runs.get(v) or {}).items()):
            for f in regime_warnings(rows, algo_cfgs.get(v, {})) + entropy_flags(rows):
                tag = f"{v}: {f['id']}"
                if tag not in found:
                    found.append(tag)
    return "; ".join(found)


def _steer_weights(runs: dict, variant: str) -> str:
    """STEER's measured lever: its mean token weight over the run's steps (1.0 = plain GRPO), per seed."""
    per = []
    for _seed, rows in sorted((runs.get(variant) or {}).items()):
        w = _vals(rows, "steer/weight_mean")
        if w:
            per.append(f"{np.mean(w):.3f} (lowest {min(w):.3f})")
    return f"{variant}: mean token weight {', '.join(per)}, 1.0 = plain GRPO" if per else ""


def _extreme_accuracy(runs: dict) -> str:
    """Final validation accuracy of the stress-test runs per seed: 0 means the policy broke, whatever its entropy."""
    per = [
        f"{v} {'/'.join(_fmt(final_value(rows, 'val/acc')) for _s, rows in sorted(runs[v].items()))}"
        for v in ("grpo_extreme", "steer_extreme")
        if runs.get(v)
    ]
    return "final val acc " + ", ".join(per) if per else ""


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _claim(id_: str, claim: str, per_seed: list[dict], ok_key: str, measured: str, reason: str = "") -> dict:
    oks = [p[ok_key] for p in per_seed if p.get(ok_key) is not None]
    reproduced = None if not oks else bool(all(oks))
    out = {"id": id_, "claim": claim, "measured": measured, "reproduced": reproduced, "per_seed": per_seed}
    if reproduced is False and reason:
        out["reason"] = reason
    return out


def _seeds(runs: dict, *variants: str) -> list:
    sets = [set((runs.get(v) or {}).keys()) for v in variants]
    return sorted(set.intersection(*sets)) if sets and all(sets) else []


def compute_claims(
    runs: dict[str, dict[int, list[dict]]],
    *,
    h_tgt: float,
    algo_cfgs: dict[str, dict] | None = None,
    quadrants: dict | None = None,
    pass_key: str = "val/pass_at_8",
) -> list[dict]:
    """The claim table (see module docstring). ``quadrants``: ``{seed: {"q1": [changes], ...}}`` of
    the quadrant sign experiment, or None."""
    algo_cfgs = algo_cfgs or {}
    claims = []

    per = []
    for s in _seeds(runs, "grpo"):
        first, last = entropy_ends(runs["grpo"][s])
        per.append({"seed": s, "first_tenth": first, "last_tenth": last, "ratio": last / first, "ok": last < 0.5 * first})
    claims.append(
        _claim(
            "grpo_collapses",
            "GRPO's entropy collapses: last tenth < 0.5 x first tenth",
            per,
            "ok",
            "last/first tenth " + ", ".join(_fmt(p["ratio"]) for p in per),
            _reasons(runs, ("grpo",), algo_cfgs),
        )
    )

    per = []
    for s in _seeds(runs, "stare"):
        ent = _vals(runs["stare"][s], "entropy")
        third = ent[-max(1, len(ent) // 3) :]
        m = float(np.mean(third))
        per.append({"seed": s, "last_third": m, "h_tgt": h_tgt, "rel_error": m / h_tgt - 1.0, "ok": abs(m / h_tgt - 1.0) <= 0.3})
    claims.append(
        _claim(
            "stare_holds_target",
            f"STARE holds entropy at its target: last third within +/-30 % of h_tgt={h_tgt}",
            per,
            "ok",
            "last third " + ", ".join(f"{_fmt(p['last_third'])} ({p['rel_error']:+.0%})" for p in per),
            _reasons(runs, ("stare",), algo_cfgs),
        )
    )

    per = []
    for s in _seeds(runs, "stare"):
        pairs = [
            (r["stare/gate_on"], r["entropy"])
            for r in runs["stare"][s]
            if r.get("stare/gate_on") is not None and r.get("entropy") is not None
        ]
        match = float(np.mean([float(g) == float(h < h_tgt) for g, h in pairs])) if pairs else float("nan")
        per.append(
            {
                "seed": s,
                "steps": len(pairs),
                "match": match,
                "open_share": float(np.mean([g for g, _ in pairs])) if pairs else float("nan"),
                "ok": bool(pairs) and match == 1.0,
            }
        )
    claims.append(
        _claim(
            "stare_gate_follows_entropy",
            "STARE's gate is open exactly on the steps whose entropy is below h_tgt",
            per,
            "ok",
            "gate == (H < h_tgt) on " + ", ".join(f"{p['match']:.0%} (open {p['open_share']:.0%})" for p in per),
            _reasons(runs, ("stare",), algo_cfgs),
        )
    )

    claims.append(quadrant_claim(quadrants))

    per = []
    for s in _seeds(runs, "grpo", "steer"):
        g, st = step_change_std(runs["grpo"][s]), step_change_std(runs["steer"][s])
        per.append({"seed": s, "std_grpo": g, "std_steer": st, "ok": st < g})
    claims.append(
        _claim(
            "steer_moderates_change",
            "STEER's per-step entropy change has a lower std than GRPO's",
            per,
            "ok",
            "std steer/grpo " + ", ".join(f"{_fmt(p['std_steer'])}/{_fmt(p['std_grpo'])}" for p in per),
            _join(_reasons(runs, ("steer",), algo_cfgs), _steer_weights(runs, "steer")),
        )
    )

    per = []
    for s in _seeds(runs, "grpo_extreme", "steer_extreme"):
        g_flags = [f["id"] for f in entropy_flags(runs["grpo_extreme"][s])]
        s_flags = [f["id"] for f in entropy_flags(runs["steer_extreme"][s])]
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
    claims.append(
        _claim(
            "steer_extreme_stable",
            "Under an extreme clip (0.99/5) with several updates per batch GRPO "
            "collapses or explodes while STEER stays within a band",
            per,
            "ok",
            "flags grpo/steer " + ", ".join(f"{p['grpo_flags'] or 'none'}/{p['steer_flags'] or 'none'}" for p in per),
            _join(
                _reasons(runs, ("grpo_extreme", "steer_extreme"), algo_cfgs),
                _extreme_accuracy(runs),
                _steer_weights(runs, "steer_extreme"),
            ),
        )
    )

    for cid, variants, text in (
        ("cov_keeps_entropy", COV_VARIANTS, "Clip-Cov / KL-Cov end with higher entropy than GRPO"),
        (
            "negative_samples_keep_entropy",
            ("sample_reweight",),
            "W-REINFORCE-style weighting (negative samples) ends with higher entropy than GRPO",
        ),
    ):
        per = []
        present = [v for v in variants if runs.get(v)]
        for s in _seeds(runs, "grpo", *present) if present else []:
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
        claims.append(
            _claim(
                cid,
                text,
                per,
                "ok",
                "last tenth "
                + ", ".join(
                    "/".join(_fmt(p[f"last_tenth_{v}"]) for v in present) + f" vs grpo {_fmt(p['last_tenth_grpo'])}" for p in per
                ),
                _reasons(runs, tuple(present), algo_cfgs),
            )
        )

    per = []
    for s in _seeds(runs, "grpo", "high_entropy_mask"):
        g, h = step_change_std(runs["grpo"][s]), step_change_std(runs["high_entropy_mask"][s])
        per.append({"seed": s, "std_grpo": g, "std_high_entropy": h, "ok": h > g})
    claims.append(
        _claim(
            "high_entropy_amplification_fluctuates",
            "Training only on high-entropy tokens makes the per-step entropy change fluctuate more than GRPO's",
            per,
            "ok",
            "std high-entropy/grpo " + ", ".join(f"{_fmt(p['std_high_entropy'])}/{_fmt(p['std_grpo'])}" for p in per),
            _reasons(runs, ("high_entropy_mask",), algo_cfgs),
        )
    )

    per = []
    others = [v for v in runs if v not in ("grpo", "grpo_extreme", "steer_extreme")]
    for s in _seeds(runs, "grpo"):
        g = final_value(runs["grpo"][s], pass_key)
        ends = {v: final_value(runs[v][s], pass_key) for v in others if s in runs[v]}
        best = max(ends, key=lambda v: ends[v] if math.isfinite(ends[v]) else -1.0) if ends else None
        per.append(
            {
                "seed": s,
                "grpo": g,
                "best": best,
                "best_value": ends.get(best, float("nan")) if best else float("nan"),
                "ok": None if best is None or not math.isfinite(g) else ends[best] > g,
            }
        )
    claims.append(
        _claim(
            "pass_at_k_preserved",
            f"An intervention ends with a higher {pass_key} than GRPO",
            per,
            "ok",
            ", ".join(f"{p['best']} {_fmt(p['best_value'])} vs grpo {_fmt(p['grpo'])}" for p in per),
        )
    )
    return claims


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
    return _claim(
        "quadrant_signs",
        "One small update restricted to a quadrant moves entropy with the theory's sign (Q1, Q3 down; Q2, Q4 up)",
        per,
        "ok",
        measured,
    )
