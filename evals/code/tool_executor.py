"""The code interpreter a policy calls during a multi-turn rollout (``tools=code_interpreter``): each
call's code runs in the code sandbox (``sandbox.run_script``), isolated like a graded program.

Every call is a fresh sandboxed process. ``tools.executor.launch`` says how it starts:
``zygote`` (the default; ``evals/code/zygote.py``): a fork of a warm interpreter already inside
the sandbox, one per worker, so a call pays no interpreter start-up or launcher; ``fresh``: a new
sandboxed interpreter per call (``sandbox.run_script``). Both give a call the same limits,
namespaces and nothing of another call. ``tools.session`` says what it starts from:

- ``stateless`` (as SandboxFusion): nothing from earlier calls;
- ``trajectory``: the variables of the same response's earlier calls, as in a notebook kernel,
  by replay: the process first re-executes the response's earlier successful calls (their
  ``histories``, given by the caller) in one namespace with their output discarded, then runs the
  new call there. No process outlives its call, so a trajectory session adds no way out of the
  sandbox and nothing to clean up; the price is that the replayed calls run again (their time
  counts against the new call's limits) and anything they drew at random or read from the clock
  may come out different. A replay that now raises or passes a limit makes the new call an error
  whose output says so; the rollout goes on.

The code runs as a notebook cell: when its last statement is an expression, that value's
``repr`` is printed (so ``12*34`` answers ``408``). A call that raises prints its traceback (only
the code's own frames) and counts as an error; a call past a limit (wall clock, CPU, memory,
output) is killed and counts as an error, its output saying which limit. Many calls run at once
from a ``SandboxPool``.

The policy's code only ever reaches the sandbox as a string literal inside a fixed wrapper: it is
parsed and executed inside the sandboxed process, never in this one.
"""

from __future__ import annotations

import re
from typing import Sequence

from ...core.errors import UserError
from ...rollout.multi_turn import SESSIONS, ToolResult, check_tool_turn
from ...rollout.settings import ToolSettings
from ...rollout.tool_formats import build_tool_format
from .sandbox import SandboxLimits, SandboxPool
from .zygote import ZygotePool

__all__ = ["SandboxToolExecutor", "wrap_cell", "build_tool_executor", "check_tools", "LAUNCHES"]

LAUNCHES = ("zygote", "fresh")  # how a call's process starts (tools.executor.launch)

# Runs inside the sandbox. The flag ``_entropyrl_script_failed_`` is read back by the sandbox's
# script test (``sandbox.SCRIPT_TEST``). ``_CELL_DEFS``: the wrapper's functions alone; the zygote
# holds them compiled (``cell_prelude``) and its child calls ``_entropyrl_cell`` with the call's
# code as data, so neither the wrapper nor a literal of the code is compiled per call.
_CELL_DEFS = """
_entropyrl_script_failed_ = 1
def _entropyrl_replay(sources, scope):
    # Earlier calls of this trajectory, run again in ``scope`` with their output discarded (at the
    # file-descriptor level too, so a child process or os.write prints nothing either). Returns
    # None, or the failure to report: (which call, what happened).
    import os, sys
    class _Sink:
        def write(self, text):
            return len(text)
        def flush(self):
            pass
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = []
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            saved.append((fd, os.dup(fd)))
            os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass
    real = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = _Sink()
    failed = None
    try:
        for k, src in enumerate(sources):
            try:
                exec(compile(src, "<call %d>" % (k + 1), "exec"), scope)
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    failed = (k + 1, "SystemExit: %s" % (exc.code,))
                    break
            except BaseException as exc:
                failed = (k + 1, "".join(__import__("traceback").format_exception_only(type(exc), exc)).strip())
                break
    finally:
        sys.stdout, sys.stderr = real
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
    return failed
def _entropyrl_cell(src, show_last, replay):
    # Memory held back for reporting: released before a traceback is formatted, so code that
    # filled the address space still gets its MemoryError printed.
    reserve = bytearray(1 << 18)
    import ast, linecache, sys, traceback
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except Exception:
        pass
    linecache.cache["<code>"] = (len(src), None, src.splitlines(True), "<code>")
    for k, old in enumerate(replay):
        name = "<call %d>" % (k + 1)
        linecache.cache[name] = (len(old), None, old.splitlines(True), name)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    if replay:
        failed = _entropyrl_replay(replay, scope)
        if failed is not None:
            print("__REPLAY_NOTE__ %d of this response (to restore its variables) failed: %s" % failed)
            return 1
    try:
        tree = ast.parse(src, "<code>", "exec")
        last = None
        if show_last and tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<code>", "exec"), scope)
        if last is not None:
            value = eval(compile(last, "<code>", "eval"), scope)
            if value is not None:
                print(repr(value))
    except SystemExit as exc:
        if exc.code not in (None, 0):
            print(f"SystemExit: {exc.code}")
            return 1
    except BaseException as exc:
        reserve = None
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<code>" or f.filename.startswith("<call ")]
        lines = (["Traceback (most recent call last):\\n"] + traceback.format_list(frames)) if frames else []
        print("".join(lines + traceback.format_exception_only(type(exc), exc)), end="")
        return 1
    return 0
"""
_CELL = _CELL_DEFS + "_entropyrl_script_failed_ = _entropyrl_cell(__SRC__, __SHOW__, __REPLAY__)\n"

_SLOT = re.compile(r"__(SHOW|REPLAY_NOTE|REPLAY|SRC)__")
# How the output of a call whose replay failed begins (the call itself was not run).
REPLAY_NOTE = "error: this call was not run: replaying call"

