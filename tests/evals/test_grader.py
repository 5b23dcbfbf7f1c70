"""Grading: answer extraction, normalisation, math-verify equivalence, time limits, hostile input.

Real reference solutions (MATH-500, AIME 2024) and real math-verify; nothing mocked.
"""

from __future__ import annotations

import json
import time

import pytest

from entropyrl.evals.grading import grader
from entropyrl.evals.grading.grader import compact_key, extract_answer, grade_answers, grade_batch, is_equiv


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def reference(data_dir):
    rows = _rows(data_dir / "math500" / "test.jsonl") + _rows(data_dir / "qwen-math-eval" / "aime24" / "test.jsonl")
    assert len(rows) == 530
    return [r["solution"] for r in rows], [str(r["answer"]) for r in rows]


def test_reference_solutions_match_their_gold_answers(reference):
    solutions, golds = reference
    results = grade_batch(solutions, golds)
    correct = sum(r.correct for r in results)
    misses = [(r.extracted, g) for r, g in zip(results, golds) if not r.correct]
    assert correct / len(results) >= 0.998, misses
    # The case plain math-verify misses (PLATFORM.md): AIME gold "073" vs a solution's \textbf{(073)}.
    assert any(g == "073" for g in golds)
    assert all(r.correct for r, g in zip(results, golds) if g == "073")


