"""The staleness study's claim table (``entropyrl lab --experiment staleness``): what bounded
staleness (``trainer.staleness=k``, docs/async.md) does to entropy, measured per seed on the lab task.

Pure functions of metric rows (each run's ``metrics.jsonl``), tested on synthetic rows. ``runs``
maps a variant of ``conf/ablation/staleness.yaml`` to ``{seed: rows}``; a variant is named
``<method>_k<k>[_<tag>]`` (``parse_variant``): the method's lab preset, the staleness ``k`` and the
correction or controller option (``tis``, ``icepop``, ``dec``, ``m2po``, ``behav``) when there is one.
Every claim is ``{"id", "claim", "measured", "reproduced", "per_seed"}`` as in ``claims.py``, and
states its threshold in its text; ``reproduced`` is None, with the missing runs in ``reason``, when
the runs it needs are not in ``runs`` (a partial sweep), and a claim that is not reproduced names the
regime warnings of its runs (``kit.regime_reasons``).

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

The grid, its measures and the per-variant table are ``staleness_grid.py``'s; the claims on STARE, the
corrections, Clip-Cov and STEER are ``staleness_remedies.py``'s; every public name is importable from here.
"""

from __future__ import annotations

import math

import numpy as np

from .claims import entropy_ends, final_value
from .kit import finite_values, fmt, make_claim, regime_reasons, seeds_with
from .staleness_grid import (
    ACTED_EPS,
    BAND,
    CLAIM_VARIANTS,
    CLAIMED_CORRECTIONS,
    COLLAPSE_RATIO,
    CORRECTION_K,
    CORRECTIONS,
    GRPO_KS,
    METHOD_KS,
    QUARTER_KEYS,
    STALE_K,
    STALE_KEY,
    STALE_QUARTER_KEYS,
    STARE_KS,
    _finite,
    _grpo_ks,
    _not_run,
    _ratio,
    _ratios_text,
    all_or_none,
    last_third,
    parse_variant,
    staleness_table,
    step_mean,
)
from .staleness_remedies import _corrections, _method_vs_grpo, _stare_band_by_k, _stare_variant_band

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


def _grpo_collapse(runs: dict, algo_cfgs: dict) -> dict:
    ks = [k for k in _grpo_ks(runs) if k > 0]
    per = []
    for s in seeds_with(runs, "grpo_k0"):
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
    out = make_claim(
        "stale_grpo_collapses",
        f"Staleness collapses GRPO's entropy: at k={STALE_K} the last tenth is < {COLLAPSE_RATIO} x the k=0 run's "
        "last tenth of the same seed (the ratio measured at every k)",
        per,
        "ok",
        measured if per and ks else "",
        regime_reasons(runs, (f"grpo_k{STALE_K}",), algo_cfgs),
    )
    return _not_run(out, runs, ("grpo_k0", f"grpo_k{STALE_K}"))


def _high_entropy_clipped_first(runs: dict, algo_cfgs: dict) -> dict:
    ks = [k for k in GRPO_KS if runs.get(f"grpo_k{k}")]
    variants = [f"grpo_k{k}" for k in ks]
    missing = [f"grpo_k{k}" for k in GRPO_KS if k not in ks]
    per = []
    if len(ks) >= 2 and ks[-1] >= 1:
        for s in seeds_with(runs, *variants):
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
        f"k={k}: q4 " + "/".join(fmt(p[f"q4_k{k}"]) for p in per) + " vs q1 " + "/".join(fmt(p[f"q1_k{k}"]) for p in per)
        for k in ks
        if per
    )
    out = make_claim(
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
        regime_reasons(runs, tuple(variants), algo_cfgs),
    )
    lacking = [v for v in variants if any(not finite_values(r, q) for r in runs[v].values() for q in STALE_QUARTER_KEYS[::3])]
    why = []
    if len(ks) < 2 or ks[-1] < 1:
        why.append("needs GRPO at two k, one >= 1")
    elif not per:
        why.append(f"no seed ran every one of {', '.join(variants)}")
    if lacking:
        why.append(f"{', '.join(lacking)} logged no {STALE_QUARTER_KEYS[0]} or _q4")
    return _not_run(out, runs, tuple(f"grpo_k{k}" for k in GRPO_KS), "; ".join(why))


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
        "measured": "; ".join(f"{p['variant']} {label} {fmt(p['pass_mean'])} acc {fmt(p['acc_mean'])}" for p in per),
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
