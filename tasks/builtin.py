"""Built-in, procedurally generated verifiable tasks for the embedded tiny model.

Families, chosen so that entropy matters:
- ``add``: ``"17+25="`` -> ``"42"``. Exactly one correct answer.
- ``multiple``: ``"M7:"`` -> any multiple of 7 in [d, 99]. Many correct answers, so a policy can keep
  several of them alive (high entropy, diverse) or collapse onto one (the GRPO failure mode).
- ``countdown3`` / ``countdown4``: ``"3:7:12M16:"`` -> ``"12+7=19:19-3=16"``: reach the target with
  three / four numbers in a chain of + and - steps (``countdown.py``). 15-35 token responses,
  several solution paths, two difficulty tiers: the lab's task (``data=countdown``).
- ``tool_add``: ``"4821+9377="`` -> ``"14198"`` with operands of several digits, beyond what the
  embedded model can add in its head, but one code-interpreter call away: the response
  ``"M=4821+9377=M:14198:14198"`` calls the tool (tags ``data.tool_tags``), reads its output and
  copies it (``data=tool_arith tools=code_interpreter``). The verdict is on the final answer, the
  integer the response ends with; nothing is executed by the verifier.
- ``tool_countdown``: ``"482:937:120M1299:"`` -> ``"482+937-120"``: put a + or - between three
  numbers of several digits, in the order given, to make the target. The tool checks a candidate but
  does not find the answer: the response ``"M=482-937+120=M:-335:482+937-120"`` checks one of the
  four sign patterns, reads its value and then answers (the checked pattern when it hit, another one
  otherwise). A search the policy has to make, with one call to narrow it
  (``data=tool_countdown tools=code_interpreter``); graded by parsing the answer, never executing it.

A prompt stream is a pure function of (config, seed): same seed, same prompts.
"""

from __future__ import annotations

import random
import re
from typing import Callable

from ..core.errors import UserError
from . import countdown
from .problem import Problem

# The character set of the embedded tokenizer must cover every prompt and answer.
ALPHABET = "0123456789+-=:M "


def _parse_int(text: str) -> int | None:
    text = text.strip()
    if not text or len(text) > 6 or not text.isdigit():
        return None
    return int(text)


def _make_add(rng: random.Random, cfg) -> Problem:
    a, b = rng.randint(0, cfg.max_operand), rng.randint(0, cfg.max_operand)
    return Problem("add", f"{a}+{b}=", str(a + b), (a, b))


def _verify_add(problem: Problem, response: str) -> float:
    value = _parse_int(response)
    return float(value is not None and value == sum(problem.params))


def _make_tool_add(rng: random.Random, cfg) -> Problem:
    low, high = int(cfg.get("min_operand", 1000)), int(cfg.max_operand)
    a, b = rng.randint(low, high), rng.randint(low, high)
    return Problem("tool_add", f"{a}+{b}=", str(a + b), (a, b))


_FINAL_INT = re.compile(r"(\d{1,12})\s*$")


def _verify_tool_add(problem: Problem, response: str) -> float:
    """The final answer is the integer the response ends with (after any tool call and output)."""
    m = _FINAL_INT.search(response)
    return float(m is not None and str(int(m.group(1))) == m.group(1) and int(m.group(1)) == sum(problem.params))


SIGN_PATTERNS = ("++", "+-", "-+", "--")


def _signed(a: int, b: int, c: int, signs: str) -> tuple[str, int]:
    """``a s1 b s2 c`` as text and its value, for ``signs`` one of ``SIGN_PATTERNS``."""
    value = a + (b if signs[0] == "+" else -b) + (c if signs[1] == "+" else -c)
    return f"{a}{signs[0]}{b}{signs[1]}{c}", value


def _make_tool_countdown(rng: random.Random, cfg) -> Problem:
    low, high = int(cfg.get("min_operand", 100)), int(cfg.max_operand)
    while True:
        a, b, c = (rng.randint(low, high) for _ in range(3))
        # b == c would make "+-" and "-+" the same value: two right answers where the task has one
        answer, target = _signed(a, b, c, rng.choice(SIGN_PATTERNS))
        if b != c and target > 0:
            return Problem("tool_countdown", countdown.prompt((a, b, c), target), answer, (a, b, c, target))


