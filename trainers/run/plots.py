"""Training-curve figures (matplotlib, headless).

matplotlib loads on the first figure (``_pyplot``), not with this module: the trainer imports this
module at start-up but draws only when the run ends, so a run's launch and first step do not wait
for matplotlib's import."""

from __future__ import annotations

import math
from pathlib import Path

from ...core.files import atomic_path
from .regime import PARTS, PARTS_1ST


def _pyplot():
    """``matplotlib.pyplot`` on the headless Agg backend, imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


PANELS = [("entropy", "policy entropy (nats/token)"), ("reward/mean", "reward"), ("acc/mean", "accuracy")]


def gate_spans(rows: list[dict], key: str = "stare/gate_on") -> list[tuple[float, float]]:
    """The step ranges where the 0/1 metric ``key`` was on (a gate open), each ``(first - 0.5, last
    + 0.5)`` so a one-step opening is a visible band; ``[]`` when the run never logged ``key``. Pure."""
    spans: list[tuple[float, float]] = []
    start = last = None
    for r in rows:
        v = r.get(key)
        if v is None:
            continue
        on = float(v) > 0.5
        if on and start is None:
            start = r["step"]
        elif not on and start is not None:
            spans.append((start - 0.5, last + 0.5))
            start = None
        last = r["step"]
    if start is not None:
        spans.append((start - 0.5, last + 0.5))
    return spans


# the entropy panel's axis: the start is the mean of this many first logged steps, the ceiling this
# factor above the larger of start and target, rounded up to the next of these steps (x a power of ten)
START_STEPS = 3
HEADROOM = 1.25
NICE_STEPS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def nice_ceiling(value: float) -> float:
    """The smallest ``NICE_STEPS`` value times a power of ten that is ``>= value`` (``value > 0``). Pure.

    Rounding up to a coarse grid makes two starts a few percent apart share one ceiling, so runs that
    part ways after their first steps still get the same axis."""
    exponent = math.floor(math.log10(value))
    for decade in (exponent, exponent + 1):  # float error in log10 can put value past the top step
        for step in NICE_STEPS:
            nice = float(f"{step}e{decade}")  # 0.3, not 3 * 0.1 = 0.30000000000000004
            if nice >= value * (1 - 1e-12):
                return nice
    return value


def entropy_axis_limits(rows: list[dict], target: float | None = None) -> tuple[float, float] | None:
    """The entropy panel's y-limits, ``(0, ceiling)``, from the run's reference rather than its path.
    Pure; None when no row logged a finite ``entropy`` (matplotlib then scales the empty panel).

    The ceiling is ``HEADROOM`` above the larger of the run's starting entropy (the mean of its first
    ``START_STEPS`` logged steps) and its entropy target, rounded up by ``nice_ceiling``. Why: an
    axis fitted to each trajectory zooms a collapsed run onto its own tail and a held run onto its
    flat line, so GRPO's and STARE's figures of one model and task could only be compared by reading
    the ticks. Fixed by the start, both share one axis and the collapse shows as the drop it is. The
    one exception is a run that climbs past the ceiling (an entropy explosion): its axis widens to
    cover its maximum, since a curve drawn off the top would hide the failure the figure is for."""
    points = sorted((r["step"], float(r["entropy"])) for r in rows if _finite(r.get("entropy")))
    if not points:
        return None
    start = sum(v for _, v in points[:START_STEPS]) / len(points[:START_STEPS])
    reference = max(start, target if target is not None and target > 0 else 0.0)
    if reference <= 0:  # a start at zero entropy leaves nothing to scale by: cover what the run did
        reference = max(v for _, v in points)
    if reference <= 0:
        return (0.0, 1.0)
    ceiling = nice_ceiling(reference * HEADROOM)
    peak = max(v for _, v in points)
    if peak > ceiling:
        ceiling = nice_ceiling(peak * 1.05)
    return (0.0, ceiling)


def _finite(value) -> bool:
    """Whether ``value`` is a finite number (a metric row's NaN or inf entry is skipped)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def training_curves_figure(
    rows: list[dict],
    title: str = "",
    *,
    target: tuple[str, float] | None = None,
    collapse_step: int | None = None,
    gate_key: str = "stare/gate_on",
):
    """The figure ``plot_training_curves`` saves, returned unsaved (a test reads its axes)."""
    fig, axes = _pyplot().subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.2))
    spans = gate_spans(rows, gate_key)
    for ax, (key, label) in zip(axes, PANELS):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), label="train", lw=1.5)
        for i, (a, b) in enumerate(spans):
            ax.axvspan(a, b, color="C2", alpha=0.15, lw=0, label=f"{gate_key.split('/')[0]} gate open" if i == 0 else None)
        if collapse_step is not None:
            ax.axvline(collapse_step, color="C3", ls=":", lw=1.2, label=f"collapse (step {collapse_step})")
        if key == "entropy" and target is not None:
            ax.axhline(target[1], color="grey", ls="--", lw=1, label=f"{target[0]} = {target[1]:g}")
        if key == "entropy":
            limits = entropy_axis_limits(rows, target[1] if target is not None else None)
            if limits is not None:
                ax.set_ylim(*limits)
        if key == "acc/mean":
            val = [(r["step"], r["val/acc"]) for r in rows if r.get("val/acc") is not None]
            if val:
                ax.plot(*zip(*val), "o-", label="validation", ms=3)
        if key == "acc/mean" or (key == "entropy" and (spans or target is not None or collapse_step is not None)):
            ax.legend(fontsize=7)
        ax.set_xlabel("step")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_training_curves(
    rows: list[dict],
    path: Path,
    title: str = "",
    *,
    target: tuple[str, float] | None = None,
    collapse_step: int | None = None,
    gate_key: str = "stare/gate_on",
) -> Path:
    """Entropy, reward and accuracy against step (validation accuracy over the accuracy panel), with
    the intervention drawn in: ``target`` ``(label, nats)`` as a dashed line on the entropy panel
    (STARE's ``h_tgt``, adaptive entropy's ``target``), shading on every panel where the ``gate_key``
    metric was on (STARE's gate open), and a dotted vertical line at ``collapse_step`` (the summary's
    ``collapse`` flag). Each appears only when given or logged, so a plain GRPO run draws the three curves.

    The entropy axis runs from 0 to a ceiling set by the run's start and target
    (``entropy_axis_limits``), not by its trajectory: the figures of two runs of one model and task
    that start alike share the axis, so a collapse and a held entropy compare without reading ticks."""
    fig = training_curves_figure(rows, title, target=target, collapse_step=collapse_step, gate_key=gate_key)
    return save_figure(fig, path)


