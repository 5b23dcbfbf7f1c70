"""The lab's claims explained with the entropy-change attribution (issue 21, item 4).

Every lab run measures ``diagnostics.attribution`` every 10 steps (``lab_common.yaml``):
``entropy_change/predicted_net`` and its parts ``attribution/<part>`` (``q1``-``q4``, ``zero_adv``,
``momentum``, ``weight_decay``, one per intervention by its name, ``kl``, ``other``,
``float_rounding``; ``trainers/stats/update_split.py``). Pure functions of metric rows:

- ``variant_attribution(by_seed)``: per seed, the fit of predicted_net to the realised probe change
  (detrended r, slope) and each part's total and share over the run;
- ``explain_claims(claims, runs)``: adds to each claim an ``attribution`` sentence, measured on the
  runs the claim is about, from the second-order parts ``attribution_2nd/<part>`` where the runs
  logged them (they add up to the trapezoid prediction, which tracks the realised change at the
  lab's step sizes; the first-order parts overshoot it by up to a third), else the first-order ones:
  which part moved entropy (for STARE: on the steps its gate was open; for
  Clip-Cov / KL-Cov: what their detached or penalised tokens' part was; for STEER: how small its own
  part is), so a reader sees *why* a claim held or not, not only whether.
"""

from __future__ import annotations

import math

import numpy as np

from ...trainers.run.regime import SECOND_ORDER, after_first_step, attribution_summary, measured_rows, part_totals, parts_prefix

__all__ = ["variant_attribution", "explain_claims", "after_first_step", "OWN_PARTS", "CLAIM_VARIANTS"]

# parts that are not an intervention's own (everything else in attribution/<part> is one)
OWN_PARTS = ("q1", "q2", "q3", "q4", "zero_adv", "momentum", "weight_decay", "kl", "other", "float_rounding")
QUADRANT_PARTS = ("q1", "q2", "q3", "q4")

# claim id -> the variants whose runs explain it (method claims: ``<variant>_keeps_entropy``)
CLAIM_VARIANTS = {
    "grpo_collapses": ("grpo",),
    "stare_holds_target": ("stare",),
    "stare_gate_follows_entropy": ("stare",),
    "steer_moderates_change": ("steer",),
    "steer_extreme_stable": ("grpo_extreme", "steer_extreme"),
    "cov_keeps_entropy": ("clip_cov", "kl_cov"),
    "negative_samples_keep_entropy": ("sample_reweight",),
    "high_entropy_amplification_fluctuates": ("high_entropy_mask",),
    "entropic_holds_target": ("entropic",),
}


def _g(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:+.3g}"


def variant_attribution(by_seed: dict[int, list[dict]]) -> dict:
    """``{"r_detrended": [per seed], "slope": [...], "slope_detrended", "n", "r_detrended_2nd",
    "slope_2nd" (the trapezoid prediction's fit), "r_detrended_after_first", "slope_after_first" (the
    first-order fit without AdamW's first step), "total": {part: [...]}, "share": {part: [...]},
    "total_2nd", "share_2nd" (second-order parts), "share_after_first" (the shares over the measured
    steps after step 1, second order where logged)}`` over the seeds whose rows hold an attribution;
    ``{}`` when none does."""
    out: dict = {"seeds": [], "r_detrended": [], "slope": [], "slope_detrended": [], "n": [],
                 "r_detrended_2nd": [], "slope_2nd": [], "r_detrended_after_first": [], "slope_after_first": [],
                 "total": {}, "share": {}, "total_2nd": {}, "share_2nd": {},
                 "share_after_first": {}}
    summaries = [(s, attribution_summary(rows)) for s, rows in sorted(by_seed.items())]
    summaries = [(s, a) for s, a in summaries if a]
    if not summaries:
        return {}
    parts = sorted({p for _s, a in summaries for p in a["total"]})
    parts_2nd = sorted({p for _s, a in summaries for p in a.get("total_2nd") or {}})
    parts_after = sorted({p for _s, a in summaries for p in a.get("share_after_first") or {}})
    for s, a in summaries:
        fit = a.get("fit") or {}
        out["seeds"].append(s)
        out["r_detrended"].append(float(fit.get("pearson_r_detrended", float("nan"))))
        out["slope"].append(float(fit.get("slope", float("nan"))))
        out["slope_detrended"].append(float(fit.get("slope_detrended", float("nan"))))
        second = a.get("fit_2nd") or {}      # the trapezoid prediction (stats/attribution.py)
        out["r_detrended_2nd"].append(float(second.get("pearson_r_detrended", float("nan"))))
        out["slope_2nd"].append(float(second.get("slope", float("nan"))))
        later = a.get("fit_after_first") or {}   # nan where step 1 was not measured apart
        out["r_detrended_after_first"].append(float(later.get("pearson_r_detrended", float("nan"))))
        out["slope_after_first"].append(float(later.get("slope", float("nan"))))
        out["n"].append(int(fit.get("n", 0)))
        for p in parts:
            out["total"].setdefault(p, []).append(float(a["total"].get(p, 0.0)))
            out["share"].setdefault(p, []).append(float(a["share"].get(p, 0.0)))
        for p in parts_2nd:
            out["total_2nd"].setdefault(p, []).append(float((a.get("total_2nd") or {}).get(p, 0.0)))
            out["share_2nd"].setdefault(p, []).append(float((a.get("share_2nd") or {}).get(p, 0.0)))
        for p in parts_after:                                      # without AdamW's first step
            out["share_after_first"].setdefault(p, []).append(float((a.get("share_after_first") or {}).get(p, 0.0)))
    return out