_FINAL_SIGNED = re.compile(r"(\d{1,12})([+-])(\d{1,12})([+-])(\d{1,12})\s*$")


def _verify_tool_countdown(problem: Problem, response: str) -> float:
    """The response ends with ``a s1 b s2 c``: the prompt's numbers in its order (canonical digits),
    each sign + or -, whose value is the target. Parsed, never executed."""
    a, b, c, target = problem.params
    m = _FINAL_SIGNED.search(response)
    if m is None or (m.group(1), m.group(3), m.group(5)) != (str(a), str(b), str(c)):
        return 0.0
    # the answer must stand alone, not be the tail of a longer number or expression
    if m.start() > 0 and response[m.start() - 1] not in ": ":
        return 0.0
    return float(_signed(a, b, c, m.group(2) + m.group(4))[1] == target)


def _call_text(code: str, value: int, tags) -> str:
    return f"{tags['call_open']}{code}{tags['call_close']}{tags['output_open']}{value}{tags['output_close']}"


def countdown_traces(problem: Problem, tags, *, right: bool) -> list[str]:
    """Responses to a ``tool_countdown`` problem that check one sign pattern with the tool and then
    answer: with ``right``, the right pattern after each of the four checks; otherwise every wrong
    answer after every check (the warm start's label noise)."""
    a, b, c, target = problem.params
    checks = [_signed(a, b, c, s) for s in SIGN_PATTERNS]
    answers = [code for code, value in checks if (value == target) == right]
    return [_call_text(code, value, tags) + answer for code, value in checks for answer in answers]


def tool_trace(problem: Problem, tags) -> str:
    """A response that uses the tool once: the call, the output the tool gives back, the answer
    (the warm start's target for ``tool_add``; ``tags``: ``data.tool_tags``)."""
    a, b = problem.params
    return f"{tags['call_open']}{a}+{b}{tags['call_close']}{tags['output_open']}{a + b}{tags['output_close']}{a + b}"


