"""The one problem type of the built-in tasks, the training sets and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One question with what a verifier needs to score a response to it: the problem type of the
    built-in tasks, the math training sets (``trainers/data/datasets.py``) and the eval benchmarks
    (``evals/benchmarks.py``) alike. Code problems (``evals.code_tasks.CodeProblem``) carry tests
    to run instead of an answer to compare, so they have their own type.

    task:     the family it was drawn from (``add``, ``countdown3``); "" for data-file items
    prompt:   the question. Built-in tasks: the model's literal prompt; data files: the problem
              statement that a prompt template (``evals/prompts.py``) wraps
    answer:   one reference answer (the gold answer of a benchmark item)
    params:   task parameters a built-in verifier uses
    id:       the item's id in its data file ("" for generated problems)
    messages: the file's own chat prompt when it has one (verl parquet), else None
    fields:   every column of the data row, untouched (what reward functions receive; ``{}`` for
              generated problems); not part of equality or the hash
    """

    task: str
    prompt: str
    answer: str
    params: tuple[int, ...] = ()
    id: str = ""
    messages: tuple[dict, ...] | None = None
    fields: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
