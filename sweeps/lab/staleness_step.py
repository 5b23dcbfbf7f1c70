"""The staleness study's report step (``ablation.report_step: lab_staleness``, ``entropyrl lab
--experiment staleness``), after the sweep's report over a sweep of ``conf/ablation/staleness.yaml``.

It reads the finished training runs as every study's step does (``study_runs.read_study_runs``), computes
the staleness claims (``staleness_claims.staleness_claims``), explains them with the runs'
attribution (``explain.explain_claims``) and writes into the sweep folder ``report.md``, ``lab.json``
(the claims, the lab's variant table and ``staleness_table``: per variant and seed the entropy, the
clipped shares, the final pass@k, the gate and the lag), the lab's mean + band figures and two of its
own: entropy over steps with one panel per method and one line per staleness (and a panel of each
method's corrections or options at their k beside the uncorrected run), and the stale ratio's
clipped share (``async/stale_clip_frac/entropy_q<i>``: ``pi_prox / pi_behav`` outside the clip range)
of each entropy quarter against k (the update's ``clip/frac``, which the stale ratio never enters, is
in the table beside it). ``entropyrl report DIR`` runs it again from the files (``--step
lab_staleness`` for a sweep started before its ablation named the step).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..aggregate import seed_band  # noqa: E402
from .explain import explain_claims  # noqa: E402
from .null_controls import declare_nulls  # noqa: E402
from .report import finish_panels, panel_grid, save_small, style_panel, write_study_report  # noqa: E402
from .staleness_claims import (  # noqa: E402
    CLAIM_VARIANTS,
    STALE_QUARTER_KEYS,
    parse_variant,
    staleness_claims,
    staleness_table,
    step_mean,
)
from .study_runs import read_study_runs  # noqa: E402

__all__ = [
    "lab_staleness_report_step",
    "entropy_groups",
    "plot_entropy_groups",
    "plot_clip_quarters",
    "clip_quarters",
    "ENTROPY_FIGURE",
    "CLIP_FIGURE",
]

ENTROPY_FIGURE = "lab-staleness-entropy.png"
CLIP_FIGURE = "lab-staleness-clip-quarters.png"
_NAMES = {"grpo": "GRPO", "stare": "STARE", "clip_cov": "Clip-Cov", "steer": "STEER"}


def _method_name(method: str) -> str:
    return _NAMES.get(method, method)


def entropy_groups(variants: list[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The entropy figure's panels, ``[(title, [(variant, line label), ...]), ...]``: per method (in
    the order the variants come) its staleness axis, the variants without a correction by k; then, where
    the method ran corrections or options, one panel per k of those beside the uncorrected run at that k.
    Names that are not ``<method>_k<k>[_<tag>]`` share one last panel."""
    parsed = {v: parse_variant(v) for v in variants}
    methods = list(dict.fromkeys(p[0] for p in parsed.values() if p))
    panels = []
    for m in methods:
        plain = sorted((p[1], v) for v, p in parsed.items() if p and p[0] == m and not p[2])
        if plain:
            panels.append((f"{_method_name(m)} by staleness k", [(v, f"k={k}") for k, v in plain]))
        tagged_ks = sorted({p[1] for p in parsed.values() if p and p[0] == m and p[2]})
        for k in tagged_ks:
            base = [(v, "none") for kk, v in plain if kk == k]
            tagged = [(v, p[2]) for v, p in parsed.items() if p and p[0] == m and p[1] == k and p[2]]
            panels.append((f"{_method_name(m)} at k={k}: corrections and options", base + tagged))
    other = [(v, v) for v, p in parsed.items() if p is None]
    if other:
        panels.append(("other variants", other))
    return panels


def plot_entropy_groups(runs: dict[str, dict[int, list[dict]]], path: Path, h_tgt: float | None = None) -> Path | None:
    """One panel per ``entropy_groups`` entry: each variant's entropy over steps, mean over seeds with
    the min-max band, and ``h_tgt`` (STARE's set point) as a dashed line; None when no run logged
    entropy."""
    panels = []
    for title, lines in entropy_groups(list(runs)):
        bands = [(label, b) for v, label in lines if (b := seed_band((runs.get(v) or {}).values(), "entropy")) is not None]
        if bands:
            panels.append((title, bands))
    if not panels:
        return None
    fig, axes = panel_grid(len(panels), (5.2, 3.2))
    for ax, (title, bands) in zip(axes.flat, panels):
        for i, (label, b) in enumerate(bands):
            (line,) = ax.plot(
                b["steps"],
                b["mean"],
                lw=1.5,
                color=f"C{i}",
                label=f"{label} (n={b['seeds']})",
                marker="o" if len(b["steps"]) < 12 else None,
                ms=3,
            )
            ax.fill_between(b["steps"], b["lo"], b["hi"], color=line.get_color(), alpha=0.15, lw=0)
        if h_tgt is not None:
            ax.axhline(h_tgt, color="0.4", ls="--", lw=1, label=f"h_tgt {h_tgt:g}")
        style_panel(ax, title)
    return finish_panels(
        fig, axes, len(panels), "entropy (nats/token)", "entropy under staleness: mean over seeds, band = min-max", path
    )


