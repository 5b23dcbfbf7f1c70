"""The lab's claims explained with the entropy-change attribution.

Every lab run measures ``diagnostics.attribution`` every 10 steps (``lab_common.yaml``):
``entropy_change/predicted_net`` and its parts ``attribution/<part>`` (``q1``-``q4``, ``zero_adv``,
``momentum``, ``weight_decay``, one per intervention by its name, ``kl``, ``other``,
``float_rounding``; ``trainers/stats/update_split.py``). Pure functions of metric rows:

- ``variant_attribution(by_seed)``: per seed, the fit of predicted_net to the realised probe change
  (detrended r, slope) and each part's total and share over the run;
- ``explain_claims(claims, runs)``: adds to each claim an ``attribution`` sentence, measured on the
  runs the claim is about, from the parts (which add up to the trapezoid prediction; the first-order
  parts, ``attribution_1st/<part>``, overshoot the decline at the lab's step sizes): which
  part moved entropy (for STARE: on the steps its gate was open; for
  Clip-Cov / KL-Cov: what their detached or penalised tokens' part was; for STEER: how small its own
  part is), so a reader sees *why* a claim held or not, not only whether.
"""

from __future__ import annotations

import math

import numpy as np

from ...trainers.run.regime import PARTS, after_first_step, attribution_summary, measured_rows, part_totals

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
    """``{"r_detrended": [per seed], "slope": [...], "slope_detrended", "n"`` (the fit of
    ``predicted_net``, the trapezoid), ``"r_detrended_1st", "slope_1st", "slope_detrended_1st"`` (the
    first-order ``predicted_net_1st``'s), ``"total": {part: [...]}, "share": {part: [...]},
    "total_1st", "share_1st"`` (first-order parts), ``"share_after_first"`` (the shares over the
    measured steps after step 1)``}`` over the seeds whose rows hold an attribution; ``{}`` when none
    does."""
    out: dict = {
        "seeds": [],
        "r_detrended": [],
        "slope": [],
        "slope_detrended": [],
        "n": [],
        "r_detrended_1st": [],
        "slope_1st": [],
        "slope_detrended_1st": [],
        "total": {},
        "share": {},
        "total_1st": {},
        "share_1st": {},
        "share_after_first": {},
    }
    summaries = [(s, attribution_summary(rows)) for s, rows in sorted(by_seed.items())]
    summaries = [(s, a) for s, a in summaries if a]
    if not summaries:
        return {}
    parts = sorted({p for _s, a in summaries for p in a["total"]})
    parts_1st = sorted({p for _s, a in summaries for p in a.get("total_1st") or {}})
    parts_after = sorted({p for _s, a in summaries for p in a.get("share_after_first") or {}})
    for s, a in summaries:
        fit = a.get("fit") or {}
        out["seeds"].append(s)
        out["r_detrended"].append(float(fit.get("pearson_r_detrended", float("nan"))))
        out["slope"].append(float(fit.get("slope", float("nan"))))
        out["slope_detrended"].append(float(fit.get("slope_detrended", float("nan"))))
        first = a.get("fit_1st") or {}  # the first-order prediction (stats/attribution.py)
        out["r_detrended_1st"].append(float(first.get("pearson_r_detrended", float("nan"))))
        out["slope_1st"].append(float(first.get("slope", float("nan"))))
        out["slope_detrended_1st"].append(float(first.get("slope_detrended", float("nan"))))
        out["n"].append(int(fit.get("n", 0)))
        for p in parts:
            out["total"].setdefault(p, []).append(float(a["total"].get(p, 0.0)))
            out["share"].setdefault(p, []).append(float(a["share"].get(p, 0.0)))
        for p in parts_1st:
            out["total_1st"].setdefault(p, []).append(float((a.get("total_1st") or {}).get(p, 0.0)))
            out["share_1st"].setdefault(p, []).append(float((a.get("share_1st") or {}).get(p, 0.0)))
        for p in parts_after:  # without AdamW's first step
            out["share_after_first"].setdefault(p, []).append(float((a.get("share_after_first") or {}).get(p, 0.0)))
    return out


def _sum_parts(rows: list[dict], parts) -> float:
    totals = part_totals(rows, PARTS)
    return float(sum(totals.get(p, 0.0) for p in parts))


def _interventions(rows: list[dict]) -> list[str]:
    return sorted(n for n in part_totals(rows, PARTS) if n not in OWN_PARTS and n != "objective")


def _part_totals(rows: list[dict]) -> dict[str, float]:
    return part_totals(rows, PARTS)


def _largest(rows: list[dict], k: int = 3) -> str:
    totals = _part_totals(rows)
    top = sorted(totals, key=lambda n: -abs(totals[n]))[:k]
    return ", ".join(f"{n} {_g(totals[n])}" for n in top)


def _net_text(m: list[dict]) -> str:
    net = sum(float(r["entropy_change/predicted_net"]) for r in m)
    net_1st = sum(float(r.get("entropy_change/predicted_net_1st", float("nan"))) for r in m)
    real = sum(float(r.get("entropy_change/realized", float("nan"))) for r in m)
    return f"predicted {_g(net)} ({_g(net_1st)} to first order; realised {_g(real)})"


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
        text += (
            f"; step 1 (AdamW's first, about lr in every coordinate: large parts that cancel): "
            f"{_net_text(first)}, largest parts {_largest(first)}"
        )
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
                text += (
                    f" (gate open on {len(open_)} of {len(gate)} measured steps: there its part "
                    f"{_g(_sum_parts(open_, ('stare',)))}, the quadrants' {_g(_sum_parts(open_, QUADRANT_PARTS))})"
                )
        elif iv in ("clip_cov", "kl_cov"):
            verb = "detached" if iv == "clip_cov" else "penalised"
            text += (
                f" (without it the {verb} tokens would have moved the probe entropy by {_g(-own)} more"
                f"{': the intervention raises entropy' if own > 0 else ''})"
            )
        elif iv == "steer":
            w = [float(r["steer/weight_mean"]) for r in m if isinstance(r.get("steer/weight_mean"), (int, float))]
            share = abs(own) / max(sum(abs(v) for v in _part_totals(m).values()), 1e-300)
            text += f" ({share:.0%} of the parts' absolute sum" + (f"; mean token weight {np.mean(w):.3f}" if w else "") + ")"
    return text


def explain_claims(
    claims: list[dict], runs: dict[str, dict[int, list[dict]]], claim_variants: dict[str, tuple[str, ...]] | None = None
) -> list[dict]:
    """``claims`` with an ``attribution`` entry (``{variant: {seed: sentence}}`` and a short
    ``attribution_text``) where the runs they are about measured it; the others unchanged.
    ``claim_variants``: another study's claim ids and the variants that explain each, looked up
    before ``CLAIM_VARIANTS`` (the staleness study's, ``staleness_claims.CLAIM_VARIANTS``)."""
    for c in claims:
        variants = (claim_variants or {}).get(c["id"]) or CLAIM_VARIANTS.get(c["id"])
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
