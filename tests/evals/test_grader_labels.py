"""Math answers with labels and other equivalent forms: graded as math-verify grades
them, through the real fast path and math-verify workers, with their wrong twins still wrong."""

from __future__ import annotations

import pytest

from entropyrl.evals.grading.grader import extract_answer, grade_batch

# (response, gold, equivalent)
CASES = [
    ("\\boxed{f(x)=1}", "1", True),
    ("\\boxed{1}", "f(x)=1", True),
    ("\\boxed{f(x)=2}", "1", False),
    ("\\boxed{|AB|=1}", "1", True),
    ("\\boxed{A:B=1}", "1", True),
    ("\\boxed{|AB|=3}", "1", False),
    ("\\boxed{\\frac{NO}{BO}=\\frac{1}{\\sqrt6}}", "\\frac{1}{\\sqrt{6}}", True),
    ("\\boxed{\\frac{NO}{BO}=\\frac{1}{\\sqrt5}}", "\\frac{1}{\\sqrt{6}}", False),
    ("\\boxed{AB=4,CD=5}", "4, 5", True),
    ("\\boxed{4, 5}", "AB=4,CD=5", True),
    ("\\boxed{AB=4,CD=6}", "4, 5", False),
    ("\\boxed{p=5,q=2;p=7,q=2}", "(5,2),(7,2)", True),
    ("\\boxed{p=2,q=5;p=2,q=7}", "(5,2),(7,2)", False),
    ("\\boxed{p=5,q=2;p=7,q=3}", "(5,2),(7,2)", False),
    ("\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", True),
    ("\\boxed{\\begin{pmatrix}1&2\\\\3&5\\end{pmatrix}}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", False),
    ("\\boxed{2x+4y-3=0}", "y=-x/2+3/4", True),
    ("\\boxed{2x+4y-5=0}", "y=-x/2+3/4", False),
    ("\\boxed{\\pm 2021}", "\\{-2021, 2021\\}", True),
    ("\\boxed{\\pm 2020}", "\\{-2021, 2021\\}", False),
    ("\\boxed{2021}", "\\{-2021, 2021\\}", False),
    ("So x = 3, and the Answer: 7", "7", True),
    ("The total is 12, hence the Answer: 12", "13", False),
]


def _math_verify(response: str, gold: str) -> bool:
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0)]
    pred = extract_answer(response)
    return bool(verify(parse("\\boxed{" + gold + "}", config), parse("\\boxed{" + pred + "}", config)))


@pytest.fixture(scope="module")
def verdicts():
    return grade_batch([r for r, _, _ in CASES], [g for _, g, _ in CASES], workers=1)


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{r[:30]}|{g}" for r, g, _ in CASES])
def test_labelled_and_rearranged_answers_are_graded_as_math_verify_grades_them(i, verdicts):
    response, gold, equivalent = CASES[i]
    got = verdicts[i]
    assert got.correct is equivalent, (got.extracted, got.reason)
    assert _math_verify(response, gold) is equivalent  # the reference agrees with the table


def test_mid_line_answer_marker_only_without_a_box():
    assert extract_answer("The total is 12, hence the Answer: 12") == "12"
    assert extract_answer("We may check our answer: it holds.") is None
    # after a box, a mid-line "answer:" is a remark, not a new answer
    assert extract_answer("So \\boxed{5}. Checking the answer: 5 + 0 = 5") == "5"
