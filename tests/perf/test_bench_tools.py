"""`make bench` key `tools` (perf/tools.py): its executor part runs real sandboxed calls through the
executor a training run builds and reports their rate; every call of the tool task's additions
succeeds (a broken wrapper or sandbox would show as errors, not as a rate)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_tools_executor_runs_real_calls_and_reports_their_rate(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "perf"))
    spec = importlib.util.spec_from_file_location("bench_tools", REPO / "perf" / "tools.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "BATCHES", 1)
    monkeypatch.setattr(bench, "CALLS", 4)
    result = bench._executor()
    assert result["calls"] == 4 and result["errors"] == 0, result
    assert result["calls_per_s"] > 0 and result["workers"] >= 1
    assert result["launch"] == "zygote"  # the default a training run builds
    fresh = bench._executor("fresh")  # the figure beside it: a fresh interpreter per call
    assert (fresh["launch"], fresh["calls"], fresh["errors"]) == ("fresh", 4, 0), fresh
