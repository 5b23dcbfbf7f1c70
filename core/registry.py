"""One registry for every "name -> component" table of the package (rollout engines, objectives,
interventions, optimizers, schedules, advantage estimators, loss aggregations, statistics, launchers,
job kinds, report steps, prompt sources), so each is extended the same way and a wrong name is
refused with the same line everywhere::

    error: unknown algo.objective=ppo; valid: cispo, gmpo, gspo, ppo_clip, sapo (did you mean ppo_clip?)

A ``Registry`` is a ``dict`` (existing code reads it as one) that also knows the setting that picks
from it (``option``, for the error line), registers by decorator, and resolves entries given as a
lazy ``"module:attr"`` string on first use (an optional heavy dependency is imported only when a
run asks for it).
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, TypeVar

from .errors import UserError

__all__ = ["Registry", "unknown_choice"]

T = TypeVar("T")


def unknown_choice(option: str, name: Any, choices) -> str:
    """The one wording of a name that is not registered: the setting, the valid names, a near miss."""
    valid = sorted(str(c) for c in choices)
    near = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"unknown {option}={name}; valid: {', '.join(valid) or 'none registered'}{hint}"


class Registry(dict):
    """``name -> entry``; ``option`` is the setting that names an entry (``rollout``,
    ``algo.objective``, ``launcher``), used in the error line."""

    def __init__(self, option: str, entries: dict | None = None):
        super().__init__(entries or {})
        self.option = option

    def register(self, name: str, entry: Any = None) -> Callable[[T], T] | Any:
        """``@registry.register("name")`` on a class or function, or ``registry.register("name", entry)``
        (an entry may be a lazy ``"module:attr"`` string)."""
        if entry is not None:
            self[name] = entry
            return entry

        def deco(obj: T) -> T:
            self[name] = obj
            return obj

        return deco

    def lookup(self, name: Any, option: str | None = None) -> Any:
        """The entry registered as ``name`` (a lazy string imported now); a one-line ``UserError``
        naming the valid entries when there is none. ``option`` overrides the setting's name."""
        key = str(name)
        if key not in self:
            raise UserError(unknown_choice(option or self.option, name, self))
        entry = self[key]
        if isinstance(entry, str) and ":" in entry:
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
            self[key] = entry
        return entry
