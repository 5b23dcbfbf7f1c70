"""Run one untrusted Python program with its tests, isolated, and say whether every test passed.

``run_program(program, tests, limits)`` -> ``SandboxResult(passed, reason, seconds, stdout_tail,
tests_passed, tests_total)``; ``reason`` is one of ``REASONS``. ``SandboxPool`` runs many at once.
``run_script(program, limits)`` runs a program with no tests and keeps what it printed (the tool
executor's mode: a policy's code cell, its output read back).

How one run is isolated (docs/sandbox.md says what this does *not* cover):

- Launcher (``evals/code/sandbox_launch.py``), chosen once per process (``isolation``: ``auto`` | ``bwrap`` | ``unshare`` | ``none``):
  ``bwrap`` (bubblewrap): new network, pid, ipc and uts namespaces, a root holding only the
  interpreter, its standard library and shared libraries (read-only), private ``/tmp`` and the
  run's own folder, ``--die-with-parent``, a new session. ``unshare``: new network and pid namespaces only (the
  filesystem stays as the user's; when root, the program runs as an unprivileged uid so it cannot
  write what it does not own). ``none``: plain process with rlimits, a warning once per process
  (no network isolation). ``auto`` takes the first that works on this kernel.
- The harness (``HARNESS``: ``harness_wire.py`` + ``oracle_harness.py``, run by ``python -I -S``)
  sets rlimits (CPU seconds, address space, processes, open files, file size), then forks before
  it reads anything: the *candidate* (drops to its own fresh uid when root, keeps two pipes, runs
  the program) and the *oracle* (another fresh uid, non-dumpable; reads the spec on stdin,
  ``marshal``, and runs setup and tests). Environment: PATH, HOME/TMPDIR = the run folder.
- The tests reach the program only across the pipe: a name they do not define is the program's,
  a function called with plain-data arguments whose result (or exception) comes back as plain data
  and is rebuilt from builtin types (``harness_wire``); anything else is a ``fail``. A stdin/stdout
  problem (``stdio=True``) is compiled at load and run per case by ``_stdio_case(input, want)``.
- Pass/fail: after each test the oracle writes ``<nonce> ok|fail|error <i>`` to a result pipe
  only it holds (the nonce: 128 random bits in the spec, which the candidate never sees), then
  ``<nonce> done``. Exit status is ignored: a program that exits early, kills its parent or dies
  leaves no ``done``; a candidate that dies is reported by its status (killed, timeout, error).
- Wall clock: past ``wall_seconds`` the whole process group is SIGKILLed (with it, through
  ``--die-with-parent``, the pid namespace and every process in it). Output (stdout + stderr
  together) is read as it comes and capped at ``max_output_bytes``; past it the run is killed.
- The run folder is a fresh temporary directory, deleted afterwards (under bwrap a tmpfs of
  ``disk_mb`` mounted over it, so a program cannot fill the host's disk either).
"""

# size: the isolation of one untrusted run end to end, with the harness source it boots (the launchers are sandbox_launch.py)
from __future__ import annotations

import marshal
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ...core.errors import UserError
from .harness_wire import HARNESS_FAILED_MARK, HARNESS_FAILED_STATUS
from .sandbox_launch import ISOLATIONS, drop_uid, fresh_uid, interpreter, launch_prefix, launcher, sandbox_env, sweep_uid

__all__ = ["REASONS", "SandboxLimits", "SandboxResult", "run_program", "run_script", "SandboxPool", "launcher", "ISOLATIONS"]

REASONS = ("pass", "fail", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error")
TAIL_CHARS = 2000


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. ``processes``: at most that many processes/threads of the run at once."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024  # address space of each process
    processes: int = 32
    open_files: int = 64
    file_size_mb: int = 16  # largest file the program may write
    max_output_bytes: int = 64_000  # stdout + stderr kept; past it the run is killed
    disk_mb: int = 64  # bwrap: size of the run folder (a tmpfs)
    isolation: str = "auto"

    @classmethod
    def from_cfg(cls, cfg) -> SandboxLimits:
        """From a mapping (``data.sandbox`` / ``eval.sandbox``); unknown keys are an error."""
        d = dict(cfg or {})
        d.pop("workers", None)
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(d) - known)
        if bad:
            raise UserError(f"unknown sandbox key '{bad[0]}'; valid: {', '.join(sorted(known | {'workers'}))}")
        lim = cls(**{k: v for k, v in d.items() if v is not None})
        if lim.isolation not in ISOLATIONS:
            raise UserError(f"sandbox.isolation={lim.isolation}: valid: {', '.join(ISOLATIONS)}")
        if lim.wall_seconds <= 0 or lim.cpu_seconds < 1 or lim.memory_mb < 64 or lim.processes < 1:
            raise UserError(
                "sandbox limits must be positive (wall_seconds > 0, cpu_seconds >= 1, memory_mb >= 64, processes >= 1)"
            )
        return lim


