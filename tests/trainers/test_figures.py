"""The figures that show an intervention at work: curves.png's target line, gate shading and
collapse marker, the quadrant figure, the sweep plot's h_tgt line and the report's "acted" figures.
Drawn as SVG, whose text elements carry their labels as comments, so a test reads what a user sees."""

from __future__ import annotations

import pytest

from entropyrl.sweeps.report import _plot, acted, acted_cell
from entropyrl.trainers.run.plots import gate_spans, plot_quadrants, plot_training_curves
from entropyrl.trainers.run.run_report import entropy_target


def _rows(n: int = 12, gate: list[int] | None = None) -> list[dict]:
    rows = []
    for i in range(1, n + 1):
        r = {
            "step": i,
            "entropy": 1.0 / i,
            "reward/mean": 0.1 * i,
            "acc/mean": 0.05 * i,
            **{f"quadrant/q{q}/share": 0.1 * q + 0.001 * i for q in range(1, 5)},
        }
        if gate is not None:
            r["stare/gate_on"] = float(gate[i - 1])
        rows.append(r)
    return rows


def test_gate_spans_cover_each_open_stretch():
    rows = _rows(8, gate=[0, 1, 1, 0, 0, 1, 0, 1])
    assert gate_spans(rows) == [(1.5, 3.5), (5.5, 6.5), (7.5, 8.5)]
    assert gate_spans(_rows(4)) == []  # a run without the metric: no shading
    assert gate_spans(_rows(3, gate=[1, 1, 1])) == [(0.5, 3.5)]


def test_entropy_target_is_the_configured_set_point():
    assert entropy_target({"interventions": ["stare"], "stare": {"h_tgt": 0.3}}) == ("h_tgt", 0.3)
    assert entropy_target(
        {"interventions": ["clip_cov", "adaptive_entropy"], "clip_cov": {"k": 2}, "adaptive_entropy": {"target": 0.5}}
    ) == ("target", 0.5)
    assert entropy_target({"interventions": ["clip_cov"], "clip_cov": {}}) is None
    assert entropy_target({"interventions": []}) is None


def test_curves_draw_target_gate_and_collapse(tmp_path):
    rows = _rows(12, gate=[0] * 6 + [1] * 6)
    svg = plot_training_curves(rows, tmp_path / "curves.svg", title="stare", target=("h_tgt", 0.3), collapse_step=9).read_text()
    assert "h_tgt = 0.3" in svg and "stare gate open" in svg and "collapse (step 9)" in svg
    plain = plot_training_curves(_rows(12), tmp_path / "plain.svg").read_text()  # GRPO: the three curves only
    assert "h_tgt" not in plain and "gate open" not in plain and "collapse" not in plain
    assert plot_training_curves(rows, tmp_path / "curves.png").stat().st_size > 5000


def test_quadrant_figure_overlays_the_four_shares(tmp_path):
    svg = plot_quadrants(_rows(6), tmp_path / "quadrants.svg").read_text()
    for label in (
        "Q1: A&gt;0, low surprisal",
        "Q2: A&gt;0, high surprisal",
        "Q3: A&lt;0, high surprisal",
        "Q4: A&lt;0, low surprisal",
    ):
        assert label in svg
    assert plot_quadrants([{"step": 1, "entropy": 1.0}], tmp_path / "none.png") is None


def test_sweep_entropy_plot_names_the_threshold_h_tgt(tmp_path):
    svg = _plot({"gated": [_rows(5)]}, "entropy", "entropy", tmp_path / "entropy.svg", "gate", threshold=0.3).read_text()
    assert "h_tgt = 0.3" in svg and "threshold" not in svg


def test_acted_reads_any_interventions_metric_from_the_rows():
    gated = [_rows(4, gate=[0, 0, 1, 1]), _rows(4, gate=[0, 0, 0, 1])]
    assert acted(gated) == {"stare/gate_on": pytest.approx(3 / 8)}
    assert acted_cell(acted(gated)) == "stare/gate_on 0.38"
    # a token-selection rule: its share; two interventions in one run: both
    both = [[{**r, "clip_cov/frac": 0.02} for r in _rows(4, gate=[1, 1, 1, 1])]]
    assert acted(both) == {"clip_cov/frac": pytest.approx(0.02), "stare/gate_on": pytest.approx(1.0)}
    assert acted([_rows(4)]) == {} and acted_cell({}) == "-"  # GRPO: nothing acted
