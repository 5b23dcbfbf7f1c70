"""The staleness study's claims about what holds entropy or fixes the clipping under staleness
(``staleness_claims.py``'s docstring states each): STARE's band at each staleness and with the
decoupled correction or the behaviour policy's gate, the corrections' effect on the update's clipped
share, and Clip-Cov's and STEER's lab claims against GRPO at the same staleness.
"""

from __future__ import annotations

import math

import numpy as np

from .claims import GATE_KEY, GATE_MIN_OPEN_SHARE, entropy_ends, hold_text, step_change_std, target_hold
from .kit import fmt, join_phrases, make_claim, regime_reasons, seeds_with
from .staleness_grid import (
    ACTED_EPS,
    BAND,
    CLAIMED_CORRECTIONS,
    CORRECTION_K,
    CORRECTIONS,
    METHOD_KS,
    STALE_KEY,
    STARE_KS,
    _finite,
    _not_run,
    _ratio,
    _ratios_text,
    all_or_none,
    parse_variant,
    step_mean,
)


def _band_row(variant: str, k: int, s: int, rows: list[dict], h_tgt: float) -> dict:
    """One STARE run against the band (``claims.target_hold``); ``ok`` None when it logged no entropy."""
    hold = target_hold(rows, h_tgt, GATE_KEY, band=BAND)
    ok = hold["ok"] if math.isfinite(hold["last_third"]) else None
    return {"variant": variant, "k": k, "seed": s, "h_tgt": h_tgt, **hold, "ok": ok}


def _band_text(per: list[dict]) -> str:
    return ", ".join(hold_text(p) for p in per if math.isfinite(p["rel_error"]))


def _band_why(per: list[dict]) -> str:
    return "; ".join(f"{p['variant']} seed {p['seed']}: {p['why_not']}" for p in per if p["ok"] is False and p["why_not"])


def _stare_band_by_k(runs: dict, h_tgt: float, algo_cfgs: dict) -> dict:
    per = []
    for k in STARE_KS:
        v = f"stare_k{k}"
        per += [_band_row(v, k, s, rows, h_tgt) for s, rows in sorted((runs.get(v) or {}).items())]
    holds = {k: all_or_none([p["ok"] for p in per if p["k"] == k]) for k in STARE_KS}
    up_to = None  # the largest k up to which it holds at every k of the grid on every seed
    for k in STARE_KS:
        if holds[k] is not True:
            break
        up_to = k
    stops = next((k for k in STARE_KS if holds[k] is False), None)
    reproduced = all_or_none([holds[k] for k in STARE_KS])
    measured_ks = [k for k in STARE_KS if holds[k] is not None]
    measured = " | ".join(f"k={k}: " + _band_text([p for p in per if p["k"] == k]) for k in measured_ks)
    if measured_ks:
        verdict = [f"holds on every seed up to k={up_to}" if up_to is not None else ""]
        verdict.append(f"stops at k={stops}" if stops is not None else "")
        unknown = [k for k in STARE_KS if holds[k] is None]
        verdict.append(f"not measured at k={', '.join(map(str, unknown))}" if unknown else "")
        measured += "; " + ", ".join(x for x in verdict if x)
    out = {
        "id": "stare_band_by_k",
        "claim": f"STARE (gate on the current policy's entropy) holds its band at every staleness of the grid: last "
        f"third within +/-{BAND:.0%} of h_tgt={h_tgt}, reached from its start with the gate open on at least "
        f"{GATE_MIN_OPEN_SHARE:.0%} of steps, at k = {', '.join(map(str, STARE_KS))} on every seed "
        "(measured: the largest k where it holds, where it stops)",
        "measured": measured,
        "reproduced": reproduced,
        "per_seed": per,
        "holds_by_k": {str(k): holds[k] for k in STARE_KS},
        "holds_up_to_k": up_to,
        "stops_at_k": stops,
    }
    if reproduced is False:
        out["reason"] = join_phrases(
            _band_why(per), regime_reasons(runs, tuple(f"stare_k{k}" for k in STARE_KS if holds[k] is False), algo_cfgs)
        )
    return _not_run(out, runs, tuple(f"stare_k{k}" for k in STARE_KS))


def _stare_variant_band(runs: dict, h_tgt: float, variant: str, what: str, algo_cfgs: dict) -> dict:
    k = parse_variant(variant)[1]
    per = [_band_row(variant, k, s, rows, h_tgt) for s, rows in sorted((runs.get(variant) or {}).items())]
    ref = [_band_row(f"stare_k{k}", k, s, rows, h_tgt) for s, rows in sorted((runs.get(f"stare_k{k}") or {}).items())]
    measured = ""
    if per:
        measured = (
            "last third " + _band_text(per) + (f"; stare_k{k} (gate on the current policy) " + _band_text(ref) if ref else "")
        )
    out = make_claim(
        f"{variant}_holds_band",
        f"STARE at k={k} {what} holds its band: last third within +/-{BAND:.0%} of h_tgt={h_tgt}, reached from its "
        f"start with the gate open on at least {GATE_MIN_OPEN_SHARE:.0%} of steps, on every seed",
        per,
        "ok",
        measured,
        join_phrases(_band_why(per), regime_reasons(runs, (variant,), algo_cfgs)),
    )
    return _not_run(out, runs, (variant,))


