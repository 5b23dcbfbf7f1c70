"""The tool study's report step (``ablation.report_step: lab_tools``, ``entropyrl lab --experiment
tools``), after the sweep's report over a sweep of ``conf/ablation/lab_tools.yaml``.

It reads the finished training runs as every study's step does (``study_runs.read_study_runs``), computes
the tool claims (``tool_claims.tool_claims``) and writes into the sweep folder ``report.md``,
``lab.json`` (the claim table, the variant table and the token-kind table), the lab's mean + band
figures (``lab-entropy.png``) and the figure of entropy by token kind and by turn over steps per
variant (``lab-tools-entropy-kind.png``). ``entropyrl report DIR`` runs it again from the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import matplotlib
import numpy as np

matplotlib.use("Agg")

from ..aggregate import seed_band  # noqa: E402
from .null_controls import declare_nulls  # noqa: E402
from .report import finish_panels, panel_grid, style_panel, write_study_report  # noqa: E402
from .study_runs import read_study_runs  # noqa: E402
from .tool_claims import KIND_KEYS, TURN_KEYS, kind_table, tool_claims  # noqa: E402

__all__ = ["lab_tools_report_step", "plot_kinds", "KIND_FIGURE"]

KIND_FIGURE = "lab-tools-entropy-kind.png"
_STYLE = {
    "entropy/kind/text": ("text", "-"),
    "entropy/kind/code": ("code", "-"),
    "entropy/kind/post_tool": ("post-tool", "-"),
    "entropy/turn/first": ("first turn", "--"),
    "entropy/turn/later": ("later turns", "--"),
}


def coinciding_series_merged(bands: list[tuple[str, dict]]) -> list[tuple[str, str, dict]]:
    """``(label, line style, band)`` to draw, one per distinct series: a series equal to an earlier
    one at every step (in the tool tasks the later turns are all text after a tool result, and a
    first turn without prose is all code) joins that one's label ("a = b") instead of being drawn
    exactly on top of it, where its line and label would hide."""
    out: list[list] = []
    for key, b in bands:
        label, ls = _STYLE[key]
        same = next(
            (
                o
                for o in out
                if np.array_equal(o[2]["steps"], b["steps"])
                and np.allclose(o[2]["mean"], b["mean"], rtol=0, atol=1e-12, equal_nan=True)
            ),
            None,
        )
        if same is not None:
            same[0] = f"{same[0]} = {label}"
        else:
            out.append([label, ls, b])
    return [tuple(o) for o in out]


def plot_kinds(runs: dict[str, dict[int, list[dict]]], path: Path) -> Path | None:
    """One panel per variant: the entropy of each token kind (solid) and of the first vs later
    turns (dashed) over steps, mean over seeds with the min-max band, on a log axis (the kinds sit
    orders of magnitude apart: bare-answer text against copied results); None when no run logged any."""
    panels = [
        (v, [(k, b) for k in (*KIND_KEYS, *TURN_KEYS) if (b := seed_band(by_seed.values(), k)) is not None])
        for v, by_seed in runs.items()
    ]
    panels = [(v, bands) for v, bands in panels if bands]
    if not panels:
        return None
    fig, axes = panel_grid(len(panels), (5.2, 3.4))
    for ax, (variant, bands) in zip(axes.flat, panels):
        for i, (label, ls, b) in enumerate(coinciding_series_merged(bands)):
            (line,) = ax.plot(
                b["steps"],
                b["mean"],
                ls=ls,
                lw=1.5,
                color=f"C{i}",
                label=label,
                marker="o" if len(b["steps"]) < 12 else None,
                ms=3,
            )
            ax.fill_between(b["steps"], b["lo"], b["hi"], color=line.get_color(), alpha=0.15, lw=0)
        seeds = max(b["seeds"] for _k, b in bands)
        ax.set_yscale("log", nonpositive="clip")
        style_panel(ax, f"{variant} (n={seeds} seeds)")
    return finish_panels(
        fig,
        axes,
        len(panels),
        "entropy (nats/token, log)",
        "entropy by token kind and turn: mean over seeds, band = min-max",
        path,
    )


def _kinds_md(table: list[dict], figure: bool) -> list[str]:
    lines = ["## Entropy by token kind and turn", ""]
    if figure:
        lines += [f"![entropy by token kind]({KIND_FIGURE})", ""]
    if not table:
        return [*lines, "(no run logged entropy/kind/*: tools were off)", ""]
    lines += [
        "First and last tenth of the steps that logged the key (a kind with no token in a step is left out), "
        "mean over seeds. Tool outputs are not the policy's tokens and have no entropy here.",
        "",
        "| variant | key | first tenth | last tenth | last/first | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for t in table:
        lines.append(
            f"| {t['variant']} | `{t['key']}` | {t['first_mean']:.3f} | {t['last_mean']:.3f} | {t['ratio']:.2f} | "
            f"{','.join(map(str, t['seeds']))} |"
        )
    return [*lines, ""]


def lab_tools_report_step(sweep_dir: Path, sweep: dict, statuses: list, log: Callable[[str], None] = print) -> dict:
    """The tool claims, ``lab.json``, ``report.md`` and the figures in ``sweep_dir``; returns
    ``{"paths", "claims", "metrics": {"claims/<id>": 1.0 | 0.0}}``."""
    study = read_study_runs(sweep, statuses, stare_preset=["experiment=lab_tool_stare"], base_preset=["experiment=lab_tool_grpo"])
    runs = study.runs
    claims = declare_nulls(tool_claims(runs, h_tgt=study.h_tgt, algo_cfgs=study.algo_cfgs))  # with each one's null control
    table = kind_table(runs)
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    figure = plot_kinds(runs, Path(sweep_dir) / KIND_FIGURE)
    return write_study_report(
        Path(sweep_dir),
        study,
        claims,
        name="lab tools",
        title="entropyrl lab report: tool use",
        sections=_kinds_md(table, figure is not None),
        extra={"token_kinds": table, "h_tgt": study.h_tgt},
        figures={"entropy_kind": figure},
        log=log,
    )
