"""Tool calls at the speed of a fork: a warm interpreter inside the sandbox (the *zygote*,
``zygote_serve.py``) that forks a fresh child per call, instead of a fresh sandboxed interpreter
per call (``sandbox.run_script``).

What stays as with a fresh interpreter: the same launcher (bubblewrap or unshare namespaces, the
read-only root, ``--die-with-parent``), the same per-call limits (applied in the child: CPU,
address space, processes, open files, file size; wall clock and output cap enforced by the
zygote, with a bound of our own on top), a fresh process per call that drops to a fresh uid when
we are root, and nothing shared between calls: each child is a fork of a parent that never runs,
compiles or parses a call's text, and after each call every process of it is killed and the files
it left are removed (see ``zygote_serve.py``). What differs: the zygote's own interpreter start-up
and launcher are paid once per worker, not per call; the children of one zygote share its hash
seed and its already-imported modules (fresh copies in each child).

The zygote's replies are framed by the zygote, which alone holds its pipes to us; a reply with the
wrong id, type or length, a zygote that ends, or one silent past the call's wall clock plus
``GRACE_SECONDS`` is a ``sandbox_error``: the zygote is killed and the next call starts a fresh
one (``ZygotePool.scripts`` runs such a call once more, as ``SandboxPool`` does).
"""

from __future__ import annotations

import marshal
import os
import queue
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from .harness_wire import OUT_OF_MEMORY_STATUS
from .sandbox import BOOT, TAIL_CHARS, SandboxLimits, SandboxResult, _once_more_on_sandbox_error
from .sandbox_launch import drop_uid, fresh_uid, interpreter, launch_prefix, launcher, sandbox_env, sweep_uid

__all__ = ["Zygote", "ZygotePool", "ZYGOTE_CODE", "GRACE_SECONDS"]

ZYGOTE_CODE = marshal.dumps(compile((Path(__file__).parent / "zygote_serve.py").read_text(encoding="utf-8"), "<zygote>", "exec"))
# How long past a call's wall clock we wait for the zygote's reply before we call it lost.
GRACE_SECONDS = 3.0
REPLY_CAP = 1 << 26  # a reply longer than this is not the zygote's


class ZygoteLost(Exception):
    """The zygote ended, went silent or answered something that is not a reply."""


