"""Grading: multi-part answers, final-answer markers, percent words, lists never read as a number,
gold unwrapping, a reason on every verdict, responses of any length, the eval warning.

Real math-verify workers, the real CLI; nothing mocked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from entropyrl.evals.grading.answer_normalize import split_parts
from entropyrl.evals.grading.grader import (
    REASONS,
    GradeResult,
    extract_answer,
    grade_answers,
    grade_batch,
    no_answer_warning,
    reason_counts,
)


def _grade(response: str, gold: str) -> GradeResult:
    return grade_batch([response], [gold])[0]


# 1. Several boxes form one answer ---------------------------------------------------------


@pytest.mark.parametrize(
    "response, gold, correct",
    [
        ("The solutions are $\\boxed{3}$ and $\\boxed{-1}$.", "-1, 3", True),
        ("The solutions are $\\boxed{3}$ and $\\boxed{-1}$.", "3", False),  # a list vs one answer
        ("The solutions are $\\boxed{3}$ and $\\boxed{-1}$.", "-1, 4", False),
        ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "\\{1,2,3\\}", True),
        ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "1, 2", False),  # a part too many
        ("\\[\\boxed{(1, 2)};\\ \\boxed{(2, 1)}\\]", "(2,1),(1,2)", True),  # order-insensitive
        ("\\(x_1 = \\boxed{2}\\), \\(x_2 = \\boxed{5}\\)", "x_{2}=5, x_{1}=2", True),  # labels match up
        ("\\(x_1 = \\boxed{2}\\), \\(x_2 = \\boxed{5}\\)", "x_1=5, x_2=2", False),  # ... and matter
        ("\\boxed{\\sqrt{8}} \\text{ and } \\boxed{1}", "1, 2\\sqrt{2}", True),  # part by part via math-verify
        ("first try \\boxed{4}.\n\nActually the total is \\boxed{5}.", "5", True),  # not one region
    ],
)
def test_several_boxes_form_one_answer(response, gold, correct):
    result = _grade(response, gold)
    assert result.correct is correct, result


def test_the_final_region_is_written_as_its_parts():
    answer = extract_answer("so $y_1 = \\boxed{x+1}$ and $y_2 = \\boxed{2x}$. Done.")
    assert answer == "y_1 = x+1, y_2 = 2x"
    assert split_parts(answer) == ["y_1 = x+1", "y_2 = 2x"]


# 2. The final answer is the last marker by position ----------------------------------------


@pytest.mark.parametrize(
    "response, expected",
    [
        ("we get \\boxed{12} apples, then 8 more.\nFinal Answer: The final answer is $20$. I hope it is correct.", "20"),
        ("\\boxed{7}\n\nAnswer: 9", "9"),
        ("Answer: $\\boxed{4}$", "4"),
        ("\\boxed{7}. So the answer is correct.", "7"),  # "correct" is not an answer
        ("so \\boxed{44}.\nWe may check our answer: $17\\cdot 44 = 748$.", "44"),  # "our answer:" mid-line
        ("The answer is $\\frac{3}{4}$. Let me explain why.", "\\frac{3}{4}"),
        ("**Final Answer:** 7.", "7"),
    ],
)
def test_final_answer_by_position_among_markers(response, expected):
    assert extract_answer(response) == expected


def test_minerva_final_answer_after_a_box_is_graded():
    response = "Interest: $\\boxed{255}$. Total $10,200 + $255 = $10,455.\nFinal Answer: The final answer is $10,455$. I hope it is correct."
    assert [r.correct for r in grade_batch([response] * 2, ["10455", "255"])] == [True, False]


# 3. Percent words ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, gold, correct",
    [
        ("\\boxed{45 percent}", "45\\%", True),
        ("\\boxed{45\\text{ percent}}", "45\\%", True),
        ("\\boxed{45 percentage}", "45", True),
        ("\\boxed{45 pct}", "46\\%", False),
    ],
)
def test_percent_words(response, gold, correct):
    assert _grade(response, gold).correct is correct


def test_a_dropped_percent_is_never_rejected_by_the_fast_path():
    # math-verify reads "45\\%" as a value of its own: only it may reject against 0.45.
    assert _grade("\\boxed{0.45}", "45\\%").decided_by == "math_verify"


# 4. A list is never read as a number ---------------------------------------------------------


@pytest.mark.parametrize(
    "response, gold, correct",
    [
        ("\\boxed{32, 349}", "32349", False),
        ("\\boxed{1, 000}", "1000", False),
        ("\\boxed{2, 3}", "2", False),
        ("\\boxed{3} or \\boxed{4}", "3", False),  # hedging is not rewarded
        ("\\boxed{1,000}", "1000", True),
        ("\\boxed{32,\\! 349}", "32349", True),  # LaTeX's thousands separator
        ("\\boxed{14{,}916}", "14916", True),
        ("\\boxed{5}, \\boxed{5}", "5", True),  # the same answer twice
        ("\\boxed{0.5}, or \\boxed{\\frac{1}{2}}", "0.5", True),  # one value in two forms
    ],
)
def test_lists_are_not_numbers(response, gold, correct):
    assert _grade(response, gold).correct is correct


# Gold answers unwrapped like responses -------------------------------------------------------


@pytest.mark.parametrize("gold", ["\\boxed{1}, \\boxed{2}", "$1, 2$", "So the answers are \\[\\boxed{2}, \\boxed{1}\\]"])
def test_gold_answers_are_unwrapped(gold):
    assert _grade("\\boxed{2, 1}", gold).correct is True


# Reasons -------------------------------------------------------------------------------------


def test_every_verdict_has_a_reason_that_names_the_deciding_step():
    cases = [
        ("\\boxed{073}", "73", "match", "fast_path"),
        ("\\boxed{5}", "6", "mismatch", "fast_path"),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", "math_verify_match", "math_verify"),
        ("\\boxed{x^2+1}", "x^2-1", "math_verify_mismatch", "math_verify"),
        ("", "5", "empty_response", "extraction"),
        ("   \n", "5", "empty_response", "extraction"),
        ("no final answer here", "5", "no_answer", "extraction"),
        ("cut off inside \\boxed{\\frac{1}{", "5", "unclosed_box", "extraction"),
        ("\\boxed{" + "1" * 2000 + "}", "5", "too_long_answer", "extraction"),
        ("\\boxed{5}", "", "bad_gold", "extraction"),
    ]
    results = grade_batch([c[0] for c in cases], [c[1] for c in cases])
    assert [(r.reason, r.decided_by) for r in results] == [(c[2], c[3]) for c in cases]
    assert all(r.reason in REASONS for r in results)
    counts = reason_counts(results)
    assert counts["empty_response"] == 2 and sum(counts.values()) == len(cases)


def test_timeouts_are_a_reason():
    [(ok, reason)] = grade_answers(["9^{9^{9^{9}}}"], ["5"], timeout=0.5)
    assert (ok, reason) == (False, "timeout")


# Responses of any length, searched from the end in linear time -------------------------------


def test_long_responses_are_searched_to_their_end():
    long = "Let us think. " * 300_000 + "So \\boxed{42}."  # 4.2 MB, far past any old cutoff
    [right, wrong] = grade_batch([long, long], ["42", "41"])
    assert (right.correct, right.extracted, right.reason) == (True, "42", "match")
    assert (wrong.correct, wrong.reason) == (False, "mismatch")


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{" * 200_000 + "5}",  # every box but the last unclosed
        "answer: " * 200_000,  # markers with no answer after them
        "\\boxed{1}, " * 50_000 + "\\boxed{2}",  # a huge final region: over the answer cap
        "the answer is " * 200_000 + "$5$",
    ],
)
def test_hostile_long_responses_stay_linear(response):
    # Generous bound: quadratic work on these 1-3 MB inputs would take minutes.
    started = time.monotonic()
    grade_batch([response], ["7"], timeout=2.0)
    assert time.monotonic() - started < 20.0


# Summaries and the eval warning --------------------------------------------------------------


def test_no_answer_warning_above_a_quarter():
    results = grade_batch(["\\boxed{1}", "\\boxed{2}", "\\boxed{4}", "", "cut \\boxed{3"], ["1", "2", "3", "3", "3"])
    assert no_answer_warning(results[:4], "aime24") is None  # 1 of 4: not above 25%
    line = no_answer_warning(results, "aime24")
    assert line and "\n" not in line and "2 of 5" in line and "aime24" in line


def test_grade_cli_writes_reasons_and_counts_them(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [("\\boxed{2}", "2"), ("\\boxed{32, 349}", "32349"), ("", "1"), ("x" * 300_000 + "\\boxed{7}", "7")]
    src.write_text("".join(json.dumps({"response": r, "answer": a}) + "\n" for r, a in rows))
    run = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "grade", str(src), "--out", str(dst)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    graded = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [g["reason"] for g in graded] == ["match", "mismatch", "empty_response", "match"]
    assert "reasons: match 2, mismatch 1, empty_response 1" in run.stdout


def _grade_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "grade", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_grade_refuses_an_out_that_is_its_input_by_any_name(tmp_path):
    """`grade X --out X` (also via ../, a symlink, a hard link) leaves X intact."""
    (tmp_path / "sub").mkdir()
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"response": "\\boxed{2}", "answer": "2"}) + "\nnot json\n")
    before = src.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(src)
    os.link(src, tmp_path / "hard.jsonl")
    for out in ("in.jsonl", "sub/../in.jsonl", "link.jsonl", "hard.jsonl", str(src)):
        run = _grade_cli("in.jsonl", "--out", out, cwd=tmp_path)
        lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
        assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
        assert lines[0].startswith(f"error: --out {out} is the input file") and "Traceback" not in run.stderr
        assert src.read_bytes() == before
    assert _grade_cli(str(tmp_path / "link.jsonl"), "--out", "in.jsonl", cwd=tmp_path).returncode == 2
    assert src.read_bytes() == before


def test_grade_on_a_folder_says_it_is_a_folder(tmp_path):
    run = _grade_cli(str(tmp_path))
    assert run.returncode == 2 and f"error: {tmp_path} is a folder" in run.stderr and "no such file" not in run.stderr


def test_grade_output_appears_whole_or_not_at_all(tmp_path):
    """The graded file is written beside and renamed into place: no temp file is left, and an
    existing output stays as it was until the new one is complete."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"response": f"\\boxed{{{i}}}", "answer": str(i)}) + "\n" for i in range(5)))
    dst.write_text("old\n")
    assert _grade_cli(str(src), "--out", str(dst)).returncode == 0
    assert len(dst.read_text().splitlines()) == 5 and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("entropyrl.models") is None, reason="no tiny model")
def test_eval_warns_when_most_responses_are_cut_short(tmp_path, data_dir):
    # 8 new tokens: no response gets as far as a final answer.
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "entropyrl.cli.main",
            "eval",
            "aime24",
            "model=tiny",
            "model.warm_start.steps=3",
            "model.warm_start.batch_size=8",
            "eval.n_samples=2",
            "eval.limit=2",
            "eval.max_new_tokens=8",
            "tracking.enabled=false",
            "output_dir=run",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "ENTROPYRL_DATA": str(data_dir)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    bench = summary["benchmarks"]["aime24"]
    assert sum(bench["grade_reasons"].values()) == 4
    # the cut-short warning, once; beside it the embedded model's own warning that AIME's English
    # prompts hold characters it cannot represent (eval.unrepresentable=warn, the default)
    cut = [w for w in summary["warnings"] if "without a final answer" in w]
    assert len(cut) == 1 and "aime24" in cut[0]
    assert all("without a final answer" in w or "cannot represent" in w for w in summary["warnings"])
    assert sum("warning" in line and "without a final answer" in line for line in run.stderr.splitlines()) == 1