def _make_multiple(rng: random.Random, cfg) -> Problem:
    d = rng.choice(list(cfg.divisors))
    return Problem("multiple", f"M{d}:", str(d * rng.randint(1, 99 // d)), (d,))


def _verify_multiple(problem: Problem, response: str) -> float:
    value = _parse_int(response)
    (d,) = problem.params
    # Leading zeros would make "07" and "7" two spellings of one answer; only canonical form counts.
    return float(value is not None and str(value) == response.strip() and 0 < value < 100 and value % d == 0)


def _answers_multiple(problem: Problem) -> list[str]:
    (d,) = problem.params
    return [str(d * k) for k in range(1, 99 // d + 1)]


def _countdown_maker(k: int) -> Callable:
    def make(rng: random.Random, cfg) -> Problem:
        bounds = cfg.get("max_number"), cfg.get("max_target")
        if None in bounds:  # declared in conf/data/countdown.yaml, never guessed here
            raise UserError(
                f"data.tasks lists countdown{k}: it needs data.max_number and data.max_target "
                "(conf/data/countdown.yaml sets 9 and 40)"
            )
        numbers, target = countdown.make_countdown(rng, k, int(bounds[0]), int(bounds[1]))
        prompt = countdown.prompt(numbers, target)
        # the reference answer: one solution path, drawn from all of them
        return Problem(f"countdown{k}", prompt, rng.choice(countdown.solutions(numbers, target)), (*numbers, target))

    return make


def _verify_countdown(problem: Problem, response: str) -> float:
    *numbers, target = problem.params
    return countdown.verify_countdown(tuple(numbers), target, response)


TASKS: dict[str, tuple[Callable, Callable]] = {
    "add": (_make_add, _verify_add),
    "multiple": (_make_multiple, _verify_multiple),
    "countdown3": (_countdown_maker(3), _verify_countdown),
    "countdown4": (_countdown_maker(4), _verify_countdown),
    "tool_add": (_make_tool_add, _verify_tool_add),
    "tool_countdown": (_make_tool_countdown, _verify_tool_countdown),
}
# Task settings that shape the warm-started model (tiny.py's cache key), beyond the toy task's.
EXTRA_TASK_KEYS = ("max_number", "max_target", "min_operand", "tool_tags")


def check_task_names(names) -> None:
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise UserError(f"unknown built-in task '{unknown[0]}'; valid: {', '.join(TASKS)} (data.tasks=[...])")


class _Fields(dict):
    """The data section as a plain dict read by attribute (``cfg.max_operand``, ``cfg.get(...)``):
    the task makers read it once per problem, and a ``DictConfig`` lookup costs far more."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _fields(data_cfg):
    from omegaconf import DictConfig, OmegaConf

    return _Fields(OmegaConf.to_container(data_cfg, resolve=True)) if isinstance(data_cfg, DictConfig) else data_cfg


def sample_problems(data_cfg, n: int, rng: random.Random) -> list[Problem]:
    """``n`` problems drawn from the configured task mix with ``rng``."""
    names = list(data_cfg.tasks)
    check_task_names(names)
    fields = _fields(data_cfg)
    return [TASKS[rng.choice(names)][0](rng, fields) for _ in range(n)]


def reward(problem: Problem, response: str) -> float:
    """1.0 if ``response`` is a correct answer to ``problem`` else 0.0. Never executes the text."""
    return TASKS[problem.task][1](problem, response)


def correct_answers(problem: Problem, data_cfg=None) -> list[str]:
    """Every correct answer (used to build the warm-start distribution). ``tool_add``: the trace
    that calls the tool (with ``data.tool_tags``), beside the bare answer when no tags are set."""
    if problem.task == "tool_add":
        tags = data_cfg.get("tool_tags") if data_cfg is not None else None
        return [tool_trace(problem, tags)] if tags else [problem.answer]
    if problem.task == "tool_countdown":
        tags = data_cfg.get("tool_tags") if data_cfg is not None else None
        return countdown_traces(problem, tags, right=True) if tags else [problem.answer]
    if problem.task == "multiple":
        return _answers_multiple(problem)
    if problem.task.startswith("countdown"):
        *numbers, target = problem.params
        return list(countdown.solutions(tuple(numbers), target))
    return [problem.answer]


def wrong_answer(problem: Problem, rng: random.Random, data_cfg=None) -> str | None:
    """A plausible wrong answer for the warm start's label noise; None: the caller's default."""
    if problem.task == "tool_countdown":
        tags = data_cfg.get("tool_tags") if data_cfg is not None else None
        if tags:
            return rng.choice(countdown_traces(problem, tags, right=False))
        a, b, c, target = problem.params
        return rng.choice([code for code, value in (_signed(a, b, c, s) for s in SIGN_PATTERNS) if value != target])
    if problem.task.startswith("countdown"):
        *numbers, target = problem.params
        return countdown.wrong_chain(tuple(numbers), target, rng)
    return None


class BuiltinTaskSource:
    """Training and validation prompts from the built-in tasks (``data.kind: builtin``).

    Training prompts for step ``s`` are a pure function of ``(seed, s)``, so a resumed run sees the
    same prompts it would have seen without the interruption. Validation prompts come from a
    separate stream (``data.val_seed``) and never change.
    """

    def __init__(self, data_cfg, seed: int, tokenizer=None):
        check_task_names(list(data_cfg.tasks))
        self.cfg = data_cfg
        self.seed = seed

    def sample(self, n: int, step: int, attempt: int = 0) -> list[Problem]:
        rng = random.Random(f"{self.seed}/{step}/{attempt}")
        return sample_problems(self.cfg, n, rng)

    def validation(self, n: int) -> list[Problem]:
        return sample_problems(self.cfg, n, random.Random(int(self.cfg.val_seed)))

    @staticmethod
    def prompt(problem: Problem) -> str:
        return problem.prompt

    @staticmethod
    def reward(problem: Problem, response: str) -> float:
        return reward(problem, response)

    @staticmethod
    def group(problem: Problem) -> str:
        return problem.task