class Zygote:
    """One warm sandboxed interpreter; ``run(program)`` runs one call in a fresh child of it.
    One call at a time (``ZygotePool`` gives each worker its own)."""

    def __init__(self, limits: SandboxLimits, prelude: str | None = None):
        self.limits = limits
        # trusted wrapper text, compiled here once; a call then names it with data (``cells``)
        self.prelude = marshal.dumps(compile(prelude, "<cell>", "exec") if prelude else None)
        self.kind = launcher(limits.isolation)
        self.drop = drop_uid(self.kind)
        self.proc: subprocess.Popen | None = None
        self.workdir = ""
        self.seq = 0
        self.starts = 0

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        lim = self.limits
        self.workdir = tempfile.mkdtemp(prefix="entropyrl-zyg-")
        os.chmod(self.workdir, 0o711)  # a call's uid reaches its own folder inside, lists nothing
        args = [
            "1" if self.kind in ("bwrap", "unshare") else "0",
            "1" if self.kind == "bwrap" else "0",
            str(int(lim.cpu_seconds)),
            str(int(lim.memory_mb) << 20),
            str(int(lim.processes)),
            str(int(lim.open_files)),
            str(int(lim.file_size_mb) << 20),
            self.workdir,
        ]
        cmd = launch_prefix(self.kind, self.workdir, lim.disk_mb) + [interpreter(), "-I", "-S", "-c", BOOT, *args]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.workdir,
            env=sandbox_env(self.workdir),
            start_new_session=True,
        )
        self.starts += 1
        os.set_blocking(self.proc.stdin.fileno(), False)
        os.set_blocking(self.proc.stdout.fileno(), False)
        boot = len(ZYGOTE_CODE).to_bytes(4, "big") + ZYGOTE_CODE + len(self.prelude).to_bytes(4, "big") + self.prelude
        self._send(boot, time.monotonic() + 30.0)

    def stop(self, uid: int | None = None) -> None:
        """Kill the zygote and everything in its sandbox; remove its folder."""
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        if uid is not None and self.kind == "none":  # no namespace ended the call's processes
            sweep_uid(uid)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""

    # -- one call -----------------------------------------------------------------------------
    def run(self, program: str | tuple, tail_chars: int = TAIL_CHARS) -> SandboxResult:
        """``program`` (a script: it sets ``_entropyrl_script_failed_``; or a cell
        ``(code, show_last, replay)`` for the prelude's ``_entropyrl_cell``) run in a fresh child;
        the result as ``sandbox.run_script`` gives it."""
        if not isinstance(program, str):
            program = [str(program[0]), bool(program[1]), [str(x) for x in program[2]]]
        lim = self.limits
        started = time.perf_counter()
        uid = fresh_uid() if self.drop else None
        try:
            if self.proc is None or self.proc.poll() is not None:
                self.stop()
                self.start()
            self.seq += 1
            body = marshal.dumps(
                [self.seq, program, -1 if uid is None else uid, float(lim.wall_seconds), int(lim.max_output_bytes)]
            )
            deadline = time.monotonic() + float(lim.wall_seconds) + GRACE_SECONDS
            self._send(len(body).to_bytes(4, "big") + body, deadline)
            reply = self._reply(deadline)
        except (ZygoteLost, OSError, ValueError) as exc:
            self.stop(uid)
            return SandboxResult(False, "sandbox_error", round(time.perf_counter() - started, 4), detail=f"zygote: {exc}")
        status, code, verdict, out = reply[1], reply[2], reply[3], reply[4]
        return _result(status, code, verdict, out, lim, round(time.perf_counter() - started, 4), tail_chars)

    def _send(self, data: bytes, deadline: float) -> None:
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while len(view):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ZygoteLost("it did not take the call in time")
                if sel.select(timeout=left):
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError) as exc:
                        raise ZygoteLost(f"it ended ({exc.__class__.__name__})") from None

    def _read(self, n: int, deadline: float, sel) -> bytes:
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZygoteLost("it did not answer within the wall clock and its grace")
            if not sel.select(timeout=left):
                continue
            try:
                chunk = os.read(fd, min(n - len(buf), 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise ZygoteLost("it ended during the call")
            buf += chunk
        return bytes(buf)

    def _reply(self, deadline: float) -> list:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout.fileno(), selectors.EVENT_READ)
            size = int.from_bytes(self._read(4, deadline, sel), "big")
            if not 0 < size <= REPLY_CAP:
                raise ZygoteLost(f"a reply of {size} bytes")
            body = self._read(size, deadline, sel)
        try:
            reply = marshal.loads(body)
        except (EOFError, ValueError, TypeError) as exc:
            raise ZygoteLost(f"a reply that does not decode ({exc})") from None
        ok = (
            type(reply) is list
            and len(reply) == 6
            and reply[0] == self.seq
            and type(reply[1]) is str
            and type(reply[2]) is int
            and type(reply[3]) is str
            and type(reply[4]) is bytes
        )
        if not ok:
            raise ZygoteLost("a reply that is not this call's")
        return reply


def _result(
    status: str, code: int, verdict: str, out: bytes, lim: SandboxLimits, seconds: float, tail_chars: int
) -> SandboxResult:
    """The zygote's account of one call as a ``SandboxResult`` (the reasons of ``run_script``)."""
    detail = ""
    if status in ("timeout", "output_limit"):
        reason = status
    elif status == "fork_failed":
        reason, detail = "sandbox_error", f"the zygote could not fork (errno {code})"
    elif status == "signaled":
        reason = "timeout" if code == signal.SIGXCPU else "killed"
        detail = (
            "CPU time limit"
            if code == signal.SIGXCPU
            else f"killed by signal {code}"
            + (" (the CPU hard limit, or the kernel's OOM killer)" if code == signal.SIGKILL else "")
        )
    elif status != "exited":
        reason, detail = "sandbox_error", f"the zygote said '{status[:40]}'"
    elif code == 0 and verdict in ("P", "F"):
        reason = "pass" if verdict == "P" else "fail"
    elif verdict == "M" or code == OUT_OF_MEMORY_STATUS or b"MemoryError" in out[-4000:]:
        reason = "memory"
    else:
        reason, detail = "error", f"exited (status {code}) before the tests finished"
    tail = out[-int(tail_chars) :].decode("utf-8", "replace")
    passed = reason == "pass"
    return SandboxResult(passed, reason, seconds, tail, int(passed), 1, detail)


def _stop_all(zygotes: list) -> None:
    for z in list(zygotes):
        z.stop()


class ZygotePool:
    """``scripts(programs)`` as ``SandboxPool.scripts``, each worker with a warm zygote of its own
    (started on first use, started again after it is lost); ``close()`` ends them (so does
    garbage collection, and the interpreter's exit)."""

    def __init__(self, workers: int | None = None, limits: SandboxLimits | None = None, prelude: str | None = None):
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.workers = max(1, int(workers) if workers else cpus)
        self.limits = limits or SandboxLimits()
        self.prelude = prelude
        drop_uid(launcher(self.limits.isolation))  # probe, warn or refuse once, up front
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._all: list[Zygote] = []
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _stop_all, self._all)

    def _take(self) -> Zygote:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            z = Zygote(self.limits, self.prelude)
            with self._lock:
                self._all.append(z)
            return z

    def run_script(self, program: str | tuple, tail_chars: int = TAIL_CHARS) -> SandboxResult:
        z = self._take()
        try:
            return z.run(program, tail_chars)
        finally:
            self._idle.put(z)

    def cells(self, cells: Sequence[tuple], tail_chars: int = TAIL_CHARS) -> list[SandboxResult]:
        """``(code, show_last, replay)`` each run by the prelude's ``_entropyrl_cell``; as ``scripts``."""
        if self.prelude is None:
            raise ValueError("cells need a pool made with a prelude")
        return self.scripts(list(cells), tail_chars)

    def scripts(self, programs: Sequence[str | tuple], tail_chars: int = TAIL_CHARS) -> list[SandboxResult]:
        """One result per program, in order, ``workers`` at a time."""

        def one(program: str | tuple) -> SandboxResult:
            return _once_more_on_sandbox_error(lambda: self.run_script(program, tail_chars), pause=0.05)

        if self.workers == 1 or len(programs) <= 1:
            return [one(p) for p in programs]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(programs))) as ex:
            return list(ex.map(one, programs))

    def close(self) -> None:
        self._finalizer()