# as trainers/stats/diagnostics.py numbers them: the advantage's sign, and surprisal -log p against the entropy
QUADRANTS = [
    ("q1", "Q1: A>0, low surprisal"),
    ("q2", "Q2: A>0, high surprisal"),
    ("q3", "Q3: A<0, high surprisal"),
    ("q4", "Q4: A<0, low surprisal"),
]


def plot_quadrants(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """The four quadrants' token shares (``quadrant/q1..q4/share``) over steps in one chart, so their
    balance reads at a glance (``trainers/stats/diagnostics.py`` numbers them); None when the run logged none."""
    if not any(r.get("quadrant/q1/share") is not None for r in rows):
        return None
    fig, ax = _pyplot().subplots(figsize=(6.4, 3.6))
    _lines(ax, rows, [(f"quadrant/{q}/share", label, "-") for q, label in QUADRANTS])
    ax.set_xlabel("step")
    ax.set_ylabel("share of valid tokens")
    ax.set_title(title or "four quadrants", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def _lines(ax, rows: list[dict], series: list[tuple[str, str, str]]) -> bool:
    """Plot each ``(key, label, style)`` present in ``rows`` against step; whether any was."""
    drawn = False
    for key, label, style in series:
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), style, label=label, lw=1.5, ms=3)
            drawn = True
    return drawn


