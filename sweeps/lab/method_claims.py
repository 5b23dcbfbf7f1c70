"""Lab claims of the methods that declare one (``lab_claim`` on an intervention, or given to
``register_objective``; ``trainers/algos/lab_claim.py``), measured per seed like ``claims.py``. The
original methods' claims (STARE, STEER, Clip-Cov/KL-Cov) are ``claims.py``'s.

A method's claim appears in the table only when its runs are in ``runs`` (``entropyrl lab --algos
all`` or a subset naming it), so the default lab's table is unchanged. A claim that is not
reproduced names the measured reason: the regime warnings and flags (``kit.regime_reasons``) and the
method's own levers as they were logged (``method_levers``: what it selected, its coefficient or
weights), with a finding id when a lever was inert (selected nothing, sat at a bound, weights ~1).

Each claim fails on its null control (``null_controls.py``): ``<m>_keeps_entropy`` on GRPO's rows
under the method's name (equal ends are not "above"), ``<m>_holds_target`` on a run whose entropy sat
near the target from its first step while the method's acted metric (``Intervention.acted_key``) stayed
0: holding needs the target reached from the start and the method acting (``claims.target_hold``).
"""

from __future__ import annotations

import math

import numpy as np

from ...conf import intervention_defaults
from ...trainers.algos.lab_claim import LabClaim
from ...trainers.algos.objectives import OBJECTIVE_LAB_CLAIMS
from ...trainers.interventions import INTERVENTIONS
from .claims import BAND, GATE_MIN_OPEN_SHARE, entropy_ends, hold_text, step_change_std, target_hold
from .kit import finite_values, fmt, join_phrases, make_claim, regime_reasons, seeds_with

__all__ = ["method_claims", "method_levers", "registered_lab_claims"]

EMPTY_FRAC = 1e-3  # a selection below 0.1 % of the tokens on average selected nothing
SMALL_TERM = 0.01  # an added term < 1 % of |policy loss|
UNIT_WEIGHTS = 0.02  # EntroPIC's mean |alpha| below this: its weights 1 -/+ alpha are ~1


def registered_lab_claims() -> dict[str, LabClaim]:
    """``method name -> LabClaim`` of every registered intervention and objective that declares one
    (the lab's variant of a method carries the method's name)."""
    out = {name: cls.lab_claim for name, cls in INTERVENTIONS.items() if getattr(cls, "lab_claim", None) is not None}
    out.update(OBJECTIVE_LAB_CLAIMS)
    return out


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
    claim = registered_lab_claims().get(v)
    for lever in claim.levers if claim else ():
        key, what, kind = lever.metric, lever.what, lever.kind
        means = [float(np.mean(x)) for x in (finite_values(r, key) for r in per_seed_rows) if x]
        if kind == "frac" and means and max(means) < EMPTY_FRAC:
            found.append(f"{v}_selects_nothing ({what}: {max(means):.2%} at most)")
    alphas = [a for r in per_seed_rows for a in finite_values(r, "entropic/alpha")]
    if v == "entropic" and alphas:
        if _at([abs(a) for a in alphas], cfg.get("alpha_max")) > 0.5:
            found.append(
                f"entropic_alpha_at_bound (|alpha| = alpha_max {cfg.get('alpha_max')} on "
                f"{_at([abs(a) for a in alphas], cfg.get('alpha_max')):.0%} of steps)"
            )
        if float(np.mean(np.abs(alphas))) < UNIT_WEIGHTS:
            found.append(f"entropic_weights_near_1 (mean |alpha| {np.mean(np.abs(alphas)):.3f})")
    coefs = [c for r in per_seed_rows for c in finite_values(r, "aent/coef")]
    if v == "aent" and coefs:
        for bound, name in ((cfg.get("coef_max"), "max"), (cfg.get("coef_min"), "min")):
            if _at(coefs, bound) > 0.5:
                found.append(f"aent_coef_at_{name} (coef = {bound} on {_at(coefs, bound):.0%} of steps)")
        if max(coefs) - min(coefs) <= 1e-12:
            found.append(
                f"aent_coef_never_moved (coef {coefs[0]:g} throughout: the clamped entropy stayed in "
                f"[{cfg.get('low')}, {cfg.get('high')}])"
            )
    added = claim.added_term if claim else None
    if added:
        term = [abs(x) for r in per_seed_rows for x in finite_values(r, added)]
        pol = [abs(x) for r in per_seed_rows for x in finite_values(r, "loss/policy")]
        if term and pol and np.mean(pol) > 0 and np.mean(term) < SMALL_TERM * np.mean(pol):
            found.append(f"{v}_term_negligible ({added} {np.mean(term):.2g} vs |loss/policy| {np.mean(pol):.2g})")
    return found


def method_levers(runs: dict, v: str, algo_cfgs: dict) -> str:
    """``v``'s lever as measured: each logged lever's mean over the run per seed, then the inert
    findings; ``""`` when ``v`` logs none."""
    per_seed_rows = [rows for _s, rows in sorted((runs.get(v) or {}).items())]
    parts = []
    claim = registered_lab_claims().get(v)
    for lever in claim.levers if claim else ():
        key, what, kind = lever.metric, lever.what, lever.kind
        means = [float(np.mean(x)) if x else float("nan") for x in (finite_values(r, key) for r in per_seed_rows)]
        if any(math.isfinite(m) for m in means):
            cell = "/".join("nan" if not math.isfinite(m) else (f"{m:.2%}" if kind == "frac" else f"{m:.3g}") for m in means)
            if lever.final:
                cell += (
                    " (final "
                    + "/".join(f"{r[-1]:.3g}" if r else "nan" for r in (finite_values(x, key) for x in per_seed_rows))
                    + ")"
                )
            parts.append(f"{what} {cell}")
    added = claim.added_term if claim else None
    if added:
        ratios = []
        for r in per_seed_rows:
            term, pol = finite_values(r, added), finite_values(r, "loss/policy")
            ratios.append(
                float(np.mean(np.abs(term)) / np.mean(np.abs(pol))) if term and pol and np.mean(np.abs(pol)) > 0 else float("nan")
            )
        if any(math.isfinite(x) for x in ratios):
            parts.append(f"{added} size over loss/policy size (mean abs) " + "/".join(fmt(x) for x in ratios))
    levers = f"{v}: mean over steps per seed: " + ", ".join(parts) if parts else ""
    return join_phrases(levers, "; ".join(_inert(v, per_seed_rows, _cfg(algo_cfgs, v))))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if math.isfinite(a) and math.isfinite(b) and b > 0 else "nan"


