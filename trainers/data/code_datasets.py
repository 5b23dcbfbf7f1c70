"""Training prompts from code problems (``data.kind: code``), rewarded by running the program.

Problems: ``data.benchmark`` (a code benchmark: ``humaneval``, ``mbpp``, ``livecodebench``,
loaded as ``entropyrl eval`` does) or ``data.path`` (a jsonl/json/parquet of rows in the HumanEval,
MBPP or LiveCodeBench layout, relative to the data root or absolute). Prompts are
``evals.code_eval.code_prompt``: the bare HumanEval prompt for a model without a chat template,
an instruction in the chat template otherwise (``data.chat_template``).

Rewards (``data.reward``): ``pass_all`` = 1.0 when every test passed in the sandbox, else 0.0;
``fraction`` = the share of tests (HumanEval: the asserts of ``check``) that passed. The batch's
programs run in one ``SandboxPool`` of ``data.sandbox.workers`` processes (null: one per CPU)
under ``data.sandbox`` limits. Order, resumption and holdout work as for math data
(``datasets.MathDatasetSource``, whose sampling this reuses).
"""

from __future__ import annotations

from typing import Sequence

from ...conf import cfg_get, to_plain
from ...core.errors import UserError
from ...evals.benchmarks import load_benchmark, read_rows
from ...evals.code.code_eval import OPEN_FENCE, code_prompt, sandbox_for
from ...evals.code.code_tasks import CodeProblem, grade_code, rows_to_code_problems
from ...evals.prompts import chat_use
from ...models.tiny import check_representable, representable
from .datasets import MathDatasetSource, first_problems, resolve_data_path, split_holdout

__all__ = ["CodeTaskSource", "REWARDS"]

REWARDS = {"pass_all": "all", "fraction": "fraction"}


def load_code_problems(data_cfg) -> tuple[list[CodeProblem], str]:
    bench = cfg_get(data_cfg, "benchmark", None)
    path = resolve_data_path(data_cfg)  # an explicit data.path: that file, or an error naming it
    if path is not None:
        return rows_to_code_problems(read_rows(path), source=str(path)), str(path)
    if not bench:
        raise UserError("data.kind=code needs data.benchmark (humaneval, mbpp, livecodebench) or data.path")
    problems = load_benchmark(str(bench), data_cfg.data_root)
    if problems and not isinstance(problems[0], CodeProblem):
        raise UserError(f"data.benchmark={bench} is not a code benchmark: use humaneval, mbpp or livecodebench")
    return problems, f"benchmark:{bench}"


class CodeTaskSource(MathDatasetSource):
    """A ``PROMPT_SOURCES`` entry (``data.kind: code``); see the module docstring."""

    def __init__(self, data_cfg, seed: int, tokenizer=None):  # noqa: D107 - replaces the math loading
        self.cfg, self.seed, self.tokenizer = data_cfg, int(seed), tokenizer
        self.name = str(data_cfg.name)
        reward = str(data_cfg.reward)
        if reward not in REWARDS:
            raise UserError(f"data.reward={reward}: valid: {', '.join(REWARDS)}")
        self.mode = REWARDS[reward]
        use, has = chat_use(data_cfg.chat_template), bool(getattr(tokenizer, "chat_template", None))
        if use is True and not has and tokenizer is not None:  # asked for, never dropped in silence
            raise UserError(
                f"data.chat_template={data_cfg.chat_template} but the model's tokenizer has no chat template: "
                "set data.chat_template=auto or false (or use a chat model)"
            )
        self.chat = has if use == "auto" else bool(use)
        limits = to_plain(data_cfg.sandbox) or {}
        self.pool = sandbox_for({}, limits)
        problems, self.where = load_code_problems(data_cfg)
        problems = first_problems(problems, data_cfg.limit)
        if not problems:
            raise UserError(f"data={self.name}: no code problems in {self.where}")
        self.notes: list[str] = []
        if tokenizer is not None:  # a prompt the model cannot read: refused or counted, never rewritten
            texts = [self.prompt(p) for p in problems]
            note = check_representable(
                tokenizer,
                texts,
                [p.id or str(i) for i, p in enumerate(problems)],
                what=f"data={self.name} ({self.where})",
                option="data.unrepresentable",
                mode=str(data_cfg.unrepresentable),
            )
            if note:
                self.notes.append(f"data: warning: {note}")
                problems = [problems[i] for i in representable(tokenizer, texts)]  # nothing left: out, counted above
                if not problems:
                    raise UserError(
                        f"data={self.name}: no prompt of {self.where} keeps a character the model can represent: "
                        "use a real model (e.g. model=smollm2-135m)"
                    )
        self.train_items, self.val_items = split_holdout(problems, data_cfg)
        self._perms: dict[int, list[int]] = {}

    def prompt(self, problem: CodeProblem) -> str:
        return code_prompt(problem, self.tokenizer, self.chat)[0]

    def rewards(self, problems: Sequence[CodeProblem], responses: Sequence[str]) -> list[float]:
        texts = [(OPEN_FENCE if code_prompt(p, self.tokenizer, self.chat)[1] else "") + r for p, r in zip(problems, responses)]
        graded = grade_code(list(problems), texts, self.pool, self.mode)
        return [float(r.passed) if self.mode == "all" else r.fraction for _, r in graded]

    def reward(self, problem: CodeProblem, response: str) -> float:
        return self.rewards([problem], [response])[0]
