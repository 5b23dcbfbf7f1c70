"""Countdown: reach a target from a few numbers with + and -, written as a chain of steps.

    prompt    "3:7:12M16:"           (numbers 3, 7, 12; make 16)
    response  "12+7=19:19-3=16"      (also "7-3=4:12+4=16", "12-3=9:9+7=16", ... several valid paths)

A step ``a+b=c`` or ``a-b=c`` takes ``a`` and ``b`` out of the pool of numbers (the prompt's numbers
plus earlier results, each usable once) and puts ``c`` back; results never go negative; the last
step's result must be the target. Responses are 15-25 characters (one token per character), the
pool leaves several solution paths per problem, and the tiers (``countdown3``: three numbers,
``countdown4``: four) differ in how far a policy must plan. The verifier parses the text with a
regular expression and integer arithmetic; it never executes anything.

Only characters of the embedded tokenizer's alphabet are used (digits, ``+-=:M``; no space: the
embedded tokenizer does not keep spaces once saved and reloaded), so the toy task's model and
tokenizer stay as they are.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache

MAX_RESPONSE_CHARS = 80  # longer text is malformed (a 4-number chain is <= 35 characters)
MAX_VALUE = 999  # numbers have at most 3 digits
_STEP = re.compile(r"(\d{1,3})([+-])(\d{1,3})=(\d{1,3})")
STEP_SEP = ":"
_CHAIN = re.compile(r"\d{1,3}[+-]\d{1,3}=\d{1,3}(?::\d{1,3}[+-]\d{1,3}=\d{1,3})*")

__all__ = ["make_countdown", "verify_countdown", "solutions", "wrong_chain", "parse_chain", "prompt"]


def parse_chain(response: str) -> list[tuple[int, str, int, int]] | None:
    """``[(a, op, b, c), ...]`` of a well-formed chain, else None (any other text is malformed)."""
    text = response.strip()
    if not text or len(text) > MAX_RESPONSE_CHARS or not _CHAIN.fullmatch(text):
        return None
    steps = []
    for part in text.split(STEP_SEP):
        m = _STEP.fullmatch(part)
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        if str(a) != m.group(1) or str(b) != m.group(3) or str(c) != m.group(4):
            return None  # leading zeros: "07" would be a second spelling of 7
        steps.append((a, op, b, c))
    return steps


def verify_countdown(numbers: tuple[int, ...], target: int, response: str) -> float:
    """1.0 when ``response`` is a valid chain from ``numbers`` ending at ``target``, else 0.0."""
    steps = parse_chain(response)
    if steps is None:
        return 0.0
    pool = Counter(numbers)
    for a, op, b, c in steps:
        pool[a] -= 1
        pool[b] -= 1
        if pool[a] < 0 or pool[b] < 0:
            return 0.0  # a number used that is not (or no longer) available
        value = a + b if op == "+" else a - b
        if value != c or value < 0:
            return 0.0  # wrong arithmetic, or a negative intermediate
        pool[c] += 1
    return float(steps[-1][3] == target)


@lru_cache(maxsize=4096)
def solutions(numbers: tuple[int, ...], target: int, limit: int = 24) -> tuple[str, ...]:
    """Every valid chain (up to ``limit``) from ``numbers`` to ``target``, in a fixed order."""
    found: list[str] = []

    def search(pool: tuple[int, ...], chain: list[str]) -> None:
        if len(found) >= limit:
            return
        for i, a in enumerate(pool):
            for j, b in enumerate(pool):
                if i == j:
                    continue
                rest = tuple(x for k, x in enumerate(pool) if k not in (i, j))
                for op, c in (("+", a + b), ("-", a - b)):
                    if c < 0 or c > MAX_VALUE:
                        continue
                    step = chain + [f"{a}{op}{b}={c}"]
                    if c == target:
                        found.append(STEP_SEP.join(step))
                    elif rest:
                        search(rest + (c,), step)

    search(tuple(numbers), [])
    return tuple(found)


def make_countdown(rng: random.Random, k: int, max_number: int, max_target: int = 99) -> tuple[tuple[int, ...], int]:
    """``(numbers, target)``: ``k`` numbers in [1, max_number] and a target in [1, max_target] reached
    by combining all of them (so a solution exists), not equal to any single number."""
    while True:
        numbers = tuple(rng.randint(1, max_number) for _ in range(k))
        order = list(numbers)
        rng.shuffle(order)
        value = order[0]
        for x in order[1:]:
            value = value + x if (rng.random() < 0.5 or value - x < 0) else value - x
        if 1 <= value <= max_target and value not in numbers:
            return numbers, value


def wrong_chain(numbers: tuple[int, ...], target: int, rng: random.Random) -> str:
    """A plausible wrong answer for the warm start's label noise: a chain that uses every number,
    like the solutions, but ends elsewhere, sometimes with an arithmetic slip in its last step."""
    for _ in range(20):
        pool = list(numbers)
        rng.shuffle(pool)
        steps, value = [], pool[0]
        for x in pool[1:]:
            op = "+" if (rng.random() < 0.5 or value - x < 0) else "-"
            nxt = value + x if op == "+" else value - x
            steps.append(f"{value}{op}{x}={nxt}")
            value = nxt
        text = STEP_SEP.join(steps)
        if rng.random() < 0.3:  # an arithmetic slip
            slip = value + rng.choice([-2, -1, 1, 2, 10])
            if slip >= 0:
                text = text.rsplit("=", 1)[0] + f"={slip}"
        if verify_countdown(numbers, target, text) == 0.0:
            return text
    return "0+0=0"


def prompt(numbers: tuple[int, ...], target: int) -> str:
    """``"3:7:12M16:"``: the numbers, then M(ake) the target."""
    return f"{STEP_SEP.join(map(str, numbers))}M{target}:"
