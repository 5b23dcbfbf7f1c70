"""docs/planning.md's GPU section is generated from the result files in docs/gpu/ (perf/gpu_report.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from .conftest import load_perf

REPO = Path(__file__).resolve().parents[2]


def _module():
    return load_perf("gpu_report")


def test_the_planning_page_shows_exactly_the_result_files():
    report = _module()
    text = (REPO / "docs" / "planning.md").read_text()
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1
    section = text.split(report.BEGIN)[1].split(report.END)[0]
    sessions = report.load(REPO / "docs" / "gpu")
    assert sessions, "docs/gpu/ holds the GPU results the page cites"
    assert section == "\n" + report.render(sessions)  # regenerate with: python perf/gpu_report.py


def test_a_session_renders_its_checks_skips_and_runs_newest_first(tmp_path):
    report = _module()
    name, first = report.load(REPO / "docs" / "gpu")[0]
    check = first["checks"][0]
    later = copy.deepcopy(first)
    later["date"] = "2999-01-01"
    later["checks"] = [{**copy.deepcopy(check), "argv": ["--batch", "2"], "vllm": {"skipped": "no engine here"}}]
    later["checks"][0]["train"].update(step_seconds=1.5, tokens_per_s=1234.0, mfu=0.25, plan_vs_peak=1.1)
    later["train"] = later["train"][:1]
    later["train"][0]["summary"]["flags"] = []
    text = report.render([(name, first), ("later.json", later)])
    assert text.index("2999-01-01") < text.index(first["date"])  # newest first
    assert "| `--batch 2` |" in text and "| 1.5 | 1,234 | 25.0% |" in text and "| 1.1 |" in text
    assert "`vllm` phase not run: no engine here" in text
    assert "| none |" in text  # a run without a collapse flag
    page = tmp_path / "page.md"
    page.write_text(f"prose\n{report.BEGIN}\nold\n{report.END}\nafter\n")
    report.write([("later.json", later)], page)
    assert "old" not in page.read_text() and page.read_text().startswith("prose\n") and page.read_text().endswith("after\n")
    assert report.render([]).startswith("No GPU results yet")
    bare = tmp_path / "bare.md"
    bare.write_text("nothing\n")
    with pytest.raises(SystemExit, match="needs one"):
        report.write([], bare)


def test_every_result_file_records_how_and_with_what_it_was_measured():
    for path in sorted((REPO / "docs" / "gpu").glob("*.json")):
        result = json.loads(path.read_text())
        assert result["date"] and result["how"] and result["machine"]["gpu"], path
        for check in result.get("checks", []):
            assert "argv" in check and check["versions"]["torch"] and "plan_vs_peak" in check["train"], path
        for run in result.get("train", []):
            assert run["command"].startswith("entropyrl train") and run["summary"]["status"], path
