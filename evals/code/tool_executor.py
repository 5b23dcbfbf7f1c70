"""The code interpreter a policy calls during a multi-turn rollout (``tools=code_interpreter``): each
call's code runs in the code sandbox (``sandbox.run_script``), isolated like a graded program.

Stateless per call (as SandboxFusion): every call is a fresh process with nothing from earlier
calls. The code runs as a notebook cell: when its last statement is an expression, that value's
``repr`` is printed (so ``12*34`` answers ``408``). A call that raises prints its traceback (only
the code's own frames) and counts as an error; a call past a limit (wall clock, CPU, memory,
output) is killed and counts as an error, its output saying which limit. Many calls run at once
from a ``SandboxPool``.

The policy's code only ever reaches the sandbox as a string literal inside a fixed wrapper: it is
parsed and executed inside the sandboxed process, never in this one.
"""

from __future__ import annotations

from ...core.errors import UserError
from ...rollout.multi_turn import ToolResult
from ...rollout.tool_formats import build_tool_format
from .sandbox import SandboxLimits, SandboxPool

__all__ = ["SandboxToolExecutor", "wrap_cell", "build_tool_executor", "check_tools"]

# Runs inside the sandbox. The flag ``_entropyrl_script_failed_`` is read back by the sandbox's
# script test (``sandbox.SCRIPT_TEST``).
_CELL = """
_entropyrl_script_failed_ = 1
def _entropyrl_cell(src, show_last):
    import ast, linecache, sys, traceback
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except Exception:
        pass
    linecache.cache["<code>"] = (len(src), None, src.splitlines(True), "<code>")
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
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
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<code>"]
        lines = (["Traceback (most recent call last):\\n"] + traceback.format_list(frames)) if frames else []
        print("".join(lines + traceback.format_exception_only(type(exc), exc)), end="")
        return 1
    return 0
_entropyrl_script_failed_ = _entropyrl_cell(__SRC__, __SHOW__)
"""

LIMIT_NOTES = {
    "timeout": "TimeoutError: the code ran past the time limit ({wall:g} s) and was stopped",
    "memory": "MemoryError: the code went past the memory limit ({memory} MB)",
    "output_limit": "the code printed more than the output limit; it was stopped",
    "killed": "the code's process was killed",
    "error": "the code's process ended before it finished",
    "sandbox_error": "the code interpreter failed to run this call",
}


def wrap_cell(code: str, show_last: bool = True) -> str:
    """The program the sandbox runs for one call's ``code``: the code as a string literal in a fixed
    wrapper that runs it as a notebook cell (see the module docstring)."""
    return _CELL.replace("__SHOW__", repr(bool(show_last))).replace("__SRC__", repr(code))


class SandboxToolExecutor:
    """``executor(codes) -> [ToolResult]``: each code run in the sandbox, ``workers`` at a time."""

    def __init__(self, limits: SandboxLimits, workers: int | None = None, show_last: bool = True, output_chars: int = 4096):
        self.limits, self.show_last, self.output_chars = limits, show_last, int(output_chars)
        self.pool = SandboxPool(workers, limits)

    def __call__(self, codes: list[str]) -> list[ToolResult]:
        if not codes:
            return []
        # keep enough of the output for the caller's middle cut to have a head and a tail
        results = self.pool.scripts([wrap_cell(c, self.show_last) for c in codes], tail_chars=self.output_chars)
        out = []
        for r in results:
            text = r.stdout_tail
            if r.reason in ("pass", "fail"):
                out.append(
                    ToolResult(text, error=r.reason != "pass", reason="ok" if r.reason == "pass" else "raised", seconds=r.seconds)
                )
                continue
            note = LIMIT_NOTES.get(r.reason, "the code interpreter failed").format(
                wall=self.limits.wall_seconds, memory=self.limits.memory_mb
            )
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
    limits, workers = _limits(tools_cfg)
    return SandboxToolExecutor(
        limits,
        workers,
        show_last=bool(tools_cfg.get("show_last_expression", True)),
        output_chars=max(4 * int(tools_cfg.get("max_output_chars", 1024)), 2000),
    )


def _limits(tools_cfg) -> tuple[SandboxLimits, int | None]:
    ex = dict(tools_cfg.get("executor") or {})
    workers = int(ex.pop("workers", 0) or 0) or None
    try:
        return SandboxLimits.from_cfg(ex), workers
    except UserError as err:
        raise UserError(f"tools.executor: {err}") from None


def check_tools(tools_cfg) -> None:
    """Refuse a bad ``tools`` section with one line (before a model loads): the format's name and
    tags, the session mode, the executor's limits. Nothing is checked when tools are off."""
    if tools_cfg is None or not bool(tools_cfg.get("enabled", False)):
        return
    build_tool_format(tools_cfg)
    if str(tools_cfg.get("session", "stateless")) != "stateless":
        raise UserError(f"tools.session={tools_cfg.get('session')} is not available; use tools.session=stateless")
    _limits(tools_cfg)