def _higher(runs: dict, v: str, text: str, algo_cfgs: dict) -> dict:
    per = []
    for s in seeds_with(runs, "grpo", v):
        g, e = entropy_ends(runs["grpo"][s])[1], entropy_ends(runs[v][s])[1]
        per.append({"seed": s, "last_tenth_grpo": g, f"last_tenth_{v}": e, "ok": e > g})
    return make_claim(
        f"{v}_keeps_entropy",
        text,
        per,
        "ok",
        "last tenth "
        + ", ".join(
            f"{fmt(p[f'last_tenth_{v}'])} vs grpo {fmt(p['last_tenth_grpo'])} ({_ratio(p[f'last_tenth_{v}'], p['last_tenth_grpo'])})"
            for p in per
        ),
        join_phrases(regime_reasons(runs, (v,), algo_cfgs), method_levers(runs, v, algo_cfgs)),
    )


def _target(v: str, algo_cfgs: dict) -> float:
    """The entropy set point of method ``v``: its ``target_param`` as the lab configured it, else its
    published default (``conf/intervention/<v>.yaml``)."""
    cls = INTERVENTIONS.get(v)
    key = getattr(cls, "target_param", None) or "target"
    value = _cfg(algo_cfgs, v).get(key)
    if value is None:
        value = (intervention_defaults(v) or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _acted_key(v: str) -> str:
    """The metric that says on which steps method ``v`` acted (``Intervention.acted_key``)."""
    cls = INTERVENTIONS.get(v)
    key = cls.acted_key() if cls is not None else None
    return key or f"{v}/acted"


def _holds_target(runs: dict, v: str, claim: LabClaim, algo_cfgs: dict) -> dict:
    """A controller's claim: the last third of its entropy curve within 30 % of its target, reached
    from its start while the method acted (``claims.target_hold``), and (when STARE ran beside it)
    steadier than STARE's gate (a smaller std of the step-to-step change)."""
    target = _target(v, algo_cfgs)
    gate = "stare" if runs.get("stare") else None
    per = []
    for s in seeds_with(runs, v, *([gate] if gate else [])):
        hold = target_hold(runs[v][s], target, _acted_key(v))
        std_own = step_change_std(runs[v][s])
        std_gate = step_change_std(runs[gate][s]) if gate else float("nan")
        per.append(
            {
                "seed": s,
                **hold,
                "target": target,
                f"std_{v}": std_own,
                "std_gate": std_gate,
                "near_target": hold["in_band"],
                "ok": hold["ok"] and (std_own < std_gate if gate else True),
            }
        )
    text = (
        f"{claim.text} (last third within +/-{BAND:.0%} of {target}, reached from its start, with "
        f"{_acted_key(v)} non-zero on at least {GATE_MIN_OPEN_SHARE:.0%} of steps)"
        + (" with less oscillation than STARE's gate" if gate else "")
    )
    return make_claim(
        f"{v}_holds_target",
        text,
        per,
        "ok",
        ", ".join(
            f"last third {hold_text(p)}, step-change std {fmt(p[f'std_{v}'])}"
            + (f" vs gate {fmt(p['std_gate'])}" if gate else "")
            for p in per
        ),
        join_phrases(
            "; ".join(f"seed {p['seed']}: {p['why_not']}" for p in per if p["why_not"]),
            regime_reasons(runs, (v,), algo_cfgs),
            method_levers(runs, v, algo_cfgs),
        ),
    )


def method_claims(runs: dict, algo_cfgs: dict | None = None) -> list[dict]:
    """The claims of the registered methods present in ``runs`` (see module docstring): controllers
    holding a target first, then "ends above GRPO", then the methods without an entropy claim."""
    algo_cfgs = algo_cfgs or {}
    declared = {v: c for v, c in registered_lab_claims().items() if runs.get(v)}
    out = []
    for v, c in declared.items():
        if c.kind == "holds_target":
            out.append(_holds_target(runs, v, c, algo_cfgs))
    for v, c in declared.items():
        if c.kind == "above_grpo":
            out.append(_higher(runs, v, c.text, algo_cfgs))
    for v, c in declared.items():
        if c.kind == "none":
            out.append(
                {
                    "id": f"{v}_no_claim",
                    "claim": f"{v}: no entropy claim ({c.text})",
                    "measured": _no_claim_measured(runs, v),
                    "reproduced": None,
                    "per_seed": [],
                    "no_claim": True,
                }
            )
    return out


def _no_claim_measured(runs: dict, v: str) -> str:
    """What the lab still measured for a method without a claim: its last-tenth entropy beside GRPO's."""
    ends = [(entropy_ends(runs[v][s])[1], entropy_ends(runs["grpo"][s])[1]) for s in seeds_with(runs, "grpo", v)]
    return ("last tenth " + ", ".join(f"{fmt(e)} vs grpo {fmt(g)}" for e, g in ends)) if ends else ""