def clip_quarters(
    runs: dict[str, dict[int, list[dict]]], keys: tuple[str, ...] = STALE_QUARTER_KEYS
) -> dict[str, dict[int, dict[str, list[float]]]]:
    """``{method: {k: {quarter key: [per seed mean over steps]}}}`` of the variants without a
    correction, for ``keys`` (the stale ratio's quarters); quarters no seed logged are left out."""
    out: dict[str, dict[int, dict[str, list[float]]]] = {}
    for v, by_seed in runs.items():
        p = parse_variant(v)
        if p is None or p[2]:
            continue
        per_key = {}
        for key in keys:
            vals = [m for rows in by_seed.values() if math.isfinite(m := step_mean(rows, key))]
            if vals:
                per_key[key] = vals
        if per_key:
            out.setdefault(p[0], {})[p[1]] = per_key
    return out


def plot_clip_quarters(runs: dict[str, dict[int, list[dict]]], path: Path) -> Path | None:
    """One panel per method: the stale ratio's clipped share of each entropy quarter
    (``async/stale_clip_frac/entropy_q1`` .. ``_q4``, mean over steps) against the staleness k, mean over
    seeds with the min-max as error bars; None when no run logged the quarters."""
    data = clip_quarters(runs)
    if not data:
        return None
    cols = min(len(data), 2)
    rows = math.ceil(len(data) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.2 * rows), squeeze=False, sharey=True)
    for ax, (method, by_k) in zip(axes.flat, data.items()):
        ks = sorted(by_k)
        for i, key in enumerate(STALE_QUARTER_KEYS):
            pts = [(k, by_k[k][key]) for k in ks if key in by_k[k]]
            if not pts:
                continue
            x = np.array([k for k, _ in pts], dtype=float)
            mean = np.array([np.mean(v) for _, v in pts])
            lo, hi = np.array([min(v) for _, v in pts]), np.array([max(v) for _, v in pts])
            ax.errorbar(
                x, mean, yerr=[mean - lo, hi - mean], marker="o", ms=4, lw=1.4, capsize=3, color=f"C{i}", label=f"q{i + 1}"
            )
        ax.set_xticks(ks)
        style_panel(ax, f"{_method_name(method)}", "staleness k", legend_title="entropy quarter")
    for ax in list(axes.flat)[len(data) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("stale ratio outside the clip range (mean over steps)")
    fig.suptitle(
        "stale ratio pi_prox/pi_behav outside the clip range, by entropy quarter (q1 lowest, q4 highest): "
        "mean over seeds, bars = min-max",
        fontsize=9,
    )
    fig.tight_layout()
    save_small(fig, Path(path))
    plt.close(fig)
    return Path(path)


def _cell(vals: list[float], digits: int = 3) -> str:
    """Mean ± std over the seeds' finite values; the value alone for one seed; ``-`` for none."""
    vals = [float(v) for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals):.{digits}f}"


def _below_cell(steps: list[int | None]) -> str:
    crossed = [s for s in steps if s is not None]
    if not crossed:
        return "never"
    cell = _cell(crossed, 1)
    return cell if len(crossed) == len(steps) else f"{cell} ({len(crossed)} of {len(steps)} seeds)"


