"""Arithmetic word problems in plain English, generated and seeded, for real language models
(``data=word_problems``): a person starts with some items and a chain of events changes how many they
have; the question asks for the final count.

    "Mia has 7 apples. She buys 5 more apples. Then she gives 3 apples to her friend. How many apples
    does Mia have now?"  ->  "9"

One knob, ``difficulty`` (1-5), sets how many events the chain has, how large the numbers are and
which events occur (``LEVELS``): one gain, then gains and losses, then groups ("3 bags with 4 apples
in each one", a multiplication inside one event). The answer is computed while the text is written, so
it is right by construction; every intermediate count stays a whole number of at least zero.
A problem is a pure function of the random generator it is given.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..core.errors import UserError
from .problem import Problem

TASK = "word_problem"


@dataclass(frozen=True)
class Level:
    """One difficulty setting: ``events`` after the start, numbers in ``[1, max_number]``, which events occur."""

    events: int
    max_number: int
    losses: bool
    groups: bool
    max_group: int = 6  # groups: how many bags (2 to this), and items per bag up to max_number // 2


LEVELS: dict[int, Level] = {
    1: Level(events=1, max_number=10, losses=False, groups=False),
    2: Level(events=1, max_number=10, losses=True, groups=False),
    3: Level(events=2, max_number=10, losses=True, groups=False),
    4: Level(events=2, max_number=20, losses=True, groups=True),
    5: Level(events=3, max_number=50, losses=True, groups=True),
}

NAMES = [
    ("Mia", "She", "her"),
    ("Liam", "He", "his"),
    ("Ava", "She", "her"),
    ("Noah", "He", "his"),
    ("Zoe", "She", "her"),
    ("Omar", "He", "his"),
    ("Lena", "She", "her"),
    ("Ravi", "He", "his"),
]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "books", "shells"]
CONTAINERS = ["bags", "boxes", "packs", "jars"]
GAINS = ["buys {b} more {item}", "finds {b} more {item}", "gets {b} more {item} from a friend"]
LOSSES = ["gives {b} {item} to a friend", "loses {b} {item}", "uses {b} {item}"]
GROUPS = ["buys {k} {container} with {m} {item} in each one"]
THEN = ["Then", "After that,", "Later,"]


def level(difficulty) -> Level:
    """The settings of ``data.difficulty``; anything else is a ``UserError`` naming the valid values."""
    try:
        key = int(difficulty)
    except (TypeError, ValueError):
        key = None
    if key not in LEVELS or str(difficulty).strip() not in (str(key), f"{key}.0"):
        raise UserError(f"data.difficulty={difficulty!r} is not a difficulty: use one of {', '.join(map(str, LEVELS))}")
    return LEVELS[key]


def make_word_problem(rng: random.Random, difficulty) -> Problem:
    """One problem at ``difficulty`` drawn with ``rng``; its ``answer`` is the final count."""
    lv = level(difficulty)
    name, pronoun, _ = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    total = rng.randint(max(2, lv.max_number // 4), lv.max_number)
    sentences = [f"{name} has {total} {item}."]
    values = [total]
    for i in range(lv.events):
        kinds = ["gain"] + (["loss"] if lv.losses and total >= 1 else []) + (["groups"] if lv.groups else [])
        kind = rng.choice(kinds)
        if kind == "gain":
            b = rng.randint(1, lv.max_number)
            event, total = rng.choice(GAINS).format(b=b, item=item), total + b
            values.append(b)
        elif kind == "loss":
            b = rng.randint(1, total)
            event, total = rng.choice(LOSSES).format(b=b, item=item), total - b
            values.append(-b)
        else:
            k = rng.randint(2, lv.max_group)
            m = rng.randint(2, max(2, lv.max_number // 2))
            event = rng.choice(GROUPS).format(k=k, m=m, container=rng.choice(CONTAINERS), item=item)
            total += k * m
            values.append(k * m)
        opener = pronoun if i == 0 else f"{rng.choice(THEN)} {pronoun.lower()}"
        sentences.append(f"{opener} {event}.")
    sentences.append(f"How many {item} does {name} have now?")
    return Problem(TASK, " ".join(sentences), str(total), tuple(values))
