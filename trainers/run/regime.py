"""Regime checks of a finished run: can the configured intervention act, did entropy collapse or
explode, and how well did the first-order prediction track the realised entropy change.

Everything here is a pure function of the run's metric rows (``metrics.jsonl``), so the same checks
run on a live run, on a sweep's runs and in tests on synthetic rows. ``report_regime`` is the one
I/O edge: it prints one line per finding, tags the MLflow run and returns what goes into
``summary.json``::

    "warnings": [{"id": "kl_cov_on_policy", "message": "...", "first_step": 1}, ...]
    "flags":    [{"id": "collapse", "message": "...", "first_step": 57, "evidence": {"reference_steps": [1, 20], ...}}]
    "entropy_change": {"n": 199, "pearson_r": ..., "slope": ..., "pearson_r_detrended": ..., ...}
    "attribution": {"fit": {...as entropy_change, of predicted_net...}, "total": {"q1": ...}, "share": {...}}
"""

# size: every regime finding of a run: pure functions of its metric rows, with one I/O edge
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...conf import intervention_defaults, to_plain
from ..algos.algo_config import default
from ..interventions import INTERVENTIONS

__all__ = [
    "regime_warnings",
    "harder_groups_advice",
    "entropy_flags",
    "prediction_fit",
    "attribution_summary",
    "report_regime",
    "findings_cell",
    "COLLAPSE_RATIO",
    "EXPLOSION_RATIO",
    "EXPLOSION_NATS",
    "EXPLOSION_FLOOR",
    "MIN_FLAG_STEPS",
    "TARGET_BAND",
    "FLAG_NULL_CONTROLS",
    "entropy_target",
    "DETREND_WINDOW",
    "rolling_mean_by_step",
]

COLLAPSE_RATIO = 0.2  # entropy below 0.2x its first-tenth mean
EXPLOSION_RATIO = 3.0  # ... or above 3x it
EXPLOSION_NATS = 2.0  # ... or above 2 nats/token, from a first tenth below that
EXPLOSION_FLOOR = 0.5  # the ratio rule needs at least this many nats/token: 3x a near-zero start is no explosion
#: A flag compares the first tenth of the logged entropy steps with each later step. With fewer
#: steps than this the reference is one step and the comparison a handful of noisy steps: no flag is
#: raised (a 2-step run says nothing about a trend, and a real model's first step is no baseline).
MIN_FLAG_STEPS = 10
#: A run whose controller has an entropy set point (STARE's ``h_tgt``, EntroPIC's ``target``: the
#: intervention's ``target_param``) and whose last tenth ends within this relative band of it ended
#: where the method steers it: neither a collapse nor an explosion (the lab's band, claims.py).
TARGET_BAND = 0.3
#: Each flag's null control: runs on which it must not fire (tests/sweeps/test_claim_nulls.py).
FLAG_NULL_CONTROLS = {
    "collapse": "entropy flat at its start; a run with fewer than MIN_FLAG_STEPS logged steps; a run that ends "
    "within TARGET_BAND of its controller's set point",
    "explosion": "entropy flat at its start, at any level (above 2 nats included); a run with fewer than "
    "MIN_FLAG_STEPS logged steps",
}
ALL_EQUAL_SHARE = 0.5  # most groups all-equal: nothing to reweight
FILE_KINDS = ("math", "code")  # data kinds read from a file (the user's own rows)
DETREND_WINDOW = 21  # rolling mean removed before correlating predicted and realised change


def _series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    out = []
    for i, r in enumerate(rows):
        v = r.get(key)
        if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v)):
            out.append((int(r.get("step", i + 1)), float(v)))
    return out


def _finding(id_: str, message: str, first_step: int | None) -> dict:
    return {"id": id_, "message": message, "first_step": first_step}


def _interventions(algo_cfg: dict) -> list[str]:
    names = algo_cfg.get("interventions") or []
    return [names] if isinstance(names, str) else list(names)


