"""Lab claims of issue 22's methods (CE-GPPO, EntroPIC, AEnt, SIREN, Archer, GTPO, Lp-Reg, GMPO;
the others state no entropy claim the lab can measure), measured per seed like ``claims.py``.

A method's claim appears in the table only when its runs are in ``runs`` (``entropyrl lab --algos
all`` or a subset naming it), so the default lab's table is unchanged.
"""

from __future__ import annotations

import numpy as np

from .claims import _claim, _fmt, _reasons, _seeds, _vals, entropy_ends, step_change_std

__all__ = ["method_claims", "HIGHER_THAN_GRPO", "NO_CLAIM"]

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


def _higher(runs: dict, v: str, text: str, algo_cfgs: dict) -> dict:
    per = []
    for s in _seeds(runs, "grpo", v):
        g, e = entropy_ends(runs["grpo"][s])[1], entropy_ends(runs[v][s])[1]
        per.append({"seed": s, "last_tenth_grpo": g, f"last_tenth_{v}": e, "ok": e > g})
    return _claim(f"{v}_keeps_entropy", text, per, "ok", "last tenth " + ", ".join(
        f"{_fmt(p[f'last_tenth_{v}'])} vs grpo {_fmt(p['last_tenth_grpo'])}" for p in per), _reasons(runs, (v,), algo_cfgs))


def _entropic(runs: dict, algo_cfgs: dict) -> dict:
    target = float(((algo_cfgs.get("entropic") or {}).get("entropic") or {}).get("target", 0.1))
    gate = "stare" if runs.get("stare") else None
    per = []
    for s in _seeds(runs, "entropic", *([gate] if gate else [])):
        ent = _vals(runs["entropic"][s], "entropy")
        m = float(np.mean(ent[-max(1, len(ent) // 3):])) if ent else float("nan")
        std_pic = step_change_std(runs["entropic"][s])
        std_gate = step_change_std(runs[gate][s]) if gate else float("nan")
        near = abs(m / target - 1.0) <= 0.3
        per.append({"seed": s, "last_third": m, "target": target, "std_entropic": std_pic, "std_gate": std_gate,
                    "ok": near and (std_pic < std_gate if gate else True)})
    text = (f"EntroPIC holds entropy near its target (last third within +/-30 % of {target})"
            + (" with less oscillation than STARE's gate" if gate else ""))
    return _claim("entropic_holds_target", text, per, "ok", ", ".join(
        f"last third {_fmt(p['last_third'])}, step-change std {_fmt(p['std_entropic'])}"
        + (f" vs gate {_fmt(p['std_gate'])}" if gate else "") for p in per), _reasons(runs, ("entropic",), algo_cfgs))


def method_claims(runs: dict, algo_cfgs: dict | None = None) -> list[dict]:
    """The claims of the issue-22 methods present in ``runs`` (see module docstring)."""
    algo_cfgs = algo_cfgs or {}
    out = []
    if runs.get("entropic"):
        out.append(_entropic(runs, algo_cfgs))
    for v, text in HIGHER_THAN_GRPO.items():
        if runs.get(v):
            out.append(_higher(runs, v, text, algo_cfgs))
    for v, why in NO_CLAIM.items():
        if runs.get(v):
            out.append({"id": f"{v}_no_claim", "claim": f"{v}: no entropy claim ({why})", "measured": "",
                        "reproduced": None, "per_seed": [], "no_claim": True})
    return out
