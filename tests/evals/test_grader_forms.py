"""Answer forms other graders' suites accept, each against a wrong twin that must stay wrong:
matrices in another bracket style, a set against ``\\pm``, tuples separated by ``;`` as an unordered
set, and a product commuted inside a sum (math-verify reads "c + 2ab" as c + 2 unless the whole
expression is kept). Real grading: the fast path and math-verify in worker processes."""

from __future__ import annotations

import pytest

from entropyrl.evals.grading.answer_normalize import split_parts
from entropyrl.evals.grading.grader import grade_batch

# (response, gold, correct)
FORMS = [
    (r"\boxed{\begin{bmatrix}1 & 2\\3 & 4\end{bmatrix}}", r"\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}", True),
    (r"\boxed{\begin{bmatrix}1 & 2\\3 & 5\end{bmatrix}}", r"\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}", False),
    (r"\boxed{\{-2021, 2021\}}", r"\pm 2021", True),
    (r"\boxed{\pm 2021}", r"\{-2021, 2021\}", True),
    (r"\boxed{\pm 2021}", r"-2021, 2021", True),
    (r"\boxed{\{-2021, 2020\}}", r"\pm 2021", False),
    (r"\boxed{2021}", r"\pm 2021", False),
    (r"\boxed{\pm 2021}", r"2021", False),
    (r"\boxed{\frac{1 \pm \sqrt{5}}{2}}", r"\frac{1+\sqrt{5}}{2}, \frac{1-\sqrt{5}}{2}", True),
    (r"\boxed{(1,2); (3,4)}", r"(3,4), (1,2)", True),
    (r"\boxed{(3,4), (1,2)}", r"(1,2); (3,4)", True),
    (r"\boxed{(1,2); (3,5)}", r"(3,4), (1,2)", False),
    (r"\boxed{2 b a + c}", r"c + 2ab", True),
    (r"\boxed{c + 2ab}", r"2ba + c", True),
    (r"\boxed{3 b a + c}", r"c + 2ab", False),
    (r"\boxed{c + 2ab}", r"c + 3ab", False),
]


@pytest.fixture(scope="module")
def verdicts():
    return grade_batch([r for r, _, _ in FORMS], [g for _, g, _ in FORMS], workers=2, timeout=10)


@pytest.mark.parametrize("i", range(len(FORMS)), ids=[f"{g} <- {r}" for r, g, _ in FORMS])
def test_answer_forms(verdicts, i):
    response, gold, correct = FORMS[i]
    assert verdicts[i].correct is correct, (response, gold, verdicts[i])


def test_pm_is_its_two_values_but_not_a_command_that_starts_with_pm():
    assert split_parts(r"\pm 2021") == ["-2021", "2021"]
    assert split_parts(r"1 \pm \sqrt{2}") == [r"1 - \sqrt{2}", r"1 + \sqrt{2}"]
    assert split_parts(r"3 \pmod{7}") == [r"3 \pmod{7}"]
