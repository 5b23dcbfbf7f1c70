"""Lab claims of the newer methods (CE-GPPO, EntroPIC, AEnt, SIREN, Archer, GTPO, Lp-Reg, GMPO;
the others state no entropy claim the lab can measure), measured per seed like ``claims.py``.

A method's claim appears in the table only when its runs are in ``runs`` (``entropyrl lab --algos
all`` or a subset naming it), so the default lab's table is unchanged. A claim that is not
reproduced names the measured reason: the regime warnings and flags (``claims._reasons``) and the
method's own lever as it was logged (``method_levers``: what it selected, its coefficient or
weights), with a finding id when the lever was inert (selected nothing, sat at a bound, weights ~1).
"""

from __future__ import annotations

import math

import numpy as np

from .claims import _claim, _fmt, _join, _reasons, _seeds, _vals, entropy_ends, step_change_std

__all__ = ["method_claims", "method_levers", "HIGHER_THAN_GRPO", "NO_CLAIM", "LEVERS"]

# method -> the paper's claim that its entropy ends above GRPO's (the lab's reading of it)
HIGHER_THAN_GRPO = {
    "ce_gppo": "CE-GPPO keeps entropy higher than clipping alone: ends above GRPO",
    "aent": "AEnt's clamped, adaptive bonus keeps entropy from collapsing: ends above GRPO",
    "siren": "SIREN's masked, anchored regulariser keeps entropy from collapsing: ends above GRPO",
    "archer": "Archer's dual-token constraints keep entropy higher than GRPO",
    "gtpo": "GTPO's entropy-shaped token rewards keep entropy higher than GRPO",
    "lp_reg": "Lp-Reg protects low-probability tokens: entropy ends above GRPO",
    "gmpo": "GMPO's geometric mean keeps entropy higher than GRPO's arithmetic mean",
}
NO_CLAIM = {
    "entropy_adv": "its claims are on reasoning length and pass@k, not an entropy level",
    "gspo": "its claim is on the sampler/trainer mismatch (vLLM), which the lab's hf rollout does not have",
    "cispo": "its claims are on training efficiency",
    "sapo": "its claims are on training stability and accuracy",
}
# method -> its logged lever: (metric, what it is, "frac" = a share of tokens it selects | "value")
LEVERS = {
    "ce_gppo": (
        ("ce_gppo/low_frac", "out-of-clip tokens kept, A<0 side", "frac"),
        ("ce_gppo/high_frac", "out-of-clip tokens kept, A>0 side", "frac"),
    ),
    "entropic": (
        ("entropic/alpha", "alpha", "value"),
        ("entropic/high_frac", "high-probability tokens", "frac"),
        ("entropic/pos_high_frac", "high-probability A>0 tokens", "frac"),
        ("entropic/neg_high_frac", "high-probability A<0 tokens", "frac"),
    ),
    "aent": (("aent/coef", "coef", "value"), ("aent/clamped_entropy", "clamped entropy", "value")),
    "siren": (
        ("siren/regulated_entropy", "regulated entropy", "value"),
        ("siren/anchor", "anchor", "value"),
        ("siren/peak_frac", "peak tokens", "frac"),
    ),
    "archer": (("archer/high_frac", "high-entropy tokens", "frac"), ("archer/kl_low", "KL of the low-entropy tokens", "value")),
    "entropy_adv": (
        ("entropy_adv/psi_mean", "entropy term psi", "value"),
        ("entropy_adv/clip_frac", "tokens capped at |A|/kappa", "frac"),
    ),
    "gtpo": (("gtpo/share_max", "largest token share n_t x / sum x", "value"),),
    "lp_reg": (("lp_reg/frac", "protected tokens", "frac"),),
    "gmpo": (("clip/frac", "log-ratios clipped", "frac"),),
}
# an added loss term below this share of the policy loss's mean magnitude is reported as negligible
ADDED_TERMS = {"aent": "loss/aent", "siren": "loss/siren", "lp_reg": "loss/lp_reg"}
EMPTY_FRAC = 1e-3  # a selection below 0.1 % of the tokens on average selected nothing
SMALL_TERM = 0.01  # an added term < 1 % of |policy loss|
UNIT_WEIGHTS = 0.02  # EntroPIC's mean |alpha| below this: its weights 1 -/+ alpha are ~1
FINAL = ("entropic/alpha", "aent/coef")  # controllers: where they ended says whether they had converged


