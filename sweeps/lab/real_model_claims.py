"""The real-model study's claim table (``entropyrl lab --experiment real_model``): does what the lab
shows on the embedded toy happen on a real pretrained model (SmolLM2-135M-Instruct on word problems)?

Pure functions of metric rows (each run's ``metrics.jsonl``), tested on synthetic rows. ``runs`` maps
a variant of ``conf/ablation/real_model.yaml`` (``grpo``, ``stare``, ``clip_cov``, ``kl_cov``, and the
extra ``stare_published``, ``steer``) to ``{seed: rows}``. Every claim is ``{"id", "claim", "measured",
"reproduced", "per_seed"}`` as in ``claims.py``; ``reproduced`` is None, with the missing runs in
``reason``, when the runs a claim needs are not there, and a claim that is not reproduced names the
measured reason (the runs' regime warnings and flags).

- ``real_model_grpo_collapses``: GRPO's collapse flag fires on every seed (``regime.entropy_flags``:
  a step below ``COLLAPSE_RATIO`` x the first tenth's mean), the flag a run's summary carries.
- ``real_model_stare_holds_target``: STARE ends in its band having crossed h_tgt with its gate open on
  at least ``GATE_MIN_OPEN_SHARE`` of the steps (``claims.target_hold``); the share is stated per seed.
- ``real_model_<method>_above_grpo``, one per method of ``METHODS`` (and of ``EXTRA_METHODS`` that ran):
  the method's last tenth of entropy ends above GRPO's on every seed both ran.
- ``real_model_<method>_above_its_schedule``, one per method of ``SCHEDULE_CONTROLS`` whose control ran:
  the same against GRPO on the method's own update schedule, so that only the method's term differs.
- ``real_model_attribution_tracks``: the update's predicted entropy change on the held-out probe
  (``entropy_change/predicted_net``, ``diagnostics.attribution``) tracks the realised one
  (``entropy_change/realized``) over the measured steps after the first, pooled over the variants of a
  seed: the signs agree on at least ``SIGN_SHARE`` of them and the summed prediction is within
  ``SUM_RATIO`` of the summed realised change; the per-variant sums are shown.
- ``real_model_accuracy`` (descriptive): final validation accuracy and pass@k per variant beside
  GRPO's; a method below GRPO's accuracy on every seed is said to cost accuracy, and a method and
  GRPO that both solved every held-out problem are said to be at the ceiling, where no difference
  can show.
- ``real_model_text`` (descriptive): the reflection and repetition metrics of the model's own text
  (``TEXT_KEYS``), first tenth -> last tenth per variant.

Each claim's null control (flat entropy, GRPO's rows under a method's name, a gate that never opened, a
prediction of 0) is declared in ``null_controls.py`` and gives ``reproduced`` False
(``tests/sweeps/test_claim_nulls.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ...trainers.run.regime import COLLAPSE_RATIO, after_first_step, entropy_flags
from .claim_measures import metric_ends
from .claims import BAND, GATE_MIN_OPEN_SHARE, entropy_ends, final_value, stare_hold_claim
from .kit import finite_values, fmt, make_claim, regime_reasons, seeds_with

__all__ = [
    "real_model_claims",
    "accuracy_table",
    "text_table",
    "attribution_pairs",
    "METHODS",
    "EXTRA_METHODS",
    "SCHEDULE_CONTROLS",
    "TEXT_KEYS",
    "SIGN_SHARE",
    "SUM_RATIO",
    "CLAIM_VARIANTS",
]

#: the methods compared with GRPO, one ``real_model_<method>_above_grpo`` claim each: the default variants'
#: always (None when not run), the extra variants' (``EXTRA_METHODS``) only when they ran
METHODS = ("stare", "clip_cov", "kl_cov")
EXTRA_METHODS = ("stare_published", "steer")
#: a method whose runs differ from GRPO's by more than its own term (KL-Cov: two updates a step, as its
#: penalty is 0 on a step's first, on-policy update) -> the variant that runs GRPO on that schedule; a
#: ``real_model_<method>_above_its_schedule`` claim each, emitted when the control ran
SCHEDULE_CONTROLS = {"kl_cov": "grpo_two_updates"}
#: the text metrics of each step's responses (trainers/stats/reflection.py, evals/reflection.py)
TEXT_KEYS = (
    "repetition/score/mean",
    "reflection/density",
    "reflection/frac",
    "reflection/entropy_first",
    "reflection/entropy_at",
    "response_length/mean",
)
SIGN_SHARE = 2 / 3  # the prediction's sign is the realised one's on at least this share of the measured steps
SUM_RATIO = (0.5, 2.0)  # ... and the summed prediction is within this factor of the summed realised change
PREDICTED, REALISED = "entropy_change/predicted_net", "entropy_change/realized"

# claim id -> the variants whose attribution explains it (explain.explain_claims)
CLAIM_VARIANTS = {
    "real_model_grpo_collapses": ("grpo",),
    "real_model_stare_holds_target": ("stare",),
    **{f"real_model_{m}_above_grpo": (m,) for m in (*METHODS, *EXTRA_METHODS)},
    **{f"real_model_{m}_above_its_schedule": (m, c) for m, c in SCHEDULE_CONTROLS.items()},
}


def _not_run(claim: dict, needs: tuple[str, ...], runs: dict) -> dict:
    missing = [v for v in needs if not runs.get(v)]
    if claim["reproduced"] is None and missing:
        claim["reason"] = f"not run: needs the runs of {', '.join(missing)}"
    return claim


def _grpo_collapses(runs: dict, algo_cfgs: dict) -> dict:
    per = []
    for s in seeds_with(runs, "grpo"):
        rows = runs["grpo"][s]
        flag = next((f for f in entropy_flags(rows, algo_cfgs.get("grpo", {})) if f["id"] == "collapse"), None)
        first, last = entropy_ends(rows)
        ent = finite_values(rows, "entropy")
        per.append(
            {
                "seed": s,
                "first_tenth": first,
                "last_tenth": last,
                "min": min(ent) if ent else float("nan"),
                "steps": len(ent),
                "collapse_step": flag["first_step"] if flag else None,
                "ok": flag is not None,
            }
        )
    measured = "; ".join(
        f"seed {p['seed']}: "
        + (
            f"collapse at step {p['collapse_step']}"
            if p["ok"]
            else f"no collapse (lowest {fmt(p['min'])} against {COLLAPSE_RATIO} x {fmt(p['first_tenth'])})"
        )
        + f", {fmt(p['first_tenth'])} -> {fmt(p['last_tenth'])} over {p['steps']} steps"
        for p in per
    )
    claim = make_claim(
        "real_model_grpo_collapses",
        f"GRPO's entropy collapses on the real model: its collapse flag fires on every seed (a step below "
        f"{COLLAPSE_RATIO} x the first tenth's mean)",
        per,
        "ok",
        measured,
        regime_reasons(runs, ("grpo",), algo_cfgs),
    )
    return _not_run(claim, ("grpo",), runs)


def _stare_holds(runs: dict, h_tgt: float, algo_cfgs: dict) -> dict:
    claim = stare_hold_claim(
        runs,
        h_tgt,
        algo_cfgs,
        "real_model_stare_holds_target",
        f"STARE holds its target on the real model: last third within +/-{BAND:.0%} of h_tgt={h_tgt:g}, entropy "
        f"reached h_tgt from its start, and the gate open on at least {GATE_MIN_OPEN_SHARE:.0%} of the steps (the "
        "share per seed is stated)",
    )
    if not claim["per_seed"]:
        claim["measured"] = ""  # no STARE seed: nothing measured
    return _not_run(claim, ("stare",), runs)


def _above(runs: dict, method: str, baseline: str, claim_id: str, text: str, algo_cfgs: dict) -> dict:
    per = []
    for s in seeds_with(runs, baseline, method):
        b, m = entropy_ends(runs[baseline][s])[1], entropy_ends(runs[method][s])[1]
        per.append({"seed": s, f"last_tenth_{baseline}": b, f"last_tenth_{method}": m, "ok": bool(m > b)})
    claim = make_claim(
        claim_id,
        text,
        per,
        "ok",
        (
            "last tenth "
            + ", ".join(f"{fmt(p[f'last_tenth_{method}'])} vs {baseline} {fmt(p[f'last_tenth_{baseline}'])}" for p in per)
        )
        if per
        else "",
        regime_reasons(runs, (method,), algo_cfgs),
    )
    return _not_run(claim, (baseline, method), runs)


def _above_grpo(runs: dict, method: str, algo_cfgs: dict) -> dict:
    text = f"{method}'s entropy ends above GRPO's on the real model: last tenth higher on every seed both ran"
    return _above(runs, method, "grpo", f"real_model_{method}_above_grpo", text, algo_cfgs)


def _above_schedule(runs: dict, method: str, algo_cfgs: dict) -> dict:
    control = SCHEDULE_CONTROLS[method]
    text = (
        f"{method}'s entropy ends above GRPO's on {method}'s own update schedule ({control}: the same trainer and "
        f"optimizer settings, no {method} term): last tenth higher on every seed both ran"
    )
    return _above(runs, method, control, f"real_model_{method}_above_its_schedule", text, algo_cfgs)


def attribution_pairs(rows: list[dict]) -> list[tuple[int, float, float]]:
    """``(step, predicted, realised)`` of the steps that measured the attribution, step 1 left out when
    there are others (``regime.after_first_step``: AdamW's first step), both finite."""
    out = []
    for r in after_first_step(rows):
        p, q = r.get(PREDICTED), r.get(REALISED)
        if isinstance(p, (int, float)) and isinstance(q, (int, float)) and math.isfinite(p) and math.isfinite(q):
            out.append((int(r.get("step", 0)), float(p), float(q)))
    return out


def _attribution(runs: dict) -> dict:
    per = []
    seeds = sorted({s for by_seed in runs.values() for s in by_seed})
    for s in seeds:
        by_variant = {v: attribution_pairs(by_seed[s]) for v, by_seed in runs.items() if s in by_seed}
        by_variant = {v: pairs for v, pairs in by_variant.items() if pairs}
        pairs = [p for v in by_variant.values() for p in v]
        if not pairs:
            continue
        pred = np.array([p for _s, p, _q in pairs])
        real = np.array([q for _s, _p, q in pairs])
        sign_share = float(np.mean(np.sign(pred) == np.sign(real)))
        ratio = float(pred.sum() / real.sum()) if real.sum() != 0 else float("nan")
        lo, hi = SUM_RATIO
        per.append(
            {
                "seed": s,
                "steps": len(pairs),
                "sign_share": sign_share,
                "predicted_sum": float(pred.sum()),
                "realised_sum": float(real.sum()),
                "ratio": ratio,
                "by_variant": {
                    v: {"steps": len(p), "predicted": sum(x for _s, x, _q in p), "realised": sum(q for _s, _x, q in p)}
                    for v, p in by_variant.items()
                },
                "ok": bool(len(pairs) >= 3 and sign_share >= SIGN_SHARE and math.isfinite(ratio) and lo <= ratio <= hi),
            }
        )
    measured = "; ".join(
        f"seed {p['seed']}: sign agrees on {p['sign_share']:.0%} of {p['steps']} measured steps, predicted "
        f"{p['predicted_sum']:+.3g} vs realised {p['realised_sum']:+.3g} ({fmt(p['ratio'])}x); "
        + ", ".join(f"{v} {d['predicted']:+.3g}/{d['realised']:+.3g}" for v, d in p["by_variant"].items())
        for p in per
    )
    claim = make_claim(
        "real_model_attribution_tracks",
        f"The update's predicted entropy change on the probe (entropy_change/predicted_net) tracks the realised one "
        f"on the real model: over the measured steps after the first, pooled over a seed's runs, the signs agree on "
        f"at least {SIGN_SHARE:.0%} and the summed prediction is within {SUM_RATIO[0]:g}-{SUM_RATIO[1]:g}x the summed "
        "realised change (per variant: predicted/realised)",
        per,
        "ok",
        measured,
    )
    if not per:
        claim["reason"] = "not run: no run measured the attribution (diagnostics.attribution=false)"
    return claim


def accuracy_table(runs: dict, pass_key: str) -> list[dict]:
    """Per variant: final ``val/acc``, ``val/pass_at_1`` and ``pass_key`` per seed and their means, and
    against GRPO on the seeds both ran: the mean difference in accuracy and ``costs_accuracy`` (below
    GRPO's final accuracy on every such seed), and ``at_ceiling`` (every seed solved every held-out
    problem: no difference can show)."""
    grpo = runs.get("grpo") or {}
    out = []
    for v, by_seed in runs.items():
        acc = {s: final_value(rows, "val/acc") for s, rows in sorted(by_seed.items())}
        row = {
            "variant": v,
            "seeds": sorted(by_seed),
            "val_acc": list(acc.values()),
            "pass_at_1": [final_value(rows, "val/pass_at_1") for _s, rows in sorted(by_seed.items())],
            "pass_at_k": [final_value(rows, pass_key) for _s, rows in sorted(by_seed.items())],
        }
        diffs = [acc[s] - final_value(grpo[s], "val/acc") for s in acc if s in grpo]
        diffs = [d for d in diffs if math.isfinite(d)]
        row["acc_minus_grpo"] = diffs
        row["costs_accuracy"] = bool(v != "grpo" and diffs and all(d < 0 for d in diffs))
        finite = [a for a in acc.values() if math.isfinite(a)]
        row["at_ceiling"] = bool(finite) and all(a >= 1.0 for a in finite)  # every held-out problem solved
        out.append(row)
    return out


def _mean(vals: list[float]) -> float:
    vals = [v for v in vals if math.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def _accuracy(runs: dict, pass_key: str) -> dict:
    table = accuracy_table(runs, pass_key)
    k = pass_key.split("/")[-1].replace("pass_at_", "pass@")
    grpo_at_ceiling = any(t["variant"] == "grpo" and t["at_ceiling"] for t in table)
    cells = []
    for t in table:
        cell = f"{t['variant']}: val acc {fmt(_mean(t['val_acc']))}, {k} {fmt(_mean(t['pass_at_k']))}"
        if t["variant"] != "grpo" and t["acc_minus_grpo"]:
            cell += f" ({_mean(t['acc_minus_grpo']):+.3g} acc vs grpo"
            cell += ", below on every seed: costs accuracy)" if t["costs_accuracy"] else ")"
            if t["at_ceiling"] and grpo_at_ceiling:
                cell += " [both at the ceiling, every held-out problem solved: this validation cannot tell them apart]"
        cells.append(cell)
    return {
        "id": "real_model_accuracy",
        "claim": f"Final validation accuracy and {k} of each method beside GRPO's, mean over seeds (descriptive, no "
        "direction claimed; a method below GRPO's accuracy on every seed is said to cost accuracy)",
        "measured": "; ".join(cells),
        "reproduced": None,
        "per_seed": table,
        "descriptive": True,
        "costs_accuracy": [t["variant"] for t in table if t["costs_accuracy"]],
        "at_ceiling": [t["variant"] for t in table if t["at_ceiling"]],
    }


def text_table(runs: dict) -> list[dict]:
    """Per variant and ``TEXT_KEYS`` key: the first and last tenth per seed (``claim_measures.metric_ends``)
    and their means over seeds; keys no seed logged are left out."""
    out = []
    for v, by_seed in runs.items():
        for key in TEXT_KEYS:
            ends = {s: metric_ends(rows, key) for s, rows in sorted(by_seed.items())}
            ends = {s: e for s, e in ends.items() if math.isfinite(e[0]) and math.isfinite(e[1])}
            if ends:
                out.append(
                    {
                        "variant": v,
                        "key": key,
                        "seeds": sorted(ends),
                        "first_mean": float(np.mean([e[0] for e in ends.values()])),
                        "last_mean": float(np.mean([e[1] for e in ends.values()])),
                    }
                )
    return out


def _text(runs: dict) -> dict:
    table = text_table(runs)
    by_variant: dict[str, list[str]] = {}
    for t in table:
        by_variant.setdefault(t["variant"], []).append(f"{t['key']} {fmt(t['first_mean'])}->{fmt(t['last_mean'])}")
    return {
        "id": "real_model_text",
        "claim": "Reflection words and repetition in the model's own responses (repetition/score/mean, reflection/*, "
        "response length): first tenth -> last tenth per method, mean over seeds (descriptive, no direction claimed)",
        "measured": "; ".join(f"{v}: " + ", ".join(c) for v, c in by_variant.items()),
        "reproduced": None,
        "per_seed": table,
        "descriptive": True,
    }


def real_model_claims(
    runs: dict[str, dict[int, list[dict]]], *, h_tgt: float, algo_cfgs: dict | None = None, pass_key: str = "val/pass_at_4"
) -> list[dict]:
    """The real-model study's claims (see the module docstring), every id emitted even on no runs."""
    algo_cfgs = algo_cfgs or {}
    return [
        _grpo_collapses(runs, algo_cfgs),
        _stare_holds(runs, h_tgt, algo_cfgs),
        *[_above_grpo(runs, m, algo_cfgs) for m in (*METHODS, *(m for m in EXTRA_METHODS if runs.get(m)))],
        *[_above_schedule(runs, m, algo_cfgs) for m, c in SCHEDULE_CONTROLS.items() if runs.get(c)],
        _attribution(runs),
        _accuracy(runs, pass_key),
        _text(runs),
    ]