def harder_groups_advice(algo_cfg: dict, data_cfg: dict | None) -> str:
    """What to change when most groups answer alike, for the run's own data and sampling: a harder
    built-in task for the toy one, harder prompts for a file of the user's, harder problems for the
    other built-in tasks; dynamic sampling where it is off, more of its batches where it is on."""
    data = data_cfg or {}
    name = data.get("name")  # a hand-built data section may have none
    if data.get("path") or data.get("kind") in FILE_KINDS:
        task = "harder prompts in your data"
    elif name == "toy":
        task = "a harder task (data=countdown)"
    elif "difficulty" in data:
        task = f"harder problems (data.difficulty, now {data['difficulty']})"
    else:
        task = f"harder problems for data={name}" if name else "harder problems"
    sampling = algo_cfg.get("dynamic_sampling") or {}
    if sampling.get("enabled"):
        more = f"more generation batches per step (algo.dynamic_sampling.max_num_gen_batches, now {sampling.get('max_num_gen_batches')})"
    else:
        more = "dynamic sampling (algo.dynamic_sampling.enabled=true: those groups are dropped and more are sampled)"
    return f"{task}, or {more}"


def regime_warnings(rows: list[dict], algo_cfg: dict, data_cfg: dict | None = None) -> list[dict]:
    """Interventions that cannot act in this run's regime, from the metric rows.

    ``algo_cfg``: the ``algo`` config as a plain dict (name, interventions, per-intervention
    sections); ``data_cfg``: the ``data`` config, for advice that fits it (None: none known).
    Returns ``[{"id", "message", "first_step"}]`` in a fixed order.
    """
    out: list[dict] = []
    for name in _interventions(algo_cfg):  # each intervention says when it could not act
        cls = INTERVENTIONS.get(name)
        if cls is not None:
            out += cls.regime_warnings(lambda key: _series(rows, key), dict(algo_cfg.get(name) or {}))
    equal = _series(rows, "groups/all_equal_frac")
    if equal:
        share = float(np.mean([v for _, v in equal]))
        if share > ALL_EQUAL_SHARE:
            first = (
                next(s for s, v in equal if v > ALL_EQUAL_SHARE) if any(v > ALL_EQUAL_SHARE for _, v in equal) else equal[0][0]
            )
            out.append(
                _finding(
                    "all_equal_groups",
                    f"{share:.0%} of prompt groups had all-equal rewards on average (zero advantage): "
                    f"{algo_cfg.get('name', default('name'))} has little to reweight; use "
                    f"{harder_groups_advice(algo_cfg, data_cfg)}",
                    first,
                )
            )
    out += _sampler_gap(rows, algo_cfg)
    return out


def _sampler_gap(rows: list[dict], algo_cfg: dict) -> list[dict]:
    """A sampler far from the trained policy: the run's mean ``rollout/logp_diff_mean`` (the sampler's
    log-probs of its own tokens against the trainer's, where the engine reports them) beyond
    ``log(1 + algo.clip.high)``, the log-ratio at which PPO's clip stops the average token's update."""
    gaps = _series(rows, "rollout/logp_diff_mean")
    if not gaps:
        return []
    clip = dict(algo_cfg.get("clip") or {})
    bound = math.log1p(float(clip.get("high", default("clip.high"))))
    mean = float(np.mean([v for _, v in gaps]))
    if mean <= bound:
        return []
    first = next(s for s, v in gaps if v > bound)  # a mean above the bound has a step above it
    return [
        _finding(
            "sampler_far_from_policy",
            f"the sampler's log-probs of its tokens were {mean:.2f} nats a token from the trainer's on average "
            f"(rollout/logp_diff_mean), beyond log(1 + algo.clip.high) = {bound:.2f}: the batches come from another "
            "policy than the one trained. rollout.weights=int8 or bfloat16: use float32; vLLM: check rollout.dtype; under "
            "trainer.staleness the behaviour weights are older. algo.interventions=[tis] caps the ratios but does not "
            "make the batches on-policy",
            first,
        )
    ]