def _table_md(table: list[dict], h_tgt: float, pass_key: str) -> list[str]:
    label = pass_key.split("/")[-1].replace("pass_at_", "pass@")
    lines = [
        "## Variants under staleness (mean ± std over seeds)",
        "",
        f"Entropy last tenth: the last tenth of the steps; first step below h_tgt ({h_tgt:g}): mean over the seeds "
        "that went below (how many, when not all); clip/frac (the update's clip, pi_theta against pi_prox) and its "
        "bottom (q1) and top (q4) entropy quarters, stale clip (`async/stale_clip_frac`: the stale ratio "
        "pi_prox/pi_behav outside the clip range, the same with or without a correction) and its q1 and q4, "
        f"STARE's gate open share (`stare/gate_on`) and the lag (`async/staleness/mean`): means over steps; {label} "
        "and accuracy: the last validation.",
        "",
        f"| variant | k | correction / option | seeds | entropy last tenth | first step below h_tgt | clip/frac | "
        f"clip q1 | clip q4 | stale clip | stale q1 | stale q4 | final {label} | final val acc | gate open | mean lag |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        lines.append(
            f"| {t['variant']} | {'-' if t['k'] is None else t['k']} | {t['tag'] or 'none'} | "
            f"{','.join(map(str, t['seeds']))} | {_cell(t['entropy_last_tenth'])} | {_below_cell(t['first_step_below'])} | "
            f"{_cell(t['clip_frac'], 4)} | {_cell(t['clip_q1'], 4)} | {_cell(t['clip_q4'], 4)} | "
            f"{_cell(t.get('stale_clip_frac', []), 4)} | {_cell(t.get('stale_q1', []), 4)} | {_cell(t.get('stale_q4', []), 4)} | "
            f"{_cell(t['pass'])} | "
            f"{_cell(t['val_acc'])} | {_cell(t['gate_open'], 2)} | {_cell(t['staleness_mean'], 2)} |"
        )
    return [*lines, ""]


def _figures_md(entropy: bool, clip: bool) -> list[str]:
    lines = ["## Entropy by method and staleness", ""]
    lines += (
        [
            f"![entropy by method and staleness]({ENTROPY_FIGURE})",
            "",
            "One panel per method with a line per staleness k, and one per method and k with its corrections or "
            "options beside the run without (`none`); the dashed line is STARE's h_tgt.",
            "",
        ]
        if entropy
        else ["(no run logged entropy)", ""]
    )
    lines += ["## Stale ratio outside the clip range, by entropy quarter", ""]
    lines += (
        [
            f"![stale ratio outside the clip range by entropy quarter against k]({CLIP_FIGURE})",
            "",
            "Stale samples' ratios pi_prox/pi_behav leave the clip range on high-entropy tokens first (M2PO): the q4 "
            "line above the q1 line, rising with k, is that observation (`async/stale_clip_frac/entropy_q*`; the "
            "update's clip/frac, pi_theta against pi_prox, does not see the stale ratio).",
            "",
        ]
        if clip
        else ["(no run logged async/stale_clip_frac/entropy_q*)", ""]
    )
    return lines


def _is_stare(variant: str) -> bool:
    """Whether a staleness variant (``<method>_k<k>[_<correction>]``) runs STARE."""
    parsed = parse_variant(variant)
    return bool(parsed) and parsed[0] == "stare"


def lab_staleness_report_step(sweep_dir: Path, sweep: dict, statuses: list, log: Callable[[str], None] = print) -> dict:
    """The staleness claims, ``lab.json``, ``report.md`` and the figures in ``sweep_dir``; returns
    ``{"paths", "claims", "metrics": {"claims/<id>": 1.0 | 0.0}}``."""
    study = read_study_runs(
        sweep, statuses, stare_preset=["experiment=lab_stare"], base_preset=["experiment=lab_grpo"], is_stare=_is_stare
    )
    runs, h_tgt, pass_key = study.runs, study.h_tgt, study.pass_key
    claims = staleness_claims(runs, h_tgt=h_tgt, algo_cfgs=study.algo_cfgs, pass_key=pass_key)
    claims = explain_claims(claims, runs, claim_variants=CLAIM_VARIANTS)  # why entropy moved, from the attribution
    claims = declare_nulls(claims)  # each claim's null control, in words (null_controls.py)
    table = staleness_table(runs, h_tgt=h_tgt, pass_key=pass_key)
    out = Path(sweep_dir)
    out.mkdir(parents=True, exist_ok=True)
    entropy_fig = plot_entropy_groups(runs, out / ENTROPY_FIGURE, h_tgt)
    clip_fig = plot_clip_quarters(runs, out / CLIP_FIGURE)
    return write_study_report(
        out,
        study,
        claims,
        name="lab staleness",
        title="entropyrl lab report: staleness",
        sections=[*_figures_md(entropy_fig is not None, clip_fig is not None), *_table_md(table, h_tgt, pass_key)],
        extra={
            "staleness_table": table,
            "h_tgt": h_tgt,
            "entropy_panels": [{"title": t, "variants": [v for v, _ in lines]} for t, lines in entropy_groups(list(runs))],
        },
        figures={"staleness_entropy": entropy_fig, "staleness_clip_quarters": clip_fig},
        log=log,
    )