def _acted(rows: list[dict]) -> bool:
    """Whether a correction acted on a run: its mean weight (``rollout/tis_weight_mean``) differs from 1
    by more than ``ACTED_EPS`` or it truncated or masked tokens (``rollout/tis_clip_frac`` > 0); False
    when it logged neither (GRPO's rows under a correction's name)."""
    w, masked = step_mean(rows, "rollout/tis_weight_mean"), step_mean(rows, "rollout/tis_clip_frac")
    return bool((math.isfinite(w) and abs(w - 1.0) > ACTED_EPS) or (math.isfinite(masked) and masked > 0))


def _clip_free(algo_cfg: dict | None) -> bool:
    """True for a run whose objective has no clip (M2PO's own objective, ``algo.tis.m2po_clip`` false or left out):
    its ``clip/frac`` is 0 whatever it did, so a claim that it lowers the clipped share could not fail."""
    tis = dict((algo_cfg or {}).get("tis") or {})
    return tis.get("mode") == "m2po" and not tis.get("m2po_clip")


def _corrections(runs: dict, algo_cfgs: dict) -> dict:
    base = f"grpo_k{CORRECTION_K}"
    present = [c for c in CORRECTIONS if runs.get(f"{base}_{c}")]
    per = []
    for s in seeds_with(runs, base):
        row: dict = {
            "seed": s,
            "clip_frac_none": step_mean(runs[base][s], "clip/frac"),
            "stale_clip_frac_none": step_mean(runs[base][s], STALE_KEY),
            "last_tenth_none": entropy_ends(runs[base][s])[1],
        }
        oks = []
        for c in present:
            rows = runs[f"{base}_{c}"].get(s)
            if rows is None:
                oks += [None] if c in CLAIMED_CORRECTIONS else []
                continue
            row[f"clip_frac_{c}"] = step_mean(rows, "clip/frac")
            row[f"stale_clip_frac_{c}"] = step_mean(rows, STALE_KEY)  # the same ratio as without: shown, not claimed
            row[f"last_tenth_{c}"] = entropy_ends(rows)[1]
            row[f"tis_clip_frac_{c}"] = step_mean(rows, "rollout/tis_clip_frac")  # what the correction itself removed
            row[f"tis_weight_mean_{c}"] = step_mean(rows, "rollout/tis_weight_mean")
            row[f"acted_{c}"] = _acted(rows)
            if c in CLAIMED_CORRECTIONS:
                a, b = row[f"clip_frac_{c}"], row["clip_frac_none"]
                lower = bool(a < b) if _finite(a, b) else None
                if _clip_free(algo_cfgs.get(f"{base}_{c}")):
                    lower = None  # no clip in the objective: clip/frac is 0 by construction, nothing to compare
                oks.append(False if not row[f"acted_{c}"] else lower)
        oks += [None for c in CLAIMED_CORRECTIONS if c not in present]
        row["ok"] = all_or_none(oks)
        per.append(row)

    def cell(c: str) -> str:
        vals = [p for p in per if f"clip_frac_{c}" in p]
        lower = sum(p[f"clip_frac_{c}"] < p["clip_frac_none"] for p in vals)
        acted = sum(bool(p[f"acted_{c}"]) for p in vals)
        return (
            f"{c} {fmt(np.mean([p[f'clip_frac_{c}'] for p in vals]))} ({lower}/{len(vals)} seeds lower, acted on "
            f"{acted}/{len(vals)}: removed {fmt(np.mean([p[f'tis_clip_frac_{c}'] for p in vals]))}, mean weight "
            f"{fmt(np.mean([p[f'tis_weight_mean_{c}'] for p in vals]))}), stale ratio clipped "
            f"{fmt(np.mean([p[f'stale_clip_frac_{c}'] for p in vals]))}, entropy {fmt(np.mean([p[f'last_tenth_{c}'] for p in vals]))}"
        )

    measured = ""
    if per:
        measured = (
            f"update clip/frac none {fmt(np.mean([p['clip_frac_none'] for p in per]))}, stale ratio clipped "
            f"({STALE_KEY}) {fmt(np.mean([p['stale_clip_frac_none'] for p in per]))}, entropy last tenth "
            f"{fmt(np.mean([p['last_tenth_none'] for p in per]))} | "
            + " | ".join(cell(c) for c in present if any(f"clip_frac_{c}" in p for p in per))
            + " (means over seeds)"
        )
    not_acted = [f"{c} seed {p['seed']} did not act" for p in per for c in CLAIMED_CORRECTIONS if p.get(f"acted_{c}") is False]
    clip_free = [c for c in present if c in CLAIMED_CORRECTIONS and _clip_free(algo_cfgs.get(f"{base}_{c}"))]
    out = make_claim(
        "corrections_lower_clipping",
        f"At k={CORRECTION_K} the decoupled objective (AReaL) and M2PO's second-moment mask each act on the stale "
        "tokens (weights != 1 or tokens masked: rollout/tis_weight_mean, rollout/tis_clip_frac) and lower the update's "
        "clipped share (clip/frac, pi_theta against pi_prox, mean over steps) below GRPO's without a correction, on "
        "every seed; token TIS and IcePop are measured beside them (no direction claimed), with each one's entropy last "
        f"tenth. Restated: no correction changes the stale ratio pi_prox/pi_behav, so its clipped share ({STALE_KEY}, "
        "shown) is the same with and without one by construction and is not what this claims",
        per,
        "ok",
        measured,
        join_phrases("; ".join(not_acted), regime_reasons(runs, tuple(f"{base}_{c}" for c in present), algo_cfgs)),
    )
    out["restated"] = (
        "earlier stated as the corrections lowering the clipping of stale samples; the stale ratio pi_prox/pi_behav "
        "does not depend on the correction, so the claim is now on the update's clip/frac, and a correction must "
        "have acted"
    )
    extra = (
        f"{', '.join(clip_free)} ran the clip-free objective (algo.tis.m2po_clip=false): clip/frac is 0 by construction, "
        "so the comparison is made only with algo.tis.m2po_clip=true"
        if clip_free
        else ""
    )
    return _not_run(out, runs, (base, *(f"{base}_{c}" for c in CLAIMED_CORRECTIONS)), extra)


