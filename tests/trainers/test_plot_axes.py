"""Figures that compare at a glance: curves.png's entropy axis is set by the run's start and target,
not its trajectory (two runs that start alike share it; an exploding run widens it to its maximum),
and tools.png names every series with a label no other text covers, on panels where no line hides
another. The figures are built on matplotlib's Agg backend and measured through its renderer."""

from __future__ import annotations

import itertools

from entropyrl.trainers.run import plots
from entropyrl.trainers.run.plots import (
    HEADROOM,
    entropy_axis_limits,
    nice_ceiling,
    plot_tool_use,
    plot_training_curves,
    tool_use_figure,
    training_curves_figure,
)

START = [0.62, 0.60, 0.61]  # the first logged steps, shared by every run below


def _run(later: list[float], gate: list[int] | None = None) -> list[dict]:
    """Metric rows whose entropy starts at ``START`` and then follows ``later``."""
    entropies = START + later
    rows = [{"step": i + 1, "entropy": h, "reward/mean": 0.02 * i, "acc/mean": 0.01 * i} for i, h in enumerate(entropies)]
    for r, on in zip(rows, gate or []):
        r["stare/gate_on"] = float(on)
    return rows


COLLAPSING = _run([0.6 * 0.8**i for i in range(1, 30)])  # GRPO: sinks towards zero
HELD = _run([0.45 + 0.02 * (-1) ** i for i in range(29)], gate=[0, 1] * 16)  # STARE: held near h_tgt
EXPLODING = _run([0.6 * 1.25**i for i in range(1, 30)])  # climbs far past its start


def _entropy_ylim(fig) -> tuple[float, float]:
    return tuple(fig.axes[0].get_ylim())


def test_nice_ceiling_rounds_up_onto_a_coarse_grid():
    for value in (0.011, 0.26, 0.31, 0.999, 1.0, 1.01, 7.3, 123.0):
        ceiling = nice_ceiling(value)
        assert value <= ceiling < 1.3 * value  # never below, never far above
        assert nice_ceiling(ceiling) == ceiling  # a grid value is its own ceiling
    assert nice_ceiling(0.26) == nice_ceiling(0.29)  # starts a little apart share one ceiling


def test_runs_that_start_alike_share_the_entropy_axis_whatever_they_do_later():
    collapsing = entropy_axis_limits(COLLAPSING, target=None)
    held = entropy_axis_limits(HELD, target=0.45)
    assert collapsing == held
    low, high = collapsing
    assert low == 0.0 and high >= HEADROOM * sum(START) / len(START)  # room above the start
    assert entropy_axis_limits(COLLAPSING[:5]) == collapsing  # the trajectory after the start is irrelevant
    # a target above the start raises the ceiling so the set point is on the panel
    assert entropy_axis_limits(HELD, target=2.0)[1] >= 2.0 * HEADROOM
    assert entropy_axis_limits([{"step": 1, "entropy": float("nan")}]) is None


def test_an_exploding_run_widens_its_axis_to_its_maximum():
    shared = entropy_axis_limits(COLLAPSING)
    low, high = entropy_axis_limits(EXPLODING)
    peak = max(r["entropy"] for r in EXPLODING)
    assert low == 0.0 and high >= peak > shared[1]
    with_inf = EXPLODING + [{"step": 99, "entropy": float("inf")}]  # a non-finite value is skipped
    assert entropy_axis_limits(with_inf) == (low, high)


def test_curves_figure_sets_the_entropy_axis_from_the_helper():
    grpo = training_curves_figure(COLLAPSING, "grpo", collapse_step=12)
    stare = training_curves_figure(HELD, "stare", target=("h_tgt", 0.45))
    boom = training_curves_figure(EXPLODING, "boom")
    try:
        assert _entropy_ylim(grpo) == _entropy_ylim(stare) == entropy_axis_limits(COLLAPSING)
        assert _entropy_ylim(boom) == entropy_axis_limits(EXPLODING) != _entropy_ylim(grpo)
        # the gate's shading is still drawn on the entropy panel of the gated run only
        assert any(p.get_label() == "stare gate open" for p in stare.axes[0].patches)
        assert not grpo.axes[0].patches
    finally:
        for fig in (grpo, stare, boom):
            plots._pyplot().close(fig)


