"""Grading parity with math-verify's own regression suite (its cases whose prediction has a box).

The 95 cases are vendored from the math-verify 0.9.0 sdist (tests/data/math_verify/, with its
licence). `entropyrl grade` (the real CLI, in a subprocess) must agree with the suite's expected
verdict on at least as many cases as math-verify itself does (graded as the suite grades them),
and never call a wrong answer right.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).parents[1] / "data" / "math_verify" / "boxed_cases.jsonl"


@pytest.fixture(scope="module")
def cases():
    rows = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    assert len(rows) == 95 and all("boxed" in r["pred"] for r in rows)
    return rows


def _math_verify_verdicts(rows) -> list[bool]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    out = []
    for r in rows:
        targets = [
            LatexExtractionConfig(boxed_match_priority=0) if m == "latex" else ExprExtractionConfig() for m in r["match_types"]
        ]
        out.append(bool(verify(parse(r["gold"], targets), parse(r["pred"], targets))))
    return out


def test_entropyrl_grade_agrees_with_the_suite_at_least_as_often_as_math_verify(cases, tmp_path):
    src, dst = tmp_path / "cases.jsonl", tmp_path / "graded.jsonl"
    src.write_text("".join(json.dumps({"source": r["source"], "response": r["pred"], "answer": r["gold"]}) + "\n" for r in cases))
    run = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "grade", str(src), "--out", str(dst)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    graded = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [g["source"] for g in graded] == [r["source"] for r in cases]

    ours = [g["correct"] == r["expected"] for g, r in zip(graded, cases)]
    theirs = [v == r["expected"] for v, r in zip(_math_verify_verdicts(cases), cases)]
    false_positives = [r["source"] for g, r in zip(graded, cases) if g["correct"] and not r["expected"]]
    misses = [(r["source"], g["extracted"], g["reason"]) for g, r in zip(graded, cases) if g["correct"] != r["expected"]]
    assert not false_positives
    assert sum(ours) >= sum(theirs), misses
    assert sum(theirs) >= 90  # the suite still grades math-verify as its authors saw it
    assert all(g["reason"] for g in graded)
