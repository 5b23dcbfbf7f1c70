"""A helper process's stance toward its parent: the pieces a worker process picks from at its start.

A helper (a reward worker, the rollout worker, a grading worker) runs beside a parent that owns the
run. A stop signal sent to the whole process group (Ctrl-C, ``timeout``, a scheduler's SIGTERM)
reaches the helper too, but it is the parent's to handle at its step boundary: a helper that died
of it would fail the step in progress. So a helper ignores those signals
(``ignore_group_stop_signals``) and must then end some other way when the parent is gone, lest it
outlive the run. Each caller chooses the way that fits it:

- ``parent_alive_check()``: a test that a loop of the helper's own polls between waits;
- ``exit_when_parent_gone()``: a daemon thread that ends the process once the parent is gone;
- ``die_with_parent()``: the kernel kills the process when its parent exits (Linux), which also
  ends a helper stuck in C code, where no Python thread runs;
- none of them, where the helper reads a socket or pipe from the parent and ends at its EOF.

A helper that starts processes of its own it does not control (vLLM's engine process, which watches
no parent) leads its own process group (``lead_own_process_group``): whatever it starts is in that
group, so the parent ends them all with ``end_process_group(helper_pid)`` once the helper is gone,
whichever way it went (killed by the OOM killer, stopped for a stall, or closed), and the helper ends
its group itself when it finds its parent gone.

A helper that serves the parent over a socket starts through ``spawn_socket_helper``: a fresh
interpreter (``-E -s``, nothing from the caller's ``__main__``, safe to start from a threaded parent)
that imports this very package and calls its entry point with its end of a socket pair.

"Gone" is seen as re-parenting: when a process's parent exits, the kernel gives it a new parent
(init or a subreaper), so ``os.getppid()`` changes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

__all__ = [
    "die_with_parent",
    "end_process_group",
    "exit_when_parent_gone",
    "ignore_group_stop_signals",
    "lead_own_process_group",
    "leads_own_group",
    "parent_alive_check",
    "spawn_socket_helper",
]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

# the folder that holds entropyrl/ as this process imported it (not resolved: a symlinked checkout
# must give the helper this very package, not another copy found through the link target's parent)
_PACKAGE_PARENT = str(Path(os.path.abspath(__file__)).parents[2])
# no current folder on sys.path (with -E -s): the helper imports this package and what it imports only
_BOOT = (
    "import sys, importlib; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "sys.path.insert(0, sys.argv[1]); module, _, name = sys.argv[2].partition(':'); "
    "getattr(importlib.import_module(module), name)(int(sys.argv[3]))"
)


def spawn_socket_helper(entry: str, *, warnings: bool = True) -> tuple[subprocess.Popen, socket.socket]:
    """``(process, our socket)``: a new interpreter that calls ``entry`` (``"package.module:function"``)
    with the file descriptor of its end of a fresh socket pair. Its stdin and stdout are closed to it
    (stderr stays the parent's, for a crash's traceback); ``warnings=False`` silences Python's
    warnings in it. The helper ends when it returns; reading EOF on the socket is its usual way to
    see the parent go. It leads a process group of its own from its first instruction, so a stop
    signal sent to the caller's group (Ctrl-C, ``timeout``) does not reach it, not even while its
    interpreter starts, before it could ignore one (a ``KeyboardInterrupt`` traceback in the middle
    of the caller's output): the caller stops its helpers itself."""
    ours, theirs = socket.socketpair()
    flags = ["-E", "-s"] + ([] if warnings else ["-W", "ignore"])
    try:
        proc = subprocess.Popen(
            [sys.executable, *flags, "-c", _BOOT, _PACKAGE_PARENT, entry, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
            process_group=0,  # its own group from birth: a stop sent to ours never reaches it mid-start
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return proc, ours


def ignore_group_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM in this process: a stop sent to the process group is the parent's
    to handle (at its step boundary, where it stops its helpers itself), so the helper keeps working
    on the step in progress. Call it from the main thread (``signal.signal`` requires it)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def parent_alive_check() -> Callable[[], bool]:
    """A test of whether this process's parent is the one it has now: it captures the parent's pid
    at this call and answers False once the process has been re-parented (the parent exited)."""
    parent = os.getppid()
    return lambda: os.getppid() == parent


def exit_when_parent_gone(poll_s: float = 1.0) -> threading.Thread:
    """Start a daemon thread that checks every ``poll_s`` seconds whether the parent (as of this
    call) is gone, and then ends the process with ``os._exit(0)``: no cleanup, since whatever the
    helper held was for a parent that no longer exists. Returns the started thread."""
    parent_alive = parent_alive_check()

    def watch() -> None:
        while parent_alive():
            time.sleep(poll_s)
        os._exit(0)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent exits (``prctl``
    PR_SET_PDEATHSIG), so that a helper stuck in C code cannot outlive a killed parent; elsewhere
    (no ``prctl``) nothing.

    The kernel sends it when the *thread* that started this process exits, not the parent process:
    a child started from a parent's worker thread would be killed when that thread ends. It suits
    children started from the parent's main thread (or a single-threaded parent) only, which is why
    a caller chooses it rather than every helper getting it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def lead_own_process_group() -> None:
    """Make this process the leader of a new process group (``setpgid(0, 0)``), before it starts any
    process of its own: every process it starts then belongs to the group, which
    ``end_process_group(os.getpid())`` ends. A stop signal sent to the parent's group no longer reaches
    it (a helper ignores those anyway: ``ignore_group_stop_signals``). Where that is not allowed (a
    session leader), nothing."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def leads_own_group(pid: int) -> bool:
    """Whether the live process ``pid`` leads its own process group (has called
    ``lead_own_process_group``). Ask while it runs: once it has exited and been reaped, its number
    says nothing."""
    try:
        return os.getpgid(pid) == pid and pid != os.getpgrp()
    except OSError:
        return False


def end_process_group(leader_pid: int) -> None:
    """SIGKILL every process left in the group ``leader_pid`` led, the leader included if it still
    runs; a group with no member left is nothing to end. Call it only for a process seen leading its
    group (``leads_own_group``) while it ran: a process group's id is not reused while the group has a
    member, so the number names no one else's processes."""
    try:
        os.killpg(leader_pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