LIMIT_NOTES = {
    "timeout": "TimeoutError: the code ran past the time limit ({wall:g} s) and was stopped",
    "memory": "MemoryError: the code went past the memory limit ({memory} MB)",
    "output_limit": "the code printed more than the output limit; it was stopped",
    "killed": "the code's process was killed",
    "error": "the code's process ended before it finished",
    "sandbox_error": "the code interpreter failed to run this call",
}


def wrap_cell(code: str, show_last: bool = True, replay: Sequence[str] = ()) -> str:
    """The program the sandbox runs for one call's ``code``: the code (and ``replay``, the earlier
    calls of its trajectory to run first, silently) as string literals in a fixed wrapper that runs
    it as a notebook cell (see the module docstring)."""
    values = {
        "SHOW": repr(bool(show_last)),
        "REPLAY": repr([str(c) for c in replay]),
        "REPLAY_NOTE": REPLAY_NOTE,
        "SRC": repr(code),
    }
    return _SLOT.sub(lambda m: values[m.group(1)], _CELL)  # one pass: no slot is looked for inside a value


def cell_prelude() -> str:
    """The wrapper's functions (``_entropyrl_cell(src, show_last, replay)`` returns the failed
    flag), trusted text the zygote compiles once; a call then reaches it only as data."""
    return _CELL_DEFS.replace("__REPLAY_NOTE__", REPLAY_NOTE)


class SandboxToolExecutor:
    """``executor(codes, histories=None) -> [ToolResult]``: each code run in the sandbox, ``workers``
    at a time. ``histories`` (a trajectory session): for each code, the earlier successful calls of
    its response, replayed first in the same process (see the module docstring); None: stateless.
    ``launch``: ``zygote`` (a fork of a warm sandboxed interpreter) or ``fresh`` (a new one per call)."""

    def __init__(self, limits: SandboxLimits, workers: int | None = None, show_last: bool = True, launch: str = "zygote"):
        if launch not in LAUNCHES:
            raise UserError(f"unknown tools.executor.launch={launch}; valid: {', '.join(LAUNCHES)}")
        self.limits, self.show_last, self.launch = limits, show_last, launch
        self.pool = ZygotePool(workers, limits, prelude=cell_prelude()) if launch == "zygote" else SandboxPool(workers, limits)

    def close(self) -> None:
        """End the warm zygotes now (they also end with this object or the interpreter)."""
        if isinstance(self.pool, ZygotePool):
            self.pool.close()

    def __call__(self, codes: list[str], histories: Sequence[Sequence[str]] | None = None) -> list[ToolResult]:
        if not codes:
            return []
        replays = [()] * len(codes) if histories is None else [tuple(h) for h in histories]
        if len(replays) != len(codes):
            raise ValueError(f"{len(codes)} calls but {len(replays)} histories")
        # the whole output read (at most max_output_bytes and the read past it): the caller's middle
        # cut keeps its real head and tail and counts exactly what it drops
        tail = self.limits.max_output_bytes + (1 << 16)
        if isinstance(self.pool, ZygotePool):
            results = self.pool.cells([(str(c), bool(self.show_last), [str(x) for x in h]) for c, h in zip(codes, replays)], tail)
        else:
            results = self.pool.scripts([wrap_cell(c, self.show_last, h) for c, h in zip(codes, replays)], tail_chars=tail)
        out = []
        for r, replay in zip(results, replays):
            text = r.stdout_tail
            if r.reason in ("pass", "fail"):
                reason = "ok" if r.reason == "pass" else "replay" if text.startswith(REPLAY_NOTE) else "raised"
                out.append(ToolResult(text, error=r.reason != "pass", reason=reason, seconds=r.seconds))
                continue
            note = LIMIT_NOTES.get(r.reason, "the code interpreter failed").format(
                wall=self.limits.wall_seconds, memory=self.limits.memory_mb
            )
            if r.reason in ("error", "killed", "sandbox_error") and r.detail:
                note += f" ({r.detail})"
            if replay:  # the limits are the process's: the replay of the earlier calls counted too
                note += f" (the limit covers the replay of this response's {len(replay)} earlier call(s))"
            out.append(
                ToolResult(
                    (text + ("\n" if text and not text.endswith("\n") else "") + note),
                    error=True,
                    reason=r.reason,
                    seconds=r.seconds,
                )
            )
        return out


def build_tool_executor(tools_cfg) -> SandboxToolExecutor:
    """The executor of ``tools.executor`` (sandbox limits; ``workers`` 0 = the CPUs of this process)."""
    limits, workers, launch = _limits(tools_cfg)
    return SandboxToolExecutor(limits, workers, show_last=ToolSettings.from_config(tools_cfg).show_last_expression, launch=launch)


def _limits(tools_cfg) -> tuple[SandboxLimits, int | None, str]:
    ex = dict(tools_cfg.get("executor") or {})
    workers = int(ex.pop("workers", 0) or 0) or None
    launch = str(ex.pop("launch", None) or "zygote")
    if launch not in LAUNCHES:
        raise UserError(f"unknown tools.executor.launch={launch}; valid: {', '.join(LAUNCHES)}")
    try:
        return SandboxLimits.from_cfg(ex), workers, launch
    except UserError as err:
        raise UserError(f"tools.executor: {err}") from None


def check_tools(tools_cfg) -> None:
    """Refuse a bad ``tools`` section with one line (before a model loads): the format's name and
    tags, the session mode, the tool turn's mode, the executor's limits. Nothing is checked when tools are off."""
    settings = ToolSettings.from_config(tools_cfg)
    if not settings.enabled:
        return
    build_tool_format(tools_cfg)
    session = str(settings.session)
    if session not in SESSIONS:
        raise UserError(f"unknown tools.session={session}; valid: {', '.join(SESSIONS)}")
    check_tool_turn(tools_cfg)
    _limits(tools_cfg)
