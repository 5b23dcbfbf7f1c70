"""``core.helper_process`` in real processes: a helper that ignores the group's stop signals keeps
running through them, and one whose parent is killed sees it gone (and, with the watch thread,
exits)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DEADLINE_S = 10.0

# The child of a parent that the test kills: it says its pid (through the parent's stdout, which it
# shares), then goes on as ``body`` says.
_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
child.wait()
"""


def _read_line(fd: int, deadline: float) -> str:
    """One line from ``fd`` (read byte by byte, so nothing past it is consumed); '' at EOF. Fails
    the test at the deadline."""
    out = b""
    while not out.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            pytest.fail(f"no line within {DEADLINE_S:g} s (so far {out!r})")
        byte = os.read(fd, 1)
        if not byte:
            return out.decode()
        out += byte
    return out.decode().strip()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie that nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("ignoring", [True, False])
def test_group_stop_signals_leave_a_helper_running(ignoring):
    """SIGINT and SIGTERM sent to the helper's process group: it still answers afterwards; without
    the call, the same signals end it (the test can tell the two apart)."""
    body = (
        "import sys\n"
        "from entropyrl.core.helper_process import ignore_group_stop_signals\n"
        f"if {ignoring}: ignore_group_stop_signals()\n"
        "print('ready', flush=True)\n"
        "for line in sys.stdin: print('alive', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", body], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        assert _read_line(proc.stdout.fileno(), deadline) == "ready"
        for sig in (signal.SIGINT, signal.SIGTERM):
            os.killpg(proc.pid, sig)
        if ignoring:
            # a signal is delivered before the process returns from its read, so an answer to a
            # line written after the signals were sent is proof that they did not end it
            proc.stdin.write(b"ping\n")
            proc.stdin.flush()
            assert _read_line(proc.stdout.fileno(), deadline) == "alive"
            assert proc.poll() is None
        else:
            assert proc.wait(timeout=DEADLINE_S) != 0
    finally:
        _kill(proc.pid)
        proc.wait()


def _orphan(body: str):
    """A parent process running a child with ``body``; returns the parent and the child's pid."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, body], stdout=subprocess.PIPE)
    deadline = time.monotonic() + DEADLINE_S
    return parent, int(_read_line(parent.stdout.fileno(), deadline)), deadline


@pytest.mark.parametrize("ending", ["exit_when_parent_gone(poll_s=0.05)", "die_with_parent()"])
def test_a_helper_ends_once_its_parent_is_killed(ending):
    """The parent SIGKILLed (no chance to stop its helpers): the helper ends by itself, by its watch
    thread or by the kernel's PDEATHSIG (its parent started it from the main thread)."""
    if ending == "die_with_parent()" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    body = (
        "import time\n"
        "from entropyrl.core.helper_process import die_with_parent, exit_when_parent_gone\n"
        f"{ending}\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(60)\n"
    )
    parent, child, deadline = _orphan(body)
    try:
        assert _read_line(parent.stdout.fileno(), deadline) == "ready"
        assert _running(child)
        parent.kill()
        parent.wait()
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _running(child), f"the helper {child} outlived its parent by {DEADLINE_S:g} s"
    finally:
        _kill(child)
        parent.stdout.close()


def test_parent_alive_check_turns_false_once_the_helper_is_reparented():
    body = (
        "import time\n"
        "from entropyrl.core.helper_process import parent_alive_check\n"
        "parent_alive = parent_alive_check()\n"
        "print(parent_alive(), flush=True)\n"
        "deadline = time.monotonic() + 30\n"
        "while parent_alive() and time.monotonic() < deadline: time.sleep(0.02)\n"
        "print(parent_alive(), flush=True)\n"
    )
    parent, child, deadline = _orphan(body)
    try:
        assert _read_line(parent.stdout.fileno(), deadline) == "True"
        parent.kill()
        parent.wait()
        assert _read_line(parent.stdout.fileno(), deadline) == "False"
    finally:
        _kill(child)
        parent.stdout.close()
