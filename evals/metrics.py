"""Evaluation metrics over repeated samples (docs/algorithms.md §7).

For one problem with ``n`` samples of which ``c`` are correct:

- ``avg@n = c / n``;
- unbiased ``pass@k = 1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021), computed as the stable product
  ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, never through huge binomials;
- ``maj@n``: correctness of the most frequent extracted answer (answers are grouped by the
  grader's ``compact_key``; ties go to the answer seen first; samples with no answer do not
  vote; no answer at all counts as wrong).

A benchmark score is the mean over problems. Metric names carry ``@`` (``avg@32``); MLflow
forbids ``@`` in metric keys, so ``mlflow_key`` maps it to ``_at_`` (``eval/aime24/avg_at_32``).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from .grading.grader import MAX_ANSWER_CHARS, compact_key

__all__ = ["pass_at_k", "avg_at_n", "maj_at_n", "ks_for", "problem_metrics", "mean_metrics"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for ``c`` correct out of ``n`` samples: ``1 - C(n-c, k) / C(n, k)``."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_n(correct: Sequence[bool]) -> float:
    """Share of correct samples."""
    if not correct:
        raise ValueError("avg@n needs at least one sample")
    return sum(bool(x) for x in correct) / len(correct)


def maj_at_n(answers: Sequence[str | None], correct: Sequence[bool]) -> float:
    """1.0 if the most frequent (normalised) answer is a correct one, else 0.0."""

    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} verdicts")
    keys = [(compact_key(a) if len(a) <= MAX_ANSWER_CHARS else a) if isinstance(a, str) and a.strip() else None for a in answers]
    votes = Counter(k for k in keys if k)
    if not votes:
        return 0.0
    top = max(votes.values())
    winner = next(k for k in keys if k and votes[k] == top)  # first seen among the tied
    # The winner is correct if any sample carrying it was graded correct (all of them are, up
    # to grader time-outs on individual samples).
    return float(any(ok for k, ok in zip(keys, correct) if k == winner))


def ks_for(n: int) -> list[int]:
    """The k reported for n samples: the powers of two 1, 2, 4, ... that are <= n."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def problem_metrics(answers: Sequence[str | None], correct: Sequence[bool]) -> dict[str, float]:
    """``{"avg@n", "pass@k" for k in ks_for(n), "maj@n"}`` for one problem's samples."""
    n, c = len(correct), sum(bool(x) for x in correct)
    out = {f"avg@{n}": avg_at_n(correct)}
    for k in ks_for(n):
        out[f"pass@{k}"] = pass_at_k(n, c, k)
    out[f"maj@{n}"] = maj_at_n(answers, correct)
    return out


def mean_metrics(per_problem: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over problems (keys in first-seen order)."""
    if not per_problem:
        return {}
    keys: list[str] = []
    for m in per_problem:
        keys += [k for k in m if k not in keys]
    return {k: sum(m[k] for m in per_problem if k in m) / sum(1 for m in per_problem if k in m) for k in keys}