def _sum_parts(rows: list[dict], parts) -> float:
    totals = part_totals(rows, parts_prefix(rows))
    return float(sum(totals.get(p, 0.0) for p in parts))


def _interventions(rows: list[dict]) -> list[str]:
    return sorted(n for n in part_totals(rows, parts_prefix(rows)) if n not in OWN_PARTS and n != "objective")


def _part_totals(rows: list[dict]) -> dict[str, float]:
    return part_totals(rows, parts_prefix(rows))


def _largest(rows: list[dict], k: int = 3) -> str:
    totals = _part_totals(rows)
    top = sorted(totals, key=lambda n: -abs(totals[n]))[:k]
    return ", ".join(f"{n} {_g(totals[n])}" for n in top)


def _net_text(m: list[dict]) -> str:
    net = sum(float(r["entropy_change/predicted_net"]) for r in m)
    real = sum(float(r.get("entropy_change/realized", float("nan"))) for r in m)
    if parts_prefix(m) == SECOND_ORDER:
        net_2nd = sum(float(r.get("entropy_change/predicted_net_2nd", float("nan"))) for r in m)
        return f"predicted {_g(net_2nd)} to second order ({_g(net)} to first; realised {_g(real)})"
    return f"predicted {_g(net)} (realised {_g(real)})"


def _explain_variant(variant: str, rows: list[dict]) -> str:
    """One seed's sentence: net prediction, realised change, the intervention's own part, the largest
    parts, over the measured steps after the first; then step 1 on its own (``after_first_step``)."""
    m = measured_rows(rows)
    if not m:
        return ""
    later = after_first_step(rows)
    first = [r for r in m if int(r.get("step", 0)) == 1] if len(later) < len(m) else []
    m = later
    label = "measured steps after the first" if first else "measured steps"
    text = f"{len(m)} {label}: {_net_text(m)}; largest parts {_largest(m)}"
    text += _intervention_text(m)
    if first:
        text += (f"; step 1 (AdamW's first, about lr in every coordinate: large parts that cancel): "
                 f"{_net_text(first)}, largest parts {_largest(first)}")
    return text


def _intervention_text(m: list[dict]) -> str:
    text = ""
    ivs = _interventions(m)
    for iv in ivs:
        own = _sum_parts(m, (iv,))
        quad = _sum_parts(m, QUADRANT_PARTS)
        text += f"; {iv}'s own part {_g(own)} against the quadrants' {_g(quad)}"
        if iv == "stare":
            gate = [r for r in m if r.get("stare/gate_on") is not None]
            open_ = [r for r in gate if float(r["stare/gate_on"]) > 0.5]
            if gate:
                text += (f" (gate open on {len(open_)} of {len(gate)} measured steps: there its part "
                         f"{_g(_sum_parts(open_, ('stare',)))}, the quadrants' {_g(_sum_parts(open_, QUADRANT_PARTS))})")
        elif iv in ("clip_cov", "kl_cov"):
            verb = "detached" if iv == "clip_cov" else "penalised"
            text += (f" (without it the {verb} tokens would have moved the probe entropy by {_g(-own)} more"
                     f"{': the intervention raises entropy' if own > 0 else ''})")
        elif iv == "steer":
            w = [float(r["steer/weight_mean"]) for r in m if isinstance(r.get("steer/weight_mean"), (int, float))]
            share = abs(own) / max(sum(abs(v) for v in _part_totals(m).values()), 1e-300)
            text += f" ({share:.0%} of the parts' absolute sum" + (f"; mean token weight {np.mean(w):.3f}" if w else "") + ")"
    return text


def explain_claims(claims: list[dict], runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    """``claims`` with an ``attribution`` entry (``{variant: {seed: sentence}}`` and a short
    ``attribution_text``) where the runs they are about measured it; the others unchanged."""
    for c in claims:
        variants = CLAIM_VARIANTS.get(c["id"])
        if variants is None and c["id"].endswith("_keeps_entropy"):
            variants = (c["id"][: -len("_keeps_entropy")],)
        per = {}
        for v in variants or ():
            sentences = {s: _explain_variant(v, rows) for s, rows in sorted((runs.get(v) or {}).items())}
            sentences = {s: t for s, t in sentences.items() if t}
            if sentences:
                per[v] = sentences
        if per:
            c["attribution"] = per
            first = {v: next(iter(sent.items())) for v, sent in per.items()}
            c["attribution_text"] = " | ".join(f"{v} seed {s}: {t}" for v, (s, t) in first.items())
    return claims