def _method_vs_grpo(runs: dict, method: str, algo_cfgs: dict) -> dict:
    """Clip-Cov: last tenth above GRPO's; STEER: per-step entropy change std below GRPO's; at each k of
    ``METHOD_KS`` against GRPO at the same k and seed."""
    steer = method == "steer"
    per = []
    seeds = sorted({s for k in METHOD_KS for s in seeds_with(runs, f"{method}_k{k}", f"grpo_k{k}")})
    for s in seeds:
        row: dict = {"seed": s}
        oks = []
        for k in METHOD_KS:
            m_rows, g_rows = (runs.get(f"{method}_k{k}") or {}).get(s), (runs.get(f"grpo_k{k}") or {}).get(s)
            if m_rows is None or g_rows is None:
                oks.append(None)
                continue
            row[f"last_tenth_ratio_k{k}"] = _ratio(entropy_ends(m_rows)[1], entropy_ends(g_rows)[1])
            if steer:
                a, b = step_change_std(m_rows), step_change_std(g_rows)
                row[f"std_steer_k{k}"], row[f"std_grpo_k{k}"] = a, b
                oks.append(bool(a < b) if _finite(a, b) else None)
            else:
                r = row[f"last_tenth_ratio_k{k}"]
                oks.append(bool(r > 1.0) if math.isfinite(r) else None)
        row["ok"] = all_or_none(oks)
        per.append(row)
    parts = []
    for k in METHOD_KS:
        have = [p for p in per if f"last_tenth_ratio_k{k}" in p]
        if not have:
            continue
        text = f"k={k}: last tenth / grpo's {_ratios_text(have, f'last_tenth_ratio_k{k}')}"
        if steer:
            text += ", step-change std steer/grpo " + ", ".join(
                f"{fmt(p[f'std_steer_k{k}'])}/{fmt(p[f'std_grpo_k{k}'])}" for p in have
            )
        parts.append(text)
    ks = " and ".join(f"k={k}" for k in METHOD_KS)
    if steer:
        cid = "steer_moderates_change_stale"
        text = (
            f"STEER's per-step entropy change has a lower std than GRPO's (the lab's steer_moderates_change) at {ks}, "
            "against GRPO at the same k and seed; the last tenth ratio to GRPO's beside it"
        )
    else:
        cid = f"{method}_keeps_entropy_stale"
        text = (
            f"Clip-Cov ends with higher entropy than GRPO (last tenth ratio > 1, the lab's cov_keeps_entropy) at {ks}, "
            "against GRPO at the same k and seed"
        )
    out = make_claim(
        cid, text, per, "ok", " | ".join(parts), regime_reasons(runs, tuple(f"{method}_k{k}" for k in METHOD_KS), algo_cfgs)
    )
    return _not_run(out, runs, tuple(f"{v}_k{k}" for k in METHOD_KS for v in (method, "grpo")))
