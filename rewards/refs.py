"""Reward functions by reference: ``pkg.module:fn``, ``path/to/rewards.py:fn`` or ``builtin:<name>``.

A user reward function is called in batches with keyword arguments only::

    fn(prompts=[...], responses=[...], group=[...], problems=[...], **fields) -> list[float]

one entry per response: ``prompts`` the text the policy saw, ``responses`` what it wrote, ``group``
the group index (responses to one prompt share it), ``problems`` the problem objects, and every
problem field as a list (``answer``, ``task``, ``id`` and each column of the data row, passed
through untouched; a row without a column gives None). It returns one float per response.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

from ..core.errors import UserError
from .builtin import BUILTIN_REWARDS

BUILTIN_PREFIX = "builtin:"


def _load_file(path: Path, ref: str):
    if not path.is_file():
        raise UserError(f"reward function {ref}: no file {path} (give path/to/rewards.py:fn)")
    name = "entropyrl_user_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file: one line naming it
        raise UserError(
            f"reward function {ref}: importing {path} failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    sys.modules[name] = module
    return module


def resolve_user(ref: str) -> Callable:
    """The callable ``ref`` names (``module:fn`` or ``file.py:fn``); ``UserError`` when it cannot be loaded."""
    where, sep, attr = str(ref).rpartition(":")
    if not sep or not where or not attr:
        raise UserError(
            f"reward function {ref!r}: write it as pkg.module:fn, path/to/rewards.py:fn or builtin:<{'|'.join(BUILTIN_REWARDS)}>"
        )
    if where.endswith(".py") or "/" in where:
        module = _load_file(Path(where).expanduser(), ref)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:  # noqa: BLE001 - not importable from the user's environment
            raise UserError(
                f"reward function {ref}: cannot import {where} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); install it or put it on "
                f"PYTHONPATH, or give a file path (path/to/rewards.py:fn)"
            ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UserError(f"reward function {ref}: {where} has no callable {attr!r}")
    return fn


def builtin_name(ref: str) -> str | None:
    """``math`` for ``builtin:math``; None for a user reference. Unknown built-ins are an error."""
    if not str(ref).startswith(BUILTIN_PREFIX):
        return None
    name = str(ref)[len(BUILTIN_PREFIX) :]
    if name not in BUILTIN_REWARDS:
        raise UserError(
            f"reward function {ref}: unknown built-in; valid: " + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_REWARDS)
        )
    return name


# A worker process resolves each reference once.
_RESOLVED: dict[str, Callable] = {}


def call_in_worker(ref: str, kwargs: dict) -> list:
    """Run in a ``reward.workers`` process: resolve ``ref`` (once) and call it."""
    if ref not in _RESOLVED:
        _RESOLVED[ref] = resolve_user(ref)
    return list(_RESOLVED[ref](**kwargs))


def warm_worker(ref: str) -> bool:
    """Resolve ``ref`` in a worker process ahead of its first batch."""
    if ref not in _RESOLVED:
        _RESOLVED[ref] = resolve_user(ref)
    return True