@dataclass
class SandboxResult:
    passed: bool
    reason: str
    seconds: float
    stdout_tail: str = ""
    tests_passed: int = 0
    tests_total: int = 0
    detail: str = ""  # the exception line the harness reported, if any
    extra: dict = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return self.tests_passed / self.tests_total if self.tests_total else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        return d


# The harness (``oracle_harness.py``, run by ``python -I -S -c``): splits into the candidate and
# the oracle before it reads the spec; see that file.
HARNESS = (
    (Path(__file__).parent / "harness_wire.py").read_text(encoding="utf-8")
    + "\n"
    + re.sub(
        r"^from \.harness_wire import \([^)]*\)\n",
        "",
        (Path(__file__).parent / "oracle_harness.py").read_text(encoding="utf-8"),
        flags=re.M,
    )
)
# Compiled once here and sent on stdin ahead of the spec (compiling it in every run would cost
# more than the rest of the harness): ``BOOT`` reads exactly its bytes, unbuffered, so nothing of
# the spec is in memory when the harness forks the candidate.
HARNESS_CODE = marshal.dumps(compile(HARNESS, "<harness>", "exec"))
BOOT = (
    "import marshal, os\n"
    "def take(n):\n"
    "    b = b''\n"
    "    while len(b) < n:\n"
    "        c = os.read(0, n - len(b))\n"
    "        if not c:\n"
    "            raise SystemExit(1)\n"
    "        b += c\n"
    "    return b\n"
    "exec(marshal.loads(take(int.from_bytes(take(4), 'big'))))\n"
)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _verdict(lines: list[str], nonce: str, n_tests: int) -> tuple[str, int, str, bool]:
    """``(reason, tests passed, detail, done)`` from the result pipe's lines (only ours count)."""
    ok, reason, detail, done = set(), None, "", False
    for line in lines:
        if not line.startswith(nonce + " "):
            continue
        parts = line[len(nonce) + 1 :].split(" ", 2)
        word = parts[0]
        if word == "done":
            done = True
        elif word == "ok" and len(parts) > 1 and parts[1].isdigit():
            ok.add(int(parts[1]))
        elif word in ("fail", "error", "memory", "killed", "timeout") and reason is None:
            reason = word
            detail = (
                f"test {parts[1]}: " + (parts[2] if len(parts) > 2 else "")
                if parts[1:2] and parts[1].isdigit()
                else " ".join(parts[1:])
            )
    passed = len({i for i in ok if i < n_tests})
    if done and passed == n_tests and n_tests > 0:
        return "pass", passed, "", True
    return reason or ("fail" if done else ""), passed, detail, done


