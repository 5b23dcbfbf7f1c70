"""Pieces every command shares: the config-groups paragraph of the ``--help`` texts, quiet
library logging for the commands that load a model, and the stop signals and progress line of the
commands that run until stopped (sweep, lab, eval, grade).

Commands import from here, never from ``cli/main.py`` (which imports the commands), so the
command modules and the entry point do not import each other.
"""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from typing import Callable, Iterator, NoReturn

from ..conf import config_groups, primary_defaults


def quiet_transformers() -> None:
    """transformers' own progress bars and warnings off; called in the bodies of the commands that
    load a model, so that ``--help`` never imports transformers (and torch). The hub's download bars
    stay on: a model's first download is minutes of work that must show it is alive."""
    try:
        from huggingface_hub.utils import enable_progress_bars
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # which turns the hub's off too
        enable_progress_bars()
        hf_logging.set_verbosity_error()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def groups_help(config_name: str) -> str:
    """The config groups of a primary config and their options, for --help texts."""
    used = primary_defaults(config_name)
    lines = [f"  [bold]{g}[/bold]: {', '.join(opts)} (default {used[g]})" for g, opts in config_groups().items() if g in used]
    return "\n\n".join(lines)


@contextmanager
def stop_signals() -> Iterator[list[int]]:
    """SIGINT (Ctrl-C) and SIGTERM set to stop the command alike while in the block: the first one
    raises KeyboardInterrupt, a repeat is only recorded (``timeout`` and ``scancel`` signal the
    process and then its group: interrupting the stop would leave its work behind). Yields the
    signals received, in order; the previous handlers are restored either way.

    Both are set here, as the training run's are: a SIGINT that the process inherited ignored (a job
    started in the background of a script, or from a test worker) still stops it."""
    stopped_by: list[int] = []

    def _stop(signum, _frame):
        stopped_by.append(signum)
        if len(stopped_by) == 1:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopped_by
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def exit_stopped(err, stopped_by: list[int], detail: str = "") -> NoReturn:
    """End a command that ``stop_signals`` stopped: one line on ``err`` naming the signal (and
    ``detail``: what was kept, where), exit status 128 + its number."""
    sig = stopped_by[0] if stopped_by else signal.SIGINT
    line = f"stopped by {signal.Signals(sig).name}" + (f": {detail}" if detail else "")
    err.print(line, markup=False, highlight=False, soft_wrap=True)  # one line: its command copies whole
    raise SystemExit(128 + int(sig))


@contextmanager
def live_line(console, *, every_s: float = 60.0) -> Iterator[Callable[[str], None]]:
    """Where a long command's progress line goes (a sweep's or a lab's job counts and steps): rewritten
    in place on a terminal; into a log (no terminal) printed when its counts (the part before ``;``)
    change, else at most every ``every_s`` seconds, so a log shows a sign of life without a line a step."""
    if console.is_terminal:
        with console.status("submitting...", spinner="dots") as status:
            yield lambda line: status.update(line)
        return
    last = {"counts": None, "at": 0.0}

    def show(line: str) -> None:
        counts, now = line.split(";")[0], time.monotonic()
        if counts != last["counts"] or now - last["at"] >= every_s:
            last.update(counts=counts, at=now)
            console.print(line, markup=False, soft_wrap=True)

    yield show