def plot_reflection(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """Long chain-of-thought at a glance (``docs/long-cot.md``): reflection density and the share of
    reflecting responses, response length (all, correct, incorrect), and the token entropy at
    reflection words and just before them against all tokens; None when the run logged no
    ``reflection/*`` metric (an empty word list)."""
    if not any(r.get("reflection/density") is not None for r in rows):
        return None
    fig, axes = _pyplot().subplots(1, 3, figsize=(12.6, 3.2))
    ax = axes[0]
    _lines(ax, rows, [("reflection/density", "per 1k tokens", "-")])
    ax.set_ylabel("reflection words per 1k tokens")
    twin = ax.twinx()
    _lines(twin, rows, [("reflection/frac", "share reflecting", "C1--")])
    twin.set_ylabel("share of responses reflecting (dashed)", fontsize=8, color="C1")
    ax.set_title("reflection", fontsize=10)
    _lines(
        axes[1],
        rows,
        [
            ("response_length/mean", "all", "-"),
            ("response_length/correct/mean", "correct", "-"),
            ("response_length/incorrect/mean", "incorrect", "-"),
        ],
    )
    axes[1].set_title("response length (tokens)", fontsize=10)
    axes[1].legend(fontsize=8)
    drawn = _lines(
        axes[2],
        rows,
        [
            ("reflection/entropy_all", "all tokens", "-"),
            ("reflection/entropy_first", "first token of a word", "^-"),
            ("reflection/entropy_at", "all tokens of a word", "o-"),
            ("reflection/entropy_before", "just before", "s-"),
        ],
    )
    axes[2].set_title("token entropy (nats)", fontsize=10)
    if drawn:
        axes[2].legend(fontsize=8)
    for a in axes:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


TOOL_KIND_ENTROPY = [
    ("entropy/kind/text", "text", "-"),
    ("entropy/kind/code", "code", "-"),
    ("entropy/kind/post_tool", "after a tool result", "-"),
]
TOOL_TURN_ENTROPY = [
    ("entropy/turn/first", "first turn", "--"),
    ("entropy/turn/later", "later turns", "--"),
]
TOOL_USE = [
    ("tools/turns/mean", "turns per response", "-"),
    ("tools/calls/mean", "calls per response", "-"),
    ("tools/error_frac", "share of calls in error", "--"),
    ("tools/time_frac", "share of step time in tools", ":"),
]


def tool_use_figure(rows: list[dict], title: str = ""):
    """The figure ``plot_tool_use`` saves, returned unsaved (a test measures its labels); None when
    the run logged no ``tools/*`` metric."""
    if not any(r.get("tools/calls/mean") is not None for r in rows):
        return None
    fig, axes = _pyplot().subplots(1, 3, figsize=(13.5, 4.0), layout="constrained")
    kinds, turns, use = axes
    turns.sharey(kinds)  # one entropy scale: a kind and a turn compare across the two panels
    drawn = [_lines(kinds, rows, TOOL_KIND_ENTROPY), _lines(turns, rows, TOOL_TURN_ENTROPY), _lines(use, rows, TOOL_USE)]
    if drawn[0] or drawn[1]:
        kinds.set_yscale("log")
    kinds.set_title("token entropy by kind (nats)", fontsize=10)
    turns.set_title("token entropy by turn (nats)", fontsize=10)
    use.set_title("tool use", fontsize=10)
    for ax, has_lines in zip(axes, drawn):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if has_lines:  # below the panel, never over its lines
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_tool_use(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """Multi-turn tool use at a glance (``docs/tools.md``): the entropy of each token kind (the
    policy's text and code, the tokens after a tool result), the entropy of the first vs later turns,
    and the tool use itself (turns and calls per response, the error share of the calls, the share of
    the step's wall time in tools); None when the run logged no ``tools/*`` metric (tools off).

    Kinds and turns get a panel each, on one shared log axis (the kinds sit orders of magnitude
    apart): they partition the same tokens two ways, so on one panel their lines coincide wherever
    the task makes them equal (later turns are all text after a tool result; a first turn without
    prose is all code), one line hidden under another. Legends sit below their panels, outside the
    lines they name."""
    fig = tool_use_figure(rows, title)
    return None if fig is None else save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Render ``fig`` beside ``path`` and rename it into place: never a 0-byte or half PNG."""
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png")
    finally:
        _pyplot().close(fig)
    return path


def plot_attribution(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """ "Why entropy moved": per measured step the parts stacked as bars (the positive parts above
    zero, the negative below): ``attribution/<part>``, adding up to ``predicted_net`` (dashed); the
    realised probe change as a line, and the first-order ``predicted_net_1st`` dotted beside it.
    None when no row holds an attribution."""
    measured = [r for r in rows if any(k.startswith(PARTS) for k in r)]
    if not measured:
        return None
    parts = sorted({k for r in measured for k in r if k.startswith(PARTS)})
    steps = [r["step"] for r in measured]
    width = 0.8 * (min(b - a for a, b in zip(steps, steps[1:])) if len(steps) > 1 else 1)
    fig, ax = _pyplot().subplots(figsize=(7.5, 3.6))
    up, down = [0.0] * len(measured), [0.0] * len(measured)
    for key in parts:
        vals = [float(r.get(key, 0.0)) for r in measured]
        base = [u if v >= 0 else d for v, u, d in zip(vals, up, down)]
        ax.bar(steps, vals, width, bottom=base, label=key.split("/", 1)[1])
        up = [u + max(v, 0.0) for v, u in zip(vals, up)]
        down = [d + min(v, 0.0) for v, d in zip(vals, down)]
    lines = [("entropy_change/realized", "k-o", "realised")]
    lines += [
        ("entropy_change/predicted_net", "k--", "predicted_net (trapezoid)"),
        ("entropy_change/predicted_net_1st", "k:", "predicted_net_1st (first order)"),
    ]
    for key, style, label in lines:
        pts = [(r["step"], r[key]) for r in measured if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), style, lw=1.2, ms=3, label=label)
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.set_xlabel("step")
    ax.set_ylabel("probe entropy change (nats/token)")
    ax.set_title(title or "why entropy moved", fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def mean_by_step(runs: list[list[dict]], prefixes: tuple[str, ...] = (PARTS, PARTS_1ST, "entropy_change/")) -> list[dict]:
    """The seed-mean row per step of ``runs`` (each a run's metric rows) over the keys starting with
    ``prefixes``: what a sweep variant's attribution figure draws. Steps no run measured are left out."""
    sums: dict[int, dict[str, list[float]]] = {}
    for rows in runs:
        for r in rows:
            for key, value in r.items():
                if key.startswith(prefixes) and isinstance(value, (int, float)):
                    sums.setdefault(int(r["step"]), {}).setdefault(key, []).append(float(value))
    return [{"step": step, **{k: sum(v) / len(v) for k, v in keys.items()}} for step, keys in sorted(sums.items())]
