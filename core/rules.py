"""What one config value may be: ``Rule`` and its shorthands (``POS_INT``, ``number(0, 1)``, ...).

A rule is a type and a range, with the words that say them (``Rule.allowed``) for one-line errors.
The run schema (``core/schema/``) declares each key with its rule; ``core/validation.py`` checks a
composed config against them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import folder_problem


@dataclass(frozen=True)
class Rule:
    """What one config value may be. ``kind``: int, float, bool, choice, str, path, int_list,
    float_list, str_list, mapping, or owned (a value its component reads and checks itself:
    ``owner`` names where, e.g. a task's parameters or a reward function list).

    ``low``/``high`` bound numbers (``open_low``/``open_high`` exclude the bound); ``choices`` are
    the values of a choice; ``length`` fixes the length of a list; ``nullable`` also allows null.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple = ()
    nullable: bool = False
    length: int | None = None
    owner: str = ""

    def allowed(self) -> str:
        """What is allowed, in words (the end of the error line)."""
        if self.kind == "owned":
            text = f"what {self.owner} accepts"
        elif self.kind == "threads":
            text = "a positive integer (torch threads), or 0 / auto for the CPUs left to the run"
        elif self.kind == "str_list":
            text = "a list of non-empty strings"
        elif self.kind == "mapping":
            text = "a mapping of keys to values"
        elif self.kind == "choice":
            text = "one of " + ", ".join(_show(c) for c in self.choices)
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "str":
            text = "a non-empty string"
        elif self.kind == "path":
            text = "a folder path that can be created (not a file, not under a file, writable)"
        else:
            noun = {
                "int": "an integer",
                "float": "a number",
                "int_list": "a list of integers",
                "float_list": "a list of numbers",
            }[self.kind]
            if self.length is not None:
                noun = f"a list of {self.length} {'integers' if self.kind == 'int_list' else 'numbers'}"
            if self.kind == "int" and self.low == 1 and self.high is None:
                noun = "a positive integer"
            elif self.kind == "int" and self.low == 0 and self.high is None:
                noun = "an integer >= 0"
            else:
                bounds = []
                if self.low is not None:
                    bounds.append(f"{'>' if self.open_low else '>='} {_show(self.low)}")
                if self.high is not None:
                    bounds.append(f"{'<' if self.open_high else '<='} {_show(self.high)}")
                if self.low is not None and self.high is not None:
                    lo, hi = ("(" if self.open_low else "["), (")" if self.open_high else "]")
                    bounds = [f"in {lo}{_show(self.low)}, {_show(self.high)}{hi}"]
                if bounds:
                    listed = self.kind.endswith("_list")
                    noun += (" (each " if listed else " ") + " and ".join(bounds) + (")" if listed else "")
            text = noun
        return text + (", or null" if self.nullable else "")

    def ok(self, value: Any) -> bool:
        if self.kind == "owned":
            return True  # its component checks it (``owner``)
        if self.kind == "threads":
            return value in (0, "auto") and not isinstance(value, bool) or self._number_ok(value, integer=True) and value >= 1
        if value is None:
            return self.nullable
        if self.kind == "str_list":
            return isinstance(value, (list, tuple)) and all(isinstance(v, str) and v.strip() for v in value)
        if self.kind == "mapping":
            return isinstance(value, dict)
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "choice":
            return any(value == c and type(value) is type(c) for c in self.choices)
        if self.kind == "str":
            return isinstance(value, str) and value.strip() != ""
        if self.kind == "path":
            return isinstance(value, (str, Path)) and str(value).strip() != "" and folder_problem(value) is None
        if self.kind in ("int_list", "float_list"):
            items = list(value) if isinstance(value, (list, tuple)) else []
            if self.length is not None and len(items) != self.length:
                return False
            return bool(items) and all(self._number_ok(v, integer=self.kind == "int_list") for v in items)
        return self._number_ok(value, integer=self.kind == "int")

    def _number_ok(self, value: Any, *, integer: bool) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if integer and not (isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
            return False
        if self.high is not None and (value > self.high or (self.open_high and value == self.high)):
            return False
        return True


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_show(x) for x in v) + "]"
    return str(v)


# -- rule shorthands ---------------------------------------------------------------------------
def integer(low: int | None = None, high: int | None = None, nullable: bool = False) -> Rule:
    return Rule("int", low=low, high=high, nullable=nullable)


def number(
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    open_high: bool = False,
    nullable: bool = False,
) -> Rule:
    return Rule("float", low=low, high=high, open_low=open_low, open_high=open_high, nullable=nullable)


def choice(*choices: Any, nullable: bool = False) -> Rule:
    return Rule("choice", choices=tuple(choices), nullable=nullable)


POS_INT = integer(1)
NONNEG_INT = integer(0)
POS = number(0, open_low=True)
NONNEG = number(0)
PROB = number(0, 1)  # a probability / fraction in [0, 1]
OPEN_PROB = number(0, 1, open_low=True)  # (0, 1]: top-p, fractions that must select something
BOOL = Rule("bool")
STR = Rule("str")
OPT_STR = Rule("str", nullable=True)
STR_LIST = Rule("str_list")
MAPPING = Rule("mapping")
FOLDER = Rule("path")
THREADS = Rule("threads")  # 0 / auto: the CPUs left to the run (core/resources.py); N >= 1: N threads


def owned(owner: str) -> Rule:
    """A value (or, as a ``prefix.*`` key, a whole section) read and checked by ``owner``."""
    return Rule("owned", owner=owner)