def _cfg(algo_cfgs: dict, v: str) -> dict:
    return (algo_cfgs.get(v) or {}).get(v) or {}


def _at(vals: list[float], bound: float | None) -> float:
    """Share of ``vals`` at ``bound`` (to 1e-9)."""
    if bound is None or not vals:
        return 0.0
    return float(np.mean([abs(x - float(bound)) <= 1e-9 for x in vals]))


def _inert(v: str, per_seed_rows: list[list[dict]], cfg: dict) -> list[str]:
    """Finding ids (with their numbers) of the ways ``v``'s lever was inert on the seeds' rows."""
    found = []
    for key, what, kind in LEVERS.get(v, ()):
        means = [float(np.mean(x)) for x in (_vals(r, key) for r in per_seed_rows) if x]
        if kind == "frac" and means and max(means) < EMPTY_FRAC:
            found.append(f"{v}_selects_nothing ({what}: {max(means):.2%} at most)")
    alphas = [a for r in per_seed_rows for a in _vals(r, "entropic/alpha")]
    if v == "entropic" and alphas:
        if _at([abs(a) for a in alphas], cfg.get("alpha_max")) > 0.5:
            found.append(
                f"entropic_alpha_at_bound (|alpha| = alpha_max {cfg.get('alpha_max')} on "
                f"{_at([abs(a) for a in alphas], cfg.get('alpha_max')):.0%} of steps)"
            )
        if float(np.mean(np.abs(alphas))) < UNIT_WEIGHTS:
            found.append(f"entropic_weights_near_1 (mean |alpha| {np.mean(np.abs(alphas)):.3f})")
    coefs = [c for r in per_seed_rows for c in _vals(r, "aent/coef")]
    if v == "aent" and coefs:
        for bound, name in ((cfg.get("coef_max"), "max"), (cfg.get("coef_min"), "min")):
            if _at(coefs, bound) > 0.5:
                found.append(f"aent_coef_at_{name} (coef = {bound} on {_at(coefs, bound):.0%} of steps)")
        if max(coefs) - min(coefs) <= 1e-12:
            found.append(
                f"aent_coef_never_moved (coef {coefs[0]:g} throughout: the clamped entropy stayed in "
                f"[{cfg.get('low')}, {cfg.get('high')}])"
            )
    if v in ADDED_TERMS:
        term = [abs(x) for r in per_seed_rows for x in _vals(r, ADDED_TERMS[v])]
        pol = [abs(x) for r in per_seed_rows for x in _vals(r, "loss/policy")]
        if term and pol and np.mean(pol) > 0 and np.mean(term) < SMALL_TERM * np.mean(pol):
            found.append(f"{v}_term_negligible ({ADDED_TERMS[v]} {np.mean(term):.2g} vs |loss/policy| {np.mean(pol):.2g})")
    return found


def method_levers(runs: dict, v: str, algo_cfgs: dict) -> str:
    """``v``'s lever as measured: each logged lever's mean over the run per seed, then the inert
    findings; ``""`` when ``v`` logs none."""
    per_seed_rows = [rows for _s, rows in sorted((runs.get(v) or {}).items())]
    parts = []
    for key, what, kind in LEVERS.get(v, ()):
        means = [float(np.mean(x)) if x else float("nan") for x in (_vals(r, key) for r in per_seed_rows)]
        if any(math.isfinite(m) for m in means):
            cell = "/".join("nan" if not math.isfinite(m) else (f"{m:.2%}" if kind == "frac" else f"{m:.3g}") for m in means)
            if key in FINAL:
                cell += (
                    " (final " + "/".join(f"{r[-1]:.3g}" if r else "nan" for r in (_vals(x, key) for x in per_seed_rows)) + ")"
                )
            parts.append(f"{what} {cell}")
    if v in ADDED_TERMS:
        ratios = []
        for r in per_seed_rows:
            term, pol = _vals(r, ADDED_TERMS[v]), _vals(r, "loss/policy")
            ratios.append(
                float(np.mean(np.abs(term)) / np.mean(np.abs(pol))) if term and pol and np.mean(np.abs(pol)) > 0 else float("nan")
            )
        if any(math.isfinite(x) for x in ratios):
            parts.append(f"{ADDED_TERMS[v]} size over loss/policy size (mean abs) " + "/".join(_fmt(x) for x in ratios))
    levers = f"{v}: mean over steps per seed: " + ", ".join(parts) if parts else ""
    return _join(levers, "; ".join(_inert(v, per_seed_rows, _cfg(algo_cfgs, v))))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if math.isfinite(a) and math.isfinite(b) and b > 0 else "nan"