def run_program(
    program: str,
    tests: Sequence[str] | str = (),
    limits: SandboxLimits | None = None,
    setup: str = "",
    stdio: bool = False,
    tail_chars: int = TAIL_CHARS,
) -> SandboxResult:
    """Run ``program`` in the candidate process, then ``setup`` and each of ``tests`` (trusted
    Python snippets, each a test: it passes if it returns without raising) in the oracle process,
    where a name the tests do not define is the program's (see the module docstring).
    ``stdio``: the program is only compiled at load; ``_stdio_case(input, want)`` runs it per case.
    ``tail_chars``: how much of the end of the output ``stdout_tail`` keeps.
    """
    lim = limits or SandboxLimits()
    tests = [tests] if isinstance(tests, str) else list(tests)
    kind = launcher(lim.isolation)
    started = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="entropyrl-sbx-")
    uids = (fresh_uid(), fresh_uid()) if drop_uid(kind) else (None, None)
    uid = uids[1]
    nonce = secrets.token_hex(16)
    proc, status = None, "sandbox_error"
    read_fd, write_fd = os.pipe()
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        spec = {"program": program, "setup": setup, "tests": tests, "nonce": nonce, "stdio": bool(stdio)}
        cmd = _boot_command(kind, workdir, lim, uids, write_fd)
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                cwd=workdir,
                env=sandbox_env(workdir),
                start_new_session=True,
            )
        except OSError as exc:
            return SandboxResult(False, "sandbox_error", time.perf_counter() - started, detail=str(exc))
        os.close(write_fd)
        write_fd = -1
        payload = len(HARNESS_CODE).to_bytes(4, "big") + HARNESS_CODE + marshal.dumps(spec)
        out, res, status = _communicate(proc, payload, read_fd, lim, started)
    finally:
        if proc is not None:
            _kill_group(proc)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        # A pid namespace dies with its first process (the kernel kills the rest) and bwrap /
        # unshare wait for that; after a kill, or without a namespace, sweep the run's uid.
        for u in uids:
            if u is not None and (kind == "none" or status != "ok"):
                sweep_uid(u)
        for fd in (read_fd, write_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.perf_counter() - started
    tail = out[-int(tail_chars) :].decode("utf-8", "replace")
    reason, n_ok, detail, done = _verdict(res.decode("utf-8", "replace").splitlines(), nonce, len(tests))
    if status in ("timeout", "output_limit"):
        reason = status
    elif reason == "":
        reason, detail = _unfinished_reason(proc.returncode if proc is not None else None, out, detail)
    return SandboxResult(reason == "pass", reason, round(seconds, 4), tail, n_ok, len(tests), detail)


def _boot_command(kind: str, workdir: str, lim: SandboxLimits, uids: tuple, write_fd: int) -> list[str]:
    """The launcher's prefix (``kind``) and the boot interpreter's arguments: the pipe it reports
    on, the two uids to drop to (``-``: none), the resource limits and the work folder."""
    limits = {
        "cpu": int(lim.cpu_seconds),
        "as": int(lim.memory_mb) << 20,
        "nproc": int(lim.processes),
        "nofile": int(lim.open_files),
        "fsize": int(lim.file_size_mb) << 20,
    }
    return launch_prefix(kind, workdir, lim.disk_mb) + [
        interpreter(),
        "-I",
        "-S",
        "-c",
        BOOT,
        str(write_fd),
        *("-" if u is None else str(u) for u in uids),
        *(str(limits[k]) for k in ("cpu", "as", "nproc", "nofile", "fsize")),
        workdir,
    ]


def _unfinished_reason(rc: int | None, out: bytes, detail: str) -> tuple[str, str]:
    """Why a run whose tests did not all report ended, from its exit status ``rc`` and the end of
    its output: ``(reason, detail)``; ``detail`` is the verdict's own where the status adds none."""
    if rc is not None and rc < 0 and -rc == signal.SIGXCPU:
        return "timeout", "CPU time limit"
    if rc is not None and (rc < 0 or rc >= 128):  # bwrap reports a signal death as 128+sig
        sig = -rc if rc < 0 else rc - 128
        reason = "timeout" if sig == signal.SIGXCPU else "killed"
        return reason, f"killed by signal {sig}" + (
            " (the CPU hard limit, or the kernel's OOM killer)" if sig == signal.SIGKILL else ""
        )
    if rc == HARNESS_FAILED_STATUS:  # the harness's own failure (its code is ours): the machine's, not the program's
        said = [ln for ln in out[-4000:].decode("utf-8", "replace").splitlines() if ln.startswith(HARNESS_FAILED_MARK)]
        return "sandbox_error", "the sandbox's harness failed" + (
            ": " + said[-1][len(HARNESS_FAILED_MARK) :].strip() if said else ""
        )
    if b"MemoryError" in out[-4000:]:
        return "memory", detail
    return "error", f"exited (status {rc}) before the tests finished"


def _communicate(
    proc: subprocess.Popen, spec: bytes, read_fd: int, lim: SandboxLimits, started: float
) -> tuple[bytes, bytes, str]:
    """Feed the spec, collect output and results until both pipes close, the wall limit passes
    or the output cap is hit. Returns ``(output, results, status)``, status in ok/timeout/output_limit."""
    sel = selectors.DefaultSelector()
    out, res, status = bytearray(), bytearray(), "ok"
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(read_fd, selectors.EVENT_READ)
    view, open_reads = memoryview(spec), 2
    deadline = started + float(lim.wall_seconds)
    try:
        while open_reads:
            left = deadline - time.perf_counter()
            if left <= 0:
                status = "timeout"
                break
            events = sel.select(timeout=min(left, 0.1))
            if not events and proc.poll() is not None:
                break  # the harness is gone and the pipes are idle: a leftover child holds them
            for key, _ in events:
                if key.fileobj is proc.stdin:
                    try:
                        n = os.write(proc.stdin.fileno(), view[:65536])
                        view = view[n:]
                    except (BrokenPipeError, BlockingIOError, OSError):
                        view = view[:0]
                    if not len(view):
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_reads -= 1
                elif fd == read_fd:
                    res += chunk[: 1_000_000 - len(res)]
                else:
                    out += chunk
                    if len(out) > lim.max_output_bytes:
                        status = "output_limit"
                        return bytes(out), bytes(res), status  # all that was read: the caller keeps its head and tail
        if status == "ok":
            try:
                proc.wait(timeout=max(0.05, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                status = "timeout"
    finally:
        sel.close()
        if proc.stdin and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
    return bytes(out), bytes(res), status


# The one test of a script run: a round trip to the program's process. The program's process
# flushes its output before it answers, so what it printed is in the pipe before the harness ends;
# it also reads the flag a script sets when its code raised (``ok`` = the code ran through).
SCRIPT_TEST = "assert not _entropyrl_script_failed_, 'the code raised'"


def run_script(program: str, limits: SandboxLimits | None = None, tail_chars: int = TAIL_CHARS) -> SandboxResult:
    """Run ``program`` (which must set ``_entropyrl_script_failed_`` to a false value when it ends
    normally) with no tests and keep the last ``tail_chars`` of what it printed. ``reason``: ``pass``
    (it ran through), ``fail`` (it raised and caught its own error, or unset the flag), or a limit
    (``timeout``, ``memory``, ``output_limit``, ``killed``, ``error``, ``sandbox_error``)."""
    return run_program(program, [SCRIPT_TEST], limits, tail_chars=tail_chars)


# --------------------------------------------------------------------------------------------
# Many runs
# --------------------------------------------------------------------------------------------


def _once_more_on_sandbox_error(run: Callable[[], SandboxResult], pause: float = 0.5) -> SandboxResult:
    """``run()``, and once more after ``pause`` seconds when the sandbox itself failed (a
    ``sandbox_error``: no process to start, the harness could not fork): a failure of the machine
    for a moment must not be a program's result. A second failure is the result, its detail kept."""
    for attempt in (1, 2):
        try:
            r = run()
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - one broken run must not sink the batch
            r = SandboxResult(False, "sandbox_error", 0.0, detail=f"{type(exc).__name__}: {exc}")
        if r.reason != "sandbox_error" or attempt == 2:
            return r
        time.sleep(pause)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Job:
    program: str
    tests: tuple[str, ...]
    setup: str = ""
    stdio: bool = False


class SandboxPool:
    """Runs many programs, ``workers`` at a time (the CPU budget: about one core per worker).

    ``workers``: None = the CPUs this process may use. Threads only wait on child processes."""

    def __init__(self, workers: int | None = None, limits: SandboxLimits | None = None):
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.workers = max(1, int(workers) if workers else cpus)
        self.limits = limits or SandboxLimits()
        drop_uid(launcher(self.limits.isolation))  # probe, warn or refuse once, up front

    def map(self, jobs: Sequence[Job], progress: Callable[[int], None] | None = None) -> list[SandboxResult]:
        """One result per job, in order."""

        def one(job: Job) -> SandboxResult:
            r = _once_more_on_sandbox_error(
                lambda: run_program(job.program, list(job.tests), self.limits, setup=job.setup, stdio=job.stdio)
            )
            if progress:
                progress(1)
            return r

        if self.workers == 1 or len(jobs) <= 1:
            return [one(j) for j in jobs]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(jobs))) as ex:
            return list(ex.map(one, jobs))

    def scripts(self, programs: Sequence[str], tail_chars: int = TAIL_CHARS) -> list[SandboxResult]:
        """``run_script`` of each program, ``workers`` at a time; one result per program, in order."""

        def one(program: str) -> SandboxResult:
            return _once_more_on_sandbox_error(lambda: run_script(program, self.limits, tail_chars))

        if self.workers == 1 or len(programs) <= 1:
            return [one(p) for p in programs]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(programs))) as ex:
            return list(ex.map(one, programs))
