"""The built-in verifiers as reward functions: ``builtin:math``, ``builtin:code``,
``builtin:countdown``, ``builtin:toy``.

Each takes the same keywords as a user reward function plus ``source`` (the prompt source of
the run, whose grading settings and code sandbox they use) and returns 1.0 / 0.0 (code with
``data.reward=fraction``: the share of tests passed). Model text is never executed except code,
which runs only in the sandbox (through the code source).
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..core.errors import UserError
from ..evals.code.code_tasks import CodeProblem
from ..evals.grading.grader import DEFAULT_TIMEOUT, grade_batch, ungraded_warning
from ..tasks import builtin as tasks

__all__ = ["BUILTIN_REWARDS"]


def _math(*, responses: Sequence[str], problems: Sequence, source=None, log=print, **_) -> list[float]:
    """The math grader (normalisation + math-verify in worker processes) on the gold ``answer``; the
    responses it did not decide (timed out, worker died) score 0 and are said on ``log``."""
    timeout = float(getattr(source, "timeout", DEFAULT_TIMEOUT))
    results = grade_batch(
        list(responses), [p.answer for p in problems], workers=getattr(source, "workers", None), timeout=timeout
    )
    undecided = ungraded_warning([r.reason for r in results], timeout)
    if undecided:
        log(undecided)
    return [1.0 if r.correct else 0.0 for r in results]


def _code(*, responses: Sequence[str], problems: Sequence, source=None, **_) -> list[float]:
    """The program run against the problem's tests in the sandbox (``data.kind=code``)."""
    if not problems or not isinstance(problems[0], CodeProblem) or not hasattr(source, "pool"):
        raise UserError(
            "reward function builtin:code grades code problems: use it with data.kind=code (e.g. data=humaneval_code)"
        )
    return list(source.rewards(problems, responses))


def _task_family(ref: str, accepts: Callable[[str], bool], what: str) -> Callable:
    def grade(*, responses: Sequence[str], problems: Sequence, **_) -> list[float]:
        for p in problems:
            task = getattr(p, "task", "")
            if task not in tasks.TASKS or not accepts(task):
                raise UserError(
                    f"reward function {ref} grades {what}; this data has task {task!r}: "
                    f"use data=toy / data=countdown or another builtin:"
                )
        return [float(tasks.reward(p, r)) for p, r in zip(problems, responses)]

    grade.__name__ = ref.split(":")[1]
    return grade


#: ``name -> fn(*, responses, problems, source, **fields)``: the built-in verifiers.
BUILTIN_REWARDS: dict[str, Callable] = {
    "math": _math,
    "code": _code,
    "countdown": _task_family("builtin:countdown", lambda t: t.startswith("countdown"), "countdown problems"),
    "toy": _task_family("builtin:toy", lambda t: not t.startswith("countdown"), "the toy tasks (add, multiple)"),
}
