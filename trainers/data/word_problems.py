"""Training prompts from generated arithmetic word problems (``data.kind: word_problems``,
``conf/data/word_problems.yaml``; the generator is ``tasks/word_problems.py``).

- Prompts: the problem, then ``data.instruction`` (how to answer; a long "reason step by step"
  sends a small model rambling past its token cap), as one user message through the tokenizer's
  chat template when it has one (``data.chat_template: auto``; ``evals.prompts.build_prompt``, as
  the math sets).
- Rewards: the response's final answer (last ``\\boxed{}`` or ``Answer:`` line, as the math grader
  reads it), else the last number it writes -- small chat models often end with "... so Mia has 9
  apples." instead of a box -- compared with the answer by the math grader (``evals.grader``); model
  text is never executed.
- Order: training prompts for step ``s`` are a pure function of ``(seed, s)`` (a resumed run sees
  the same prompts); validation prompts come from their own stream (``data.val_seed``).
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import Sequence

from ...conf import cfg_get
from ...core.errors import UserError
from ...evals.grading.grader import extract_answer, grade_answers, ungraded_warning
from ...evals.prompts import NATIVE, build_prompt
from ...tasks.word_problems import level, make_word_problem

__all__ = ["WordProblemSource", "final_answer"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(response: str) -> str | None:
    """What a response answers: its final answer marker's content, else the last number in it
    (thousands separators dropped), else None."""
    marked = extract_answer(response)
    if marked is not None:
        return marked
    numbers = _NUMBER.findall(response or "")
    return numbers[-1].replace(",", "") if numbers else None


def reads_english(tokenizer) -> bool:
    """Whether ``tokenizer`` writes a sample problem back as it was (a character tokenizer of digits
    and symbols drops or replaces the letters)."""
    if not callable(tokenizer) or not hasattr(tokenizer, "decode"):
        return True
    sample = "Mia has 7 apples. How many apples does Mia have now?"
    ids = tokenizer(sample, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids, skip_special_tokens=True).strip() == sample


class WordProblemSource:
    """A ``PROMPT_SOURCES`` entry (``data.kind: word_problems``); see the module docstring."""

    log = staticmethod(print)  # where a step's grading warnings go (the trainer's log: components.build_source)

    def __init__(self, data_cfg, seed: int, tokenizer=None):
        self.cfg = data_cfg
        self.seed = int(seed)
        self.tokenizer = tokenizer
        self.difficulty = cfg_get(data_cfg, "difficulty", None)
        if self.difficulty is None:  # declared in conf/data/word_problems.yaml, never guessed here
            raise UserError("data.kind=word_problems needs data.difficulty (1-5; conf/data/word_problems.yaml sets 1)")
        level(self.difficulty)  # an unknown difficulty: an error now, not at the first step
        self.instruction = str(cfg_get(data_cfg, "instruction", "") or "").strip()
        self.chat_template = data_cfg.chat_template
        self.timeout = float(data_cfg.grade_timeout)
        self.workers = cfg_get(data_cfg, "grade_workers", None)
        self.name = str(data_cfg.name)
        if tokenizer is not None and not reads_english(tokenizer):
            raise UserError(
                "data=word_problems needs a model whose tokenizer reads English text, e.g. model=smollm2-135m "
                "(the embedded model's tokenizer has only digits and a few symbols)"
            )

    def _draw(self, n: int, rng: random.Random) -> list:
        return [make_word_problem(rng, self.difficulty) for _ in range(n)]

    def sample(self, n: int, step: int, attempt: int = 0) -> list:
        return self._draw(n, random.Random(f"word/{self.seed}/{step}/{attempt}"))

    def validation(self, n: int) -> list:
        return self._draw(n, random.Random(f"word/val/{int(self.cfg.val_seed)}"))

    def prompt(self, problem) -> str:
        message = f"{problem.prompt}\n{self.instruction}" if self.instruction else problem.prompt
        asked = replace(problem, messages=({"role": "user", "content": message},))
        return build_prompt(asked, NATIVE, self.tokenizer, self.chat_template)

    def rewards(self, problems: Sequence, responses: Sequence[str]) -> list[float]:
        answers = [final_answer(r) for r in responses]
        verdicts = grade_answers(answers, [p.answer for p in problems], workers=self.workers, timeout=self.timeout)
        undecided = ungraded_warning([reason for _, reason in verdicts], self.timeout)
        if undecided:
            self.log(undecided)
        return [1.0 if ok else 0.0 for ok, _ in verdicts]

    def reward(self, problem, response: str) -> float:
        return self.rewards([problem], [response])[0]

    def group(self, problem) -> str:
        return self.name