def test_saved_curves_png_uses_the_fixed_entropy_axis(tmp_path, monkeypatch):
    saved = []
    real_save = plots.save_figure

    def save_and_keep_limits(fig, path):
        saved.append(_entropy_ylim(fig))
        return real_save(fig, path)

    monkeypatch.setattr(plots, "save_figure", save_and_keep_limits)
    for name, rows in (("grpo", COLLAPSING), ("stare", HELD)):
        path = plot_training_curves(
            rows, tmp_path / f"{name}.png", title=name, target=("h_tgt", 0.45) if name == "stare" else None
        )
        assert path.stat().st_size > 5000
    assert saved == [entropy_axis_limits(COLLAPSING)] * 2


def _tool_rows(n: int = 8) -> list[dict]:
    """Rows carrying every series tools.png draws, with the coincidences a real tool task has: later
    turns are all text after a tool result, and a first turn without prose is all code."""
    rows = []
    for i in range(1, n + 1):
        code, post = 0.25 - 0.01 * i, 0.28 + 0.002 * i
        rows.append(
            {
                "step": i,
                "entropy/kind/text": 0.6 / i,
                "entropy/kind/code": code,
                "entropy/kind/post_tool": post,
                "entropy/turn/first": code,
                "entropy/turn/later": post,
                "tools/turns/mean": 1.97 + 0.003 * i,
                "tools/calls/mean": 0.97 + 0.003 * i,
                "tools/error_frac": 0.0,
                "tools/time_frac": 0.2,
            }
        )
    return rows


def _shown_tick_labels(ax) -> list:
    """The tick labels matplotlib draws: those inside the axis limits (the locator also labels a
    tick past each end, which is never drawn)."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    shown = [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]
    shown += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
    return [t for t in shown if t.get_visible() and t.get_text()]


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_tool_figure_labels_never_overlap_and_no_line_hides_another():
    fig = tool_use_figure(_tool_rows(), title="tool use: stare on tool_countdown (seed 0)")
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        labels = [t for legend in legends for t in legend.get_texts()]
        drawn = {ln.get_label() for ax in fig.axes for ln in ax.get_lines()}
        assert {t.get_text() for t in labels} == drawn  # every line named once
        assert {"after a tool result", "later turns", "first turn", "code"} <= drawn
        texts = labels + [fig._suptitle] + [t for ax in fig.axes for t in (ax.title, ax.xaxis.label) if t.get_text()]
        texts += [t for ax in fig.axes for t in _shown_tick_labels(ax)]
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
        for (name_a, a), (name_b, b) in itertools.combinations(boxes, 2):
            assert not _boxes_overlap(a, b), f"{name_a!r} overlaps {name_b!r}"
        for legend in legends:  # each legend sits outside every panel's lines
            for ax in fig.axes:
                assert not _boxes_overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))
        # no two lines of one panel coincide: a series equal to another by construction is on another panel
        for ax in fig.axes:
            for one, other in itertools.combinations(ax.get_lines(), 2):
                assert list(one.get_ydata()) != list(other.get_ydata()), (one.get_label(), other.get_label())
    finally:
        plots._pyplot().close(fig)


def test_tool_figure_is_written_only_with_tools(tmp_path):
    assert plot_tool_use(_tool_rows(), tmp_path / "tools.png").stat().st_size > 5000
    assert plot_tool_use([{"step": 1, "entropy": 0.3}], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_curves_draw_a_run_of_one_step(tmp_path):
    assert plot_training_curves(COLLAPSING[:1], tmp_path / "curves.png").exists()