def entropy_target(algo_cfg: dict | None) -> float | None:
    """The entropy set point (nats) of the run's closed-loop controller, from its ``algo`` config: the
    ``target_param`` of the first configured intervention that has one (STARE's ``h_tgt``, only while
    its gate is on: an open-loop STARE steers to no level); None when there is none."""
    algo_cfg = algo_cfg or {}
    for name in _interventions(algo_cfg):
        cls = INTERVENTIONS.get(name)
        key = getattr(cls, "target_param", None)
        params = {**(intervention_defaults(name) or {}), **dict(algo_cfg.get(name) or {})}
        if key is None or (name == "stare" and not params["gate"]):
            continue
        value = params.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def entropy_flags(rows: list[dict], algo_cfg: dict | None = None) -> list[dict]:
    """Collapse (a step's entropy < 0.2x the first tenth's mean) and explosion (> 3x it and above a
    floor of ``EXPLOSION_FLOOR`` nats, or > 2 nats from a first tenth below 2 nats), with the first
    step at which each happened. A ratio alone would call 0.06 nats an explosion of a run that started
    near zero, and the 2-nat rule alone a model whose entropy starts above 2 nats.

    Each flag states its evidence: the steps it compares (``evidence``: the first tenth's steps and
    mean, the step and its value) in the message and as a field. No flag with fewer than
    ``MIN_FLAG_STEPS`` logged entropy steps (too short to show a trend), and none where the run ends
    within ``TARGET_BAND`` of its controller's set point (``entropy_target(algo_cfg)``): entropy at the
    target STARE holds is the method working, not a collapse. ``[{"id", "message", "first_step",
    "evidence"}]``."""
    ent = _series(rows, "entropy")
    if len(ent) < MIN_FLAG_STEPS:
        return []
    tenth = max(1, len(ent) // 10)
    ref = float(np.mean([v for _, v in ent[:tenth]]))
    last = float(np.mean([v for _, v in ent[-tenth:]]))
    first_steps = f"steps {ent[0][0]}-{ent[tenth - 1][0]}" if tenth > 1 else f"step {ent[0][0]}"
    target = entropy_target(algo_cfg)
    if target is not None and abs(last / target - 1.0) <= TARGET_BAND:
        return []
    later = ent[tenth:]

    def evidence(step: int, value: float) -> dict:
        return {
            "reference_steps": [ent[0][0], ent[tenth - 1][0]],
            "reference_mean": ref,
            "step": step,
            "value": value,
            "steps_logged": len(ent),
        }

    out = []
    low = next(((s, v) for s, v in later if v < COLLAPSE_RATIO * ref), None)
    if low is not None:
        out.append(
            {
                **_finding(
                    "collapse",
                    f"entropy collapsed: {low[1]:.3f} nats at step {low[0]} < {COLLAPSE_RATIO} x {ref:.3f}, the mean of "
                    f"the first tenth ({first_steps}; {len(ent)} steps logged)",
                    low[0],
                ),
                "evidence": evidence(*low),
            }
        )
    high = next(
        (
            (s, v)
            for s, v in later
            if v > max(EXPLOSION_RATIO * ref, EXPLOSION_FLOOR) or (v > EXPLOSION_NATS and ref <= EXPLOSION_NATS)
        ),
        None,
    )
    if high is not None:
        why = (
            f"> {EXPLOSION_NATS} nats"
            if high[1] > EXPLOSION_NATS and ref <= EXPLOSION_NATS
            else f"> {EXPLOSION_RATIO} x its first-tenth mean {ref:.3f} (and > {EXPLOSION_FLOOR} nats)"
        )
        out.append(
            {
                **_finding(
                    "explosion",
                    f"entropy exploded: {high[1]:.3f} nats at step {high[0]} {why}; first tenth ({first_steps}) "
                    f"mean {ref:.3f}, {len(ent)} steps logged",
                    high[0],
                ),
                "evidence": evidence(*high),
            }
        )
    return out


def findings_cell(per_seed: list[list[dict]]) -> str:
    """One report cell for a variant's warnings or flags over its seeds (the lab and sweep reports).

    ``per_seed``: one list of findings ``{"id", "first_step", ...}`` per finished seed. Each id once,
    in order of first appearance, with the first step on every seed that had it and, when not all
    did, how many: ``"collapse@104/98 (2/3 seeds)"``; ``"-"`` when there are none.
    """
    steps: dict[str, list[str]] = {}
    for found in per_seed:
        seen = set()
        for f in found:
            if f["id"] in seen:
                continue
            seen.add(f["id"])
            steps.setdefault(f["id"], []).append("?" if f.get("first_step") is None else str(f["first_step"]))
    cells = []
    for id_, at in steps.items():
        share = "" if len(at) == len(per_seed) else f" ({len(at)}/{len(per_seed)} seeds)"
        cells.append(f"{id_}@{'/'.join(at)}{share}")
    return ", ".join(cells) or "-"


def rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling mean ``[n] -> [n]`` (shorter windows at the ends)."""
    half = window // 2
    c = np.concatenate([[0.0], np.cumsum(x)])
    lo = np.clip(np.arange(len(x)) - half, 0, len(x))
    hi = np.clip(np.arange(len(x)) + half + 1, 0, len(x))
    return (c[hi] - c[lo]) / (hi - lo)


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Pearson r and least-squares slope of ``y`` on ``x`` (nan when either is constant)."""
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan"), float("nan")
    r = float(np.corrcoef(x, y)[0, 1])
    slope = float(np.polyfit(x, y, 1)[0])
    return r, slope


def rolling_mean_by_step(x: np.ndarray, steps: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling mean ``[n] -> [n]`` over the points within ``window // 2`` *steps* of each
    point: the same as ``rolling_mean`` for a series logged every step, and still a 21-step window
    for one measured every 10 steps (``diagnostics.attribution_every``), where a window of 21 *points*
    would span the whole run and remove nothing but the mean."""
    half = window // 2
    order = np.argsort(steps, kind="stable")
    s, c = steps[order], np.concatenate([[0.0], np.cumsum(x[order])])
    lo, hi = np.searchsorted(s, steps - half, "left"), np.searchsorted(s, steps + half, "right")
    return (c[hi] - c[lo]) / (hi - lo)


def prediction_fit(
    rows: list[dict],
    predicted_key: str = "entropy_change/predicted",
    realized_key: str = "entropy_change/realized",
    window: int = DETREND_WINDOW,
) -> dict:
    """How the first-order prediction tracks the realised change: Pearson r and least-squares slope of
    realised on predicted, raw and after removing from each a centred rolling mean over ``window``
    steps (by the rows' ``step``; by position for rows without one).

    Empty dict when the rows lack either series.
    """
    pairs = [
        (r[predicted_key], r[realized_key], r.get("step", i))
        for i, r in enumerate(rows)
        if isinstance(r.get(predicted_key), (int, float))
        and isinstance(r.get(realized_key), (int, float))
        and math.isfinite(r[predicted_key])
        and math.isfinite(r[realized_key])
    ]
    if len(pairs) < 3:
        return {}
    x, y, steps = (np.asarray(v, dtype=float) for v in zip(*pairs))
    r, slope = _fit(x, y)
    rd, slope_d = _fit(x - rolling_mean_by_step(x, steps, window), y - rolling_mean_by_step(y, steps, window))
    return {
        "n": len(pairs),
        "pearson_r": r,
        "slope": slope,
        "pearson_r_detrended": rd,
        "slope_detrended": slope_d,
        "detrend_window": window,
        "sign_agreement": float(np.mean(np.sign(x) == np.sign(y))),
    }


# the parts' key prefixes: adding up to predicted_net (trapezoid) and to predicted_net_1st (first order)
PARTS, PARTS_1ST = "attribution/", "attribution_1st/"


def part_totals(rows: list[dict], prefix: str) -> dict[str, float]:
    """Per part (keys ``<prefix><part>``) its sum over ``rows`` (finite values only)."""
    totals: dict[str, float] = {}
    for r in rows:
        for key, value in r.items():
            if key.startswith(prefix) and isinstance(value, (int, float)) and math.isfinite(value):
                totals[key[len(prefix) :]] = totals.get(key[len(prefix) :], 0.0) + float(value)
    return totals


def _shares(totals: dict[str, float]) -> dict[str, float]:
    scale = sum(abs(v) for v in totals.values())
    return {k: (v / scale if scale > 0 else 0.0) for k, v in totals.items()}


def measured_rows(rows: list[dict]) -> list[dict]:
    """The rows of the steps that measured the attribution (``entropy_change/predicted_net`` logged)."""
    return [r for r in rows if isinstance(r.get("entropy_change/predicted_net"), (int, float))]


def after_first_step(rows: list[dict]) -> list[dict]:
    """The rows that measured the attribution, but step 1's when there are others. AdamW's first step
    moves every coordinate by about lr (``m/sqrt(v) = g/|g|``), so a part's change there is lr times
    its signed share of each coordinate's gradient: parts of +-0.2-0.6 nats cancelling to a net of
    ~0.01 on the lab, which would outweigh the rest of a run in any total."""
    measured = measured_rows(rows)
    later = [r for r in measured if int(r.get("step", 0)) != 1]
    return later if later and len(later) < len(measured) else measured


def attribution_summary(rows: list[dict]) -> dict:
    """``diagnostics.attribution`` over a run: the fit of ``entropy_change/predicted_net`` (the
    trapezoid) to the realised change (``prediction_fit``), and per part (``attribution/<part>``) its
    ``total`` over the measured steps (the totals add up to the summed predicted_net) and its
    ``share``, the total over the sum of the parts' absolute totals (signed; the absolute shares add
    up to 1); ``fit_1st``, ``total_1st``, ``share_1st``: the same of the first-order
    ``predicted_net_1st`` and its parts ``attribution_1st/<part>``; ``share_after_first``: the shares
    over the measured steps after step 1 (``after_first_step``).

    Several ranks log the predictions without parts: the fits alone, totals and shares empty.
    Empty dict when the rows hold no attribution.
    """
    totals, totals_1st = part_totals(rows, PARTS), part_totals(rows, PARTS_1ST)
    fit = prediction_fit(rows, predicted_key="entropy_change/predicted_net")
    if not totals and not fit:
        return {}
    return {
        "fit": fit,
        "fit_1st": prediction_fit(rows, predicted_key="entropy_change/predicted_net_1st"),
        "total": totals,
        "share": _shares(totals),
        "total_1st": totals_1st,
        "share_1st": _shares(totals_1st),
        "share_after_first": _shares(part_totals(after_first_step(rows), PARTS)),
    }


def report_regime(rows: list[dict], cfg, tracker=None, log: Callable = print) -> dict:
    """Warnings, flags and the prediction fit of a finished run, for ``summary.json``.

    Prints one line per finding, tags the MLflow run (``entropyrl.warnings``, ``entropyrl.flags``).
    """
    algo_cfg = to_plain(cfg.algo) if cfg is not None else {}
    data_cfg = to_plain(cfg.get("data")) if cfg is not None and hasattr(cfg, "get") else None
    warnings, flags = regime_warnings(rows, algo_cfg, data_cfg), entropy_flags(rows, algo_cfg)
    for kind, found in (("warning", warnings), ("flag", flags)):
        for f in found:
            log(f"{kind} {f['id']} (step {f['first_step']}): {f['message']}")
    out: dict = {"warnings": warnings, "flags": flags}
    fit = prediction_fit(rows)
    if fit:
        out["entropy_change"] = fit
        base = prediction_fit(rows, predicted_key="entropy_change/predicted_base")
        if base:
            out["entropy_change"].update(
                {"pearson_r_base": base["pearson_r"], "pearson_r_detrended_base": base["pearson_r_detrended"]}
            )
    attribution = attribution_summary(rows)
    if attribution:
        out["attribution"] = attribution
    if (
        tracker is not None
        and getattr(tracker, "enabled", False)
        and getattr(tracker, "run_id", None)
        and getattr(tracker, "online", True)
    ):  # a server that went away: no tag, no second warning
        try:
            tracker.set_tags(
                {
                    "entropyrl.warnings": ",".join(w["id"] for w in warnings) or "none",
                    "entropyrl.flags": ",".join(f["id"] for f in flags) or "none",
                }
            )
        except Exception as exc:  # noqa: BLE001 - a tag is not worth losing the summary over
            log(f"could not tag the MLflow run: {str(exc).splitlines()[0]}")
    return out