def test_reference_solutions_with_another_problems_answer_are_all_wrong(reference):
    solutions, golds = reference
    swapped = []
    for i, g in enumerate(golds):
        # the next problem whose answer is a different string after normalisation
        j = next(j % len(golds) for j in range(i + 1, i + len(golds)) if compact_key(golds[j % len(golds)]) != compact_key(g))
        swapped.append(golds[j])
    results = grade_batch(solutions, swapped)
    wrong_verdicts = [(r.extracted, s) for r, s in zip(results, swapped) if r.correct]
    assert not wrong_verdicts
    assert all(r.extracted for r in results)  # the answer was found, just not equal


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("073", "73"),
        ("73", "073"),
        ("27.0", "27"),
        ("1,000", "1000"),
        ("\\text{Evelyn}", "Evelyn"),
        ("30^\\circ", "30"),
        ("30^{\\circ}", "30"),
        ("\\$18", "18"),
        ("18.", "18"),
        ("10\\%", "10"),
        ("5\\text{ cm}", "5"),
        ("\\textbf{(C)}", "C"),
        ("x=5", "5"),
        ("\\dfrac{1}{2}", "0.5"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("\\sqrt{8}", "2\\sqrt{2}"),
        ("\\{1,2\\}", "\\{2,1\\}"),
        ("2,125", "2125"),
        (".5", "0.5"),
    ],
)
def test_equivalent_answers(pred, gold):
    assert is_equiv(pred, gold)


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("5", "6"),
        ("\\frac{1}{3}", "0.33"),
        ("x^2", "x^3"),
        ("(1,2)", "(2,1)"),
        ("\\text{Evelyn}", "Bob"),
        ("730", "73"),
        ("-5", "5"),
        ("", "5"),
        ("5", ""),
        ("\\sqrt{2}", "2"),
    ],
)
def test_different_answers(pred, gold):
    assert not is_equiv(pred, gold)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("first \\boxed{1}, finally \\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("nested \\boxed{\\frac{a}{\\sqrt{b}}}", "\\frac{a}{\\sqrt{b}}"),
        ("\\fbox{42}", "42"),
        ("\\framebox[2cm]{7}", "7"),
        ("$\\boxed 5$", "5"),
        ("work...\nAnswer: $42$", "42"),
        ("**Final Answer:** 7.", "7"),
        ("answer: 3\nAnswer: 4", "4"),
        ("no final answer here", None),
        ("\\boxed{}", None),
        ("cut off \\boxed{12", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_grade_batch_reports_extracted_answers_and_reasons():
    out = grade_batch(
        ["x \\boxed{073}", "\\boxed{\\sqrt{8}}", "Answer: 9", "nothing", "\\boxed{\\dfrac{2}{4}}"],
        ["73", "2\\sqrt{2}", "8", "1", "0.5"],
    )
    assert [r.correct for r in out] == [True, True, False, False, True]
    assert [r.extracted for r in out] == ["073", "\\sqrt{8}", "9", None, "\\dfrac{2}{4}"]
    assert [r.reason for r in out] == ["match", "math_verify_match", "mismatch", "no_answer", "match"]


def test_one_and_two_workers_agree(reference):
    solutions, golds = reference
    preds = [extract_answer(s) for s in solutions[:60]]
    mixed = golds[:30] + golds[31:61]  # half right, half another problem's answer
    assert grade_answers(preds, mixed, workers=1) == grade_answers(preds, mixed, workers=2)


def test_pathological_inputs_are_false_and_bounded():
    limit = 2.0
    tower = "9^{9^{9^{9}}}"
    cases = [
        ("\\boxed{" + tower + "}", "5"),  # math-verify would spin for seconds
        ("\\boxed{" + tower + "}", tower + "+1"),
        ("x" * 1_000_000 + "\\boxed{5}", "6"),  # 1 MB response: searched, wrong answer
        ("\\boxed{" + "1+" * 5000 + "1}", "5"),  # 10 kB answer: over the answer cap
        ("\\boxed{" + "{" * 50_000, "5"),  # unbalanced braces
        ("\\boxed{" + "{" * 400 + "1" + "}" * 400 + "}", "2"),  # deep nesting
        (bytes(range(256)) * 100, "5"),  # binary garbage
        ("\x00\ud800\\boxed{\x00\x01}", "5"),  # NUL and a lone surrogate
        ("", "5"),
        (None, "5"),
        (42, "5"),
    ]
    for response, gold in cases:
        started = time.monotonic()
        [result] = grade_batch([response], [gold], timeout=limit)
        elapsed = time.monotonic() - started
        assert result.correct is False, (str(response)[:60], result)
        # Generous bound: the point is that the limit is enforced, not how fast the machine is.
        assert elapsed < limit + 5.0, (str(response)[:60], elapsed)


def test_time_limit_is_enforced_from_outside_and_the_pool_recovers():
    # A limit below math-verify's own 1 s signal granularity: only the parent's kill can stop it.
    started = time.monotonic()
    [result] = grade_batch(["\\boxed{9^{9^{9^{9}}}}"], ["5"], timeout=0.5)
    assert result.correct is False and result.reason == "timeout"
    assert time.monotonic() - started < 4.0
    # The killed worker was replaced: grading still works.
    assert [r.correct for r in grade_batch(["\\boxed{\\frac{1}{2}}", "\\boxed{3}"], ["0.5", "4"])] == [True, False]


def test_model_text_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f"\\boxed{{__import__('os').system('touch {marker}')}}",
        f"Answer: __import__('pathlib').Path('{marker}').touch()",
        f"\\boxed{{exec(\"open('{marker}', 'w').write('x')\")}}",
        f"\\boxed{{eval(\"__import__('os').system('touch {marker}')\")}}",
    ]
    results = grade_batch(payloads, ["0"] * len(payloads))
    assert not any(r.correct for r in results)
    assert not marker.exists()


def test_length_caps_are_applied():
    long_answer = "1" * (grader.MAX_ANSWER_CHARS + 1)
    [r] = grade_batch(["\\boxed{" + long_answer + "}"], [long_answer])
    assert r.correct is False and r.reason == "too_long_answer"


@pytest.mark.parametrize(
    "key, value",
    [
        ("3\\sqrt{13}", 3 * 13**0.5),
        ("-\\frac{\\pi}{6}", -3.141592653589793 / 6),
        ("2^{10}", 1024.0),
        ("\\frac12", 0.5),
        ("\\sqrt[3]{27}", 3.0),
        ("(1+2)\\cdot3", 9.0),
        ("10^{-3}", 0.001),
        ("-2^2", -4.0),
        ("x", None),
        ("1,2", None),
        ("1/2", None),
        ("2^10", None),
        ("6-5i", None),
        ("9^{9^{9^{9}}}", None),
        ("\\frac{1}{0}", None),
        ("\\sqrt{-1}", None),
        ("(" * 5000 + "1" + ")" * 5000, None),
        ("", None),
    ],
)
def test_numeric_value_is_a_safe_little_evaluator(key, value):
    got = grader.numeric_value(key)
    assert got == pytest.approx(value) if value is not None else got is None


def test_numeric_fast_path_only_rejects_clearly_different_values():
    assert grade_answers(["3\\sqrt{13}", "\\frac{\\pi}{6}", "2^{10}"], ["90", "0.5", "1000"]) == [(False, "mismatch")] * 3
    # close values and equal values are left to math-verify
    assert grade_answers(["3\\sqrt{2}", "\\frac{\\pi}{6}"], ["\\sqrt{18}", "0.5235988"])[0] == (True, "math_verify_match")


def test_a_training_reward_says_the_responses_the_grader_did_not_decide(tmp_path):
    """A response math-verify timed out on scored 0 like a wrong answer, with no count anywhere."""
    import json

    from entropyrl.conf import compose
    from entropyrl.rewards.runner import RewardRunner
    from entropyrl.trainers.data.datasets import MathDatasetSource

    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"problem": "big", "answer": "5"}) + "\n" + json.dumps({"problem": "two", "answer": "2"}) + "\n")
    data = compose("train", ["data=dapo_math_17k", f"data.path={path}", "data.grade_timeout=0.5", "data.grade_workers=1"]).data
    source = MathDatasetSource(data, 0)
    said: list[str] = []
    source.log = said.append
    problems = sorted(source.train_items, key=lambda p: p.answer)
    hard, easy = "\\boxed{9^{9^{9^{9}}}}", "\\boxed{2}"
    assert source.rewards(problems, [easy, easy]) == [1.0, 0.0] and said == []  # the null: every response decided
    assert source.rewards(problems, [easy, hard]) == [1.0, 0.0]
    assert said == [
        "warning: grading: 1 of 2 response(s) were not decided (timeout 1; data.grade_timeout=0.5 s) and score 0 as "
        "wrong: raise data.grade_timeout, or leave the grader more CPU (data.grade_workers)"
    ]
    logged: list[str] = []  # the same through reward.functions' builtin:math
    runner = RewardRunner({"functions": ["builtin:math"]}, None, log=logged.append)
    runner.bind(source)
    runner.score(problems, ["p", "p"], [easy, hard], [0, 1])
    assert logged == said
