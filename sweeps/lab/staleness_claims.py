"""The staleness study's claim table (``entropyrl lab --experiment staleness``): what bounded
staleness (``trainer.staleness=k``, docs/async.md) does to entropy, measured per seed on the lab task.

Pure functions of metric rows (each run's ``metrics.jsonl``), tested on synthetic rows. ``runs``
maps a variant of ``conf/ablation/staleness.yaml`` to ``{seed: rows}``; a variant is named
``<method>_k<k>[_<tag>]`` (``parse_variant``): the method's lab preset, the staleness ``k`` and the
correction or controller option (``tis``, ``icepop``, ``dec``, ``m2po``, ``behav``) when there is one.
Every claim is ``{"id", "claim", "measured", "reproduced", "per_seed"}`` as in ``claims.py``, and
states its threshold in its text; ``reproduced`` is None, with the missing runs in ``reason``, when
the runs it needs are not in ``runs`` (a partial sweep), and a claim that is not reproduced names the
regime warnings of its runs (``claims._reasons``).

- ``stale_grpo_collapses``: the collapse users of asynchronous RL trainers report (entropy falling
  once the samples come from older weights): GRPO at the grid's largest staleness ends below half
  the entropy of the synchronous run of the same seed; the ratio is measured at every ``k``.
- ``stale_clips_high_entropy_first``: M2PO's observation (Zheng et al. 2025): the importance ratio of
  stale samples leaves the clip range on high-entropy tokens first, so at every ``k >= 1`` the
  stale ratio's clipped share of the top entropy quarter exceeds the bottom quarter's, and grows with
  ``k`` (over GRPO's levels of the grid, ``GRPO_KS``). Stated on the stale ratio itself,
  ``async/stale_clip_frac/entropy_q<i>``: the share of tokens whose ``pi_prox / pi_behav`` (the
  trainer's recompute at step start over the behaviour policy that sampled) leaves
  ``[1 - clip.low, 1 + clip.high]``, per entropy quartile (0 at ``k = 0`` by construction). It was
  stated on ``clip/frac/entropy_q<i>``, the update's clip of ``pi_theta / pi_prox``, which the stale
  ratio never enters (0 on a step's first mini-batch whatever ``k``): restated, and earlier results
  on it withdrawn.
- ``stare_band_by_k``: STARE (gate on the current policy's entropy) holds the lab's band at each
  ``k`` (``claims.target_hold``: the last third in the band, reached from its start, the gate open on
  at least ``claims.GATE_MIN_OPEN_SHARE`` of steps); the claim says the largest ``k`` where it holds on
  every seed, i.e. where it stops holding.
  ``stare_k2_dec_holds_band`` and ``stare_k2_behav_holds_band``: the same band with the decoupled
  correction and with the gate on the behaviour policy's entropy.
- ``corrections_lower_clipping``: at ``k = 2`` the decoupled objective (AReaL) and M2PO's mask each act
  on the stale tokens (their weights differ from 1 or they mask tokens: ``rollout/tis_weight_mean``,
  ``rollout/tis_clip_frac``) and lower the update's clipped share (``clip/frac``: ``pi_theta`` against
  ``pi_prox``, which a correction changes through the gradient it lets through) below GRPO's without a
  correction at the same ``k`` and seed; token TIS and IcePop are measured beside them. Restated: it
  was read as the stale ratio's clipping, but no correction changes ``pi_prox / pi_behav`` itself, so
  the stale ratio's clipped share (``async/stale_clip_frac``, shown beside) is the same with and
  without a correction by construction and a claim that one lowers it could not be true; a
  correction that did nothing (GRPO's rows under its name) fails the "acted" part.
- ``clip_cov_keeps_entropy_stale`` / ``steer_moderates_change_stale``: the lab's claims of Clip-Cov
  (ends above GRPO's entropy) and STEER (a smaller per-step entropy change than GRPO's), each
  against GRPO at the same ``k`` and seed, at ``k = 0`` and at ``k = 2``.
- ``stale_pass_at_k``: descriptive, no direction claimed: final pass@k and accuracy per variant.

Each claim's null control (the staleness or correction did nothing: the ``k = 0`` rows at every ``k``,
GRPO's rows under a correction's or method's name, STARE's gate never open) is declared in
``null_controls.py`` and gives ``reproduced`` False (``tests/sweeps/test_claim_nulls.py``).
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..aggregate import first_step_below, series
from .claims import (
    GATE_KEY,
    GATE_MIN_OPEN_SHARE,
    _claim,
    _fmt,
    _join,
    _reasons,
    _seeds,
    _vals,
    entropy_ends,
    final_value,
    hold_text,
    step_change_std,
    target_hold,
)

__all__ = [
    "staleness_claims",
    "staleness_table",
    "parse_variant",
    "step_mean",
    "last_third",
    "all_or_none",
    "CLAIM_VARIANTS",
    "STALE_K",
    "GRPO_KS",
    "COLLAPSE_RATIO",
    "BAND",
    "STARE_KS",
    "CORRECTION_K",
    "CORRECTIONS",
    "CLAIMED_CORRECTIONS",
    "METHOD_KS",
    "QUARTER_KEYS",
    "STALE_KEY",
    "STALE_QUARTER_KEYS",
    "ACTED_EPS",
]

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
    vals = _vals(rows, key)
    return float(np.mean(vals)) if vals else float("nan")


def last_third(rows: list[dict], key: str = "entropy") -> float:
    """Mean of the last third of ``key``'s finite values (the lab's band measure); NaN when none."""
    vals = _vals(rows, key)
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
    return ", ".join(f"{_fmt(p.get(key, float('nan')))}x" for p in per)


def _grpo_collapse(runs: dict, algo_cfgs: dict) -> dict:
    ks = [k for k in _grpo_ks(runs) if k > 0]
    per = []
    for s in _seeds(runs, "grpo_k0"):
        base = entropy_ends(runs["grpo_k0"][s])[1]
        row: dict = {"seed": s, "last_tenth_k0": base}
        for k in ks:
            by_seed = runs[f"grpo_k{k}"]
            if s in by_seed:
                row[f"last_tenth_k{k}"] = entropy_ends(by_seed[s])[1]
                row[f"ratio_k{k}"] = _ratio(row[f"last_tenth_k{k}"], base)
        r = row.get(f"ratio_k{STALE_K}")
        row["ok"] = None if r is None or not math.isfinite(r) else bool(r < COLLAPSE_RATIO)
        per.append(row)
    measured = "last tenth / k=0 run's (same seed): " + " | ".join(
        f"k={k} " + _ratios_text([p for p in per if f"ratio_k{k}" in p], f"ratio_k{k}") for k in ks
    )
    out = _claim(
        "stale_grpo_collapses",
        f"Staleness collapses GRPO's entropy: at k={STALE_K} the last tenth is < {COLLAPSE_RATIO} x the k=0 run's "
        "last tenth of the same seed (the ratio measured at every k)",
        per,
        "ok",
        measured if per and ks else "",
        _reasons(runs, (f"grpo_k{STALE_K}",), algo_cfgs),
    )
    return _not_run(out, runs, ("grpo_k0", f"grpo_k{STALE_K}"))


def _high_entropy_clipped_first(runs: dict, algo_cfgs: dict) -> dict:
    ks = [k for k in GRPO_KS if runs.get(f"grpo_k{k}")]
    variants = [f"grpo_k{k}" for k in ks]
    missing = [f"grpo_k{k}" for k in GRPO_KS if k not in ks]
    per = []
    if len(ks) >= 2 and ks[-1] >= 1:
        for s in _seeds(runs, *variants):
            row: dict = {"seed": s}
            for k in ks:
                rows = runs[f"grpo_k{k}"][s]
                row[f"q1_k{k}"] = step_mean(rows, STALE_QUARTER_KEYS[0])
                row[f"q4_k{k}"] = step_mean(rows, STALE_QUARTER_KEYS[3])
            top_first = [
                bool(row[f"q4_k{k}"] > row[f"q1_k{k}"]) if _finite(row[f"q4_k{k}"], row[f"q1_k{k}"]) else None
                for k in ks
                if k >= 1
            ]
            grows = [
                bool(row[f"q4_k{b}"] > row[f"q4_k{a}"]) if _finite(row[f"q4_k{a}"], row[f"q4_k{b}"]) else None
                for a, b in zip(ks, ks[1:])
            ]
            row["q4_above_q1"], row["q4_grows"] = all_or_none(top_first), all_or_none(grows)
            # a k of the grid not run leaves the claim open unless a measured k already refutes it
            row["ok"] = all_or_none([row["q4_above_q1"], row["q4_grows"], *([None] if missing else [])])
            per.append(row)
    measured = " | ".join(
        f"k={k}: q4 " + "/".join(_fmt(p[f"q4_k{k}"]) for p in per) + " vs q1 " + "/".join(_fmt(p[f"q1_k{k}"]) for p in per)
        for k in ks
        if per
    )
    out = _claim(
        "stale_clips_high_entropy_first",
        "Stale samples are clipped on high-entropy tokens first (M2PO): at every k >= 1 of the grid "
        f"({', '.join(map(str, GRPO_KS[1:]))}) the share of GRPO's tokens whose stale ratio pi_prox/pi_behav leaves the "
        f"clip range is larger in the top entropy quarter ({STALE_QUARTER_KEYS[3]}, mean over steps) than in the "
        "bottom quarter's (_q1), and the top quarter's grows with k (higher at each k "
        f"of {', '.join(map(str, GRPO_KS))} than at the one below; 0 at k=0), on every seed. Restated on the stale "
        "ratio: it was stated on clip/frac/entropy_q*, the update's pi_theta/pi_prox, which the stale ratio never enters",
        per,
        "ok",
        measured,
        _reasons(runs, tuple(variants), algo_cfgs),
    )
    lacking = [v for v in variants if any(not _vals(r, q) for r in runs[v].values() for q in STALE_QUARTER_KEYS[::3])]
    why = []
    if len(ks) < 2 or ks[-1] < 1:
        why.append("needs GRPO at two k, one >= 1")
    elif not per:
        why.append(f"no seed ran every one of {', '.join(variants)}")
    if lacking:
        why.append(f"{', '.join(lacking)} logged no {STALE_QUARTER_KEYS[0]} or _q4")
    return _not_run(out, runs, tuple(f"grpo_k{k}" for k in GRPO_KS), "; ".join(why))


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
        out["reason"] = _join(
            _band_why(per), _reasons(runs, tuple(f"stare_k{k}" for k in STARE_KS if holds[k] is False), algo_cfgs)
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
    out = _claim(
        f"{variant}_holds_band",
        f"STARE at k={k} {what} holds its band: last third within +/-{BAND:.0%} of h_tgt={h_tgt}, reached from its "
        f"start with the gate open on at least {GATE_MIN_OPEN_SHARE:.0%} of steps, on every seed",
        per,
        "ok",
        measured,
        _join(_band_why(per), _reasons(runs, (variant,), algo_cfgs)),
    )
    return _not_run(out, runs, (variant,))


def _acted(rows: list[dict]) -> bool:
    """Whether a correction acted on a run: its mean weight (``rollout/tis_weight_mean``) differs from 1
    by more than ``ACTED_EPS`` or it truncated or masked tokens (``rollout/tis_clip_frac`` > 0); False
    when it logged neither (GRPO's rows under a correction's name)."""
    w, masked = step_mean(rows, "rollout/tis_weight_mean"), step_mean(rows, "rollout/tis_clip_frac")
    return bool((math.isfinite(w) and abs(w - 1.0) > ACTED_EPS) or (math.isfinite(masked) and masked > 0))


def _clip_free(algo_cfg: dict | None) -> bool:
    """True for a run whose objective has no clip (M2PO's own objective, ``algo.tis.m2po_clip`` false):
    its ``clip/frac`` is 0 whatever it did, so a claim that it lowers the clipped share could not fail."""
    tis = dict((algo_cfg or {}).get("tis") or {})
    return tis.get("mode") == "m2po" and not tis.get("m2po_clip", False)


def _corrections(runs: dict, algo_cfgs: dict) -> dict:
    base = f"grpo_k{CORRECTION_K}"
    present = [c for c in CORRECTIONS if runs.get(f"{base}_{c}")]
    per = []
    for s in _seeds(runs, base):
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
            f"{c} {_fmt(np.mean([p[f'clip_frac_{c}'] for p in vals]))} ({lower}/{len(vals)} seeds lower, acted on "
            f"{acted}/{len(vals)}: removed {_fmt(np.mean([p[f'tis_clip_frac_{c}'] for p in vals]))}, mean weight "
            f"{_fmt(np.mean([p[f'tis_weight_mean_{c}'] for p in vals]))}), stale ratio clipped "
            f"{_fmt(np.mean([p[f'stale_clip_frac_{c}'] for p in vals]))}, entropy {_fmt(np.mean([p[f'last_tenth_{c}'] for p in vals]))}"
        )

    measured = ""
    if per:
        measured = (
            f"update clip/frac none {_fmt(np.mean([p['clip_frac_none'] for p in per]))}, stale ratio clipped "
            f"({STALE_KEY}) {_fmt(np.mean([p['stale_clip_frac_none'] for p in per]))}, entropy last tenth "
            f"{_fmt(np.mean([p['last_tenth_none'] for p in per]))} | "
            + " | ".join(cell(c) for c in present if any(f"clip_frac_{c}" in p for p in per))
            + " (means over seeds)"
        )
    not_acted = [f"{c} seed {p['seed']} did not act" for p in per for c in CLAIMED_CORRECTIONS if p.get(f"acted_{c}") is False]
    clip_free = [c for c in present if c in CLAIMED_CORRECTIONS and _clip_free(algo_cfgs.get(f"{base}_{c}"))]
    out = _claim(
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
        _join("; ".join(not_acted), _reasons(runs, tuple(f"{base}_{c}" for c in present), algo_cfgs)),
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
    seeds = sorted({s for k in METHOD_KS for s in _seeds(runs, f"{method}_k{k}", f"grpo_k{k}")})
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
                f"{_fmt(p[f'std_steer_k{k}'])}/{_fmt(p[f'std_grpo_k{k}'])}" for p in have
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
    out = _claim(cid, text, per, "ok", " | ".join(parts), _reasons(runs, tuple(f"{method}_k{k}" for k in METHOD_KS), algo_cfgs))
    return _not_run(out, runs, tuple(f"{v}_k{k}" for k in METHOD_KS for v in (method, "grpo")))


def _pass_at_k(runs: dict, pass_key: str) -> dict:
    label = pass_key.split("/")[-1].replace("pass_at_", "pass@")
    per = []
    for v, by_seed in runs.items():
        finals = [final_value(rows, pass_key) for _s, rows in sorted(by_seed.items())]
        accs = [final_value(rows, "val/acc") for _s, rows in sorted(by_seed.items())]
        finals_ok, accs_ok = [x for x in finals if math.isfinite(x)], [x for x in accs if math.isfinite(x)]
        if not finals_ok and not accs_ok:
            continue
        per.append(
            {
                "variant": v,
                "seeds": sorted(by_seed),
                pass_key: finals,
                "val/acc": accs,
                "pass_mean": float(np.mean(finals_ok)) if finals_ok else float("nan"),
                "acc_mean": float(np.mean(accs_ok)) if accs_ok else float("nan"),
            }
        )
    return {
        "id": "stale_pass_at_k",
        "claim": f"Final validation {label} and accuracy per variant, mean over seeds (descriptive, no direction claimed)",
        "measured": "; ".join(f"{p['variant']} {label} {_fmt(p['pass_mean'])} acc {_fmt(p['acc_mean'])}" for p in per),
        "reproduced": None,
        "per_seed": per,
        "descriptive": True,
    }


def staleness_claims(
    runs: dict[str, dict[int, list[dict]]],
    *,
    h_tgt: float,
    algo_cfgs: dict | None = None,
    pass_key: str = "val/pass_at_8",
) -> list[dict]:
    """The staleness study's claims (see the module docstring), in the report's order."""
    algo_cfgs = algo_cfgs or {}
    return [
        _grpo_collapse(runs, algo_cfgs),
        _high_entropy_clipped_first(runs, algo_cfgs),
        _stare_band_by_k(runs, h_tgt, algo_cfgs),
        _stare_variant_band(runs, h_tgt, "stare_k2_dec", "with the decoupled correction", algo_cfgs),
        _stare_variant_band(runs, h_tgt, "stare_k2_behav", "with its gate on the behaviour policy's entropy", algo_cfgs),
        _corrections(runs, algo_cfgs),
        _method_vs_grpo(runs, "clip_cov", algo_cfgs),
        _method_vs_grpo(runs, "steer", algo_cfgs),
        _pass_at_k(runs, pass_key),
    ]


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