def _higher(runs: dict, v: str, text: str, algo_cfgs: dict) -> dict:
    per = []
    for s in _seeds(runs, "grpo", v):
        g, e = entropy_ends(runs["grpo"][s])[1], entropy_ends(runs[v][s])[1]
        per.append({"seed": s, "last_tenth_grpo": g, f"last_tenth_{v}": e, "ok": e > g})
    return _claim(
        f"{v}_keeps_entropy",
        text,
        per,
        "ok",
        "last tenth "
        + ", ".join(
            f"{_fmt(p[f'last_tenth_{v}'])} vs grpo {_fmt(p['last_tenth_grpo'])} ({_ratio(p[f'last_tenth_{v}'], p['last_tenth_grpo'])})"
            for p in per
        ),
        _join(_reasons(runs, (v,), algo_cfgs), method_levers(runs, v, algo_cfgs)),
    )


def _entropic(runs: dict, algo_cfgs: dict) -> dict:
    target = float(_cfg(algo_cfgs, "entropic").get("target", 0.1))
    gate = "stare" if runs.get("stare") else None
    per = []
    for s in _seeds(runs, "entropic", *([gate] if gate else [])):
        ent = _vals(runs["entropic"][s], "entropy")
        m = float(np.mean(ent[-max(1, len(ent) // 3) :])) if ent else float("nan")
        std_pic = step_change_std(runs["entropic"][s])
        std_gate = step_change_std(runs[gate][s]) if gate else float("nan")
        near = abs(m / target - 1.0) <= 0.3
        per.append(
            {
                "seed": s,
                "last_third": m,
                "target": target,
                "std_entropic": std_pic,
                "std_gate": std_gate,
                "near_target": near,
                "ok": near and (std_pic < std_gate if gate else True),
            }
        )
    text = f"EntroPIC holds entropy near its target (last third within +/-30 % of {target})" + (
        " with less oscillation than STARE's gate" if gate else ""
    )
    return _claim(
        "entropic_holds_target",
        text,
        per,
        "ok",
        ", ".join(
            f"last third {_fmt(p['last_third'])} ({p['last_third'] / target - 1.0:+.0%}), step-change std {_fmt(p['std_entropic'])}"
            + (f" vs gate {_fmt(p['std_gate'])}" if gate else "")
            for p in per
        ),
        _join(_reasons(runs, ("entropic",), algo_cfgs), method_levers(runs, "entropic", algo_cfgs)),
    )


def method_claims(runs: dict, algo_cfgs: dict | None = None) -> list[dict]:
    """The claims of the newer methods present in ``runs`` (see module docstring)."""
    algo_cfgs = algo_cfgs or {}
    out = []
    if runs.get("entropic"):
        out.append(_entropic(runs, algo_cfgs))
    for v, text in HIGHER_THAN_GRPO.items():
        if runs.get(v):
            out.append(_higher(runs, v, text, algo_cfgs))
    for v, why in NO_CLAIM.items():
        if runs.get(v):
            out.append(
                {
                    "id": f"{v}_no_claim",
                    "claim": f"{v}: no entropy claim ({why})",
                    "measured": _no_claim_measured(runs, v),
                    "reproduced": None,
                    "per_seed": [],
                    "no_claim": True,
                }
            )
    return out


def _no_claim_measured(runs: dict, v: str) -> str:
    """What the lab still measured for a method without a claim: its last-tenth entropy beside GRPO's."""
    ends = [(entropy_ends(runs[v][s])[1], entropy_ends(runs["grpo"][s])[1]) for s in _seeds(runs, "grpo", v)]
    return ("last tenth " + ", ".join(f"{_fmt(e)} vs grpo {_fmt(g)}" for e, g in ends)) if ends else ""
