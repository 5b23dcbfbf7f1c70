"""Grading of model responses against gold answers: extraction, normalisation, math-verify.

Pipeline for one (response, gold) pair:

1. ``extract_answer``: the content of the last ``\\boxed{}`` / ``\\fbox{}`` / ``\\framebox{}``
   (balanced braces, escaped ``\\{ \\}`` skipped), else the text after the last ``Answer:``.
   No answer, an empty one, an unbalanced last box or an over-long response: verdict False.
2. Fast path in the calling process: both answers are normalised (``normalize``: leading zeros
   "073" -> "73", "27.0" -> "27", thousands separators "1,000" -> "1000", ``\\text{}`` and
   ``\\textbf{}`` wrappers, ``^\\circ``, ``\\%``, ``\\$``, a trailing period, ``\\left``/
   ``\\right``, spacing) and compared as strings (``compact_key``). Equal: correct. Plain numbers
   and integer fractions are compared exactly ("0.5" == "\\frac{1}{2}"). Constant expressions
   whose values are clearly apart ("3\\sqrt{13}" vs "90", via ``numeric_value``, a small
   evaluator that never calls ``eval``) are wrong. Identical pairs are graded once.
3. Otherwise math-verify (``parse`` + ``verify``, LaTeX extraction only, so no Python
   expression parser ever sees model text) runs in a *worker process* on the normalised pair
   (on the raw pair when math-verify cannot parse a normalised side).

The per-item time limit (default 5 s) is enforced from outside: the parent hands each worker at
most two items at a time and kills and replaces a worker whose current item runs past its
deadline (verdict False, reason "timeout"; the item queued behind it goes to another worker).
math-verify's own ``signal.alarm`` timeouts stay on inside the workers as a cheaper first line,
but are not relied on: a computation stuck in C code (a huge integer power, say) never returns
to the interpreter to receive the signal.
Processes: one *zygote*, a plain subprocess running this file (``python -I grader.py --zygote``:
it never re-imports the caller's ``__main__`` and is safe to start from a multi-threaded
parent), imports math-verify and warms its parsers once, then forks the workers, so a worker
(and its replacement after a kill) starts warm in milliseconds. Workers live for the whole
process (reused across calls), die with the zygote, and are capped in address space
(``ENTROPYRL_GRADER_MEM_GB``, default 4; 0 = no cap) so that a pathological answer cannot eat the
machine's memory. ``ENTROPYRL_GRADER_WARMUP=0`` skips the zygote's warm-up.

Model text is never executed: no ``eval``/``exec``/``sympify`` here; the only parser of model
text is math-verify's LaTeX parser.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from multiprocessing.connection import wait as mp_wait
from typing import Callable, Sequence

DEFAULT_TIMEOUT = 5.0
MAX_RESPONSE_CHARS = 200_000   # longer responses are not searched: verdict False ("too_long")
MAX_ANSWER_CHARS = 1_000       # longer extracted / gold answers are not compared: verdict False

__all__ = [
    "DEFAULT_TIMEOUT", "MAX_RESPONSE_CHARS", "MAX_ANSWER_CHARS", "GradeResult",
    "extract_answer", "normalize", "compact_key", "numeric_value", "is_equiv", "grade_answers", "grade_batch",
    "shutdown_pool",
]


@dataclass(frozen=True)
class GradeResult:
    """Verdict for one response. ``reason``: match / numbers_differ (decided by the fast path),
    math_verify / mismatch (decided by math-verify), no_answer, too_long, timeout, worker_died,
    bad_input (the gold answer is empty or not text)."""

    correct: bool
    extracted: str | None
    reason: str = ""


# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(boxed|fbox|framebox)(?![A-Za-z])")
_ANSWER_RE = re.compile(r"answer\s*[:\uff1a]", re.IGNORECASE)


def _balanced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the ``{...}`` group opening at ``text[start]`` and the index after it.

    Escaped braces (``\\{``, ``\\}``) and ``\\\\`` are skipped. None if never closed."""
    depth = 0
    i, n = start, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
        i += 1
    return None


_UNBALANCED = object()


def _box_content(text: str, m: re.Match):
    """The argument of the box command matched by ``m``: a string, None (no argument) or
    ``_UNBALANCED``."""
    i, n = m.end(), len(text)
    if m.group(1) == "framebox":         # \framebox[width][pos]{...}
        for _ in range(2):
            j = i
            while j < n and text[j] in " \t":
                j += 1
            if j < n and text[j] == "[":
                close = text.find("]", j)
                if close < 0:
                    return _UNBALANCED
                i = close + 1
    j = i
    while j < n and text[j] in " \t":
        j += 1
    if j < n and text[j] == "{":
        got = _balanced(text, j)
        return _UNBALANCED if got is None else got[0]
    if j > i and j < n:                   # "\boxed 5": one token up to a space, '$' or newline
        k = j
        while k < n and text[k] not in " \t\n$":
            k += 1
        return text[j:k] or None
    return None


def _last_box(text: str):
    """Content of the last box with an argument; ``_UNBALANCED`` if that box never closes;
    None if there is no box."""
    for m in reversed(list(_BOX_RE.finditer(text))):
        got = _box_content(text, m)
        if got is not None:
            return got
    return None


_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def _answer_line(text: str) -> str | None:
    last = None
    for last in _ANSWER_RE.finditer(text):
        pass
    if last is None:
        return None
    rest = text[last.end():]
    line = rest.split("\n", 1)[0].strip()
    line = line.strip("*_ \t").strip()
    if line.endswith("."):
        line = line[:-1].rstrip()
    for left, right in _DELIMS:
        if len(line) > len(left) + len(right) and line.startswith(left) and line.endswith(right):
            line = line[len(left):-len(right)].strip()
            break
    return line or None


def extract_answer(text) -> str | None:
    """The final answer in a model response, or None.

    The last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\framebox{...}`` (balanced braces; an
    unbalanced last box gives None), else the rest of the line after the last ``Answer:``.
    Responses longer than ``MAX_RESPONSE_CHARS`` and non-strings give None."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str) or not text or len(text) > MAX_RESPONSE_CHARS:
        return None
    boxed = _last_box(text)
    if boxed is _UNBALANCED:
        return None
    if boxed is not None:
        boxed = boxed.strip()
        return boxed or None
    return _answer_line(text)


# --------------------------------------------------------------------------------------------
# Normalisation (pure string operations, linear time)
# --------------------------------------------------------------------------------------------

_NUM_RE = re.compile(r"^([+-]?)(\d{1,3}(?:,\d{3})+|\d+)?(?:\.(\d*))?$")
_WRAP_RE = re.compile(r"^\\(?:boxed|fbox|textbf|mathbf|text|textrm|mathrm|mbox)\s*\{")
_INNER_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree|°")
_SPACING_RE = re.compile(r"\\[,;:! ]|\\q?quad(?![A-Za-z])|~")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_UNITS_RE = re.compile(r"\\(?:text|mathrm|mbox)\{\s+[^{}]*\}\s*$")   # "5\text{ cm}": a unit
_LHS_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=[^=])")   # "x = 5", "a_1 = 5"


def canonical_number(s: str) -> str | None:
    """"073" -> "73", "27.0" -> "27", "1,000" -> "1000", "+.50" -> "0.5"; None if not a plain
    decimal number."""
    m = _NUM_RE.match(s)
    if not m or (m.group(2) is None and not m.group(3)):
        return None
    sign, whole, frac = m.group(1), (m.group(2) or "0").replace(",", ""), (m.group(3) or "")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    out = whole + ("." + frac if frac else "")
    if sign == "-" and out != "0":
        out = "-" + out
    return out


def _unwrap_whole(s: str) -> str:
    """Remove wrappers like ``\\boxed{...}`` / ``\\text{...}`` that span the whole string."""
    for _ in range(5):
        m = _WRAP_RE.match(s)
        if not m:
            return s
        got = _balanced(s, m.end() - 1)
        if got is None or got[1] != len(s):
            return s
        s = got[0].strip()
    return s


def normalize(answer: str) -> str:
    """A normalised answer that is still LaTeX (fed to math-verify and to ``compact_key``)."""
    s = answer.strip()
    s = _unwrap_whole(s)
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\%", "").replace("%", "")
    s = _DEGREE_RE.sub("", s)
    s = _UNITS_RE.sub("", s)
    s = _SPACING_RE.sub(" ", s).strip()
    while len(s) > 1 and s.endswith((".", ",", ";")) and not s.endswith("\\."):
        s = s[:-1].rstrip()
    s = _unwrap_whole(s)
    if s.startswith("(") and s.endswith(")") and canonical_number(s[1:-1].strip()) is not None:
        s = s[1:-1].strip()                  # "(073)" -> "073" (a lone number in parentheses)
    m = _LHS_RE.match(s)
    if m and "=" not in s[m.end():]:
        s = s[m.end():].strip()
    num = canonical_number(s.replace(" ", ""))
    return num if num is not None else s


def compact_key(answer: str) -> str:
    """``normalize`` plus spacing-, ``\\left``- and ``\\dfrac``-insensitive: the fast-path key."""
    s = normalize(answer)
    s = _LEFT_RIGHT_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _INNER_TEXT_RE.sub(r"\1", s)
    s = re.sub(r"\s+", "", s)
    num = canonical_number(s)
    return num if num is not None else s


# --------------------------------------------------------------------------------------------
# math-verify, inside worker processes
# --------------------------------------------------------------------------------------------

def _mv_equiv(pred: str, gold: str, inner_timeout: int) -> bool:
    """math-verify on the normalised pair, then on the raw pair. Runs in a worker."""
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0)]
    pairs = [(normalize(gold), normalize(pred))]
    if pairs[0] != (gold, pred):
        pairs.append((gold, pred))
    for g, p in pairs:
        if not g or not p:
            continue
        gp = parse("\\boxed{" + g + "}", extraction_config=config, parsing_timeout=inner_timeout)
        pp = parse("\\boxed{" + p + "}", extraction_config=config, parsing_timeout=inner_timeout)
        if gp and pp:
            # Both sides parsed: this comparison is authoritative (the raw pair is only a
            # fallback for when normalisation left something math-verify cannot read).
            return bool(verify(gp, pp, timeout_seconds=inner_timeout))
    return False


# A few answers of the usual shapes, graded once in the zygote so that every worker forked from
# it starts with math-verify's parsers and sympy's caches warm (a cold process pays ~1 s).
_WARMUP = [
    ("\\frac{1}{2}", "0.5"), ("2\\sqrt{3}", "\\sqrt{12}"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
    ("[-2, 7]", "x \\in [-2,7]"), ("\\{1,2\\}", "1, 2"), ("x^2+2x+1", "(x+1)^2"), ("y = 2x - 3", "2x-3"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "(1,2)"), ("\\text{(C)}", "C"), ("3-4i", "3 - 4 i"),
    ("(0,9) \\cup (9,36)", "\\frac{1}{2}"), ("10\\%", "0.1"), ("\\infty", "-\\infty"), ("e^{i\\pi}", "-1"),
]


def _worker_setup() -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)   # math-verify logs every timeout / parse failure


def _limit_memory() -> None:
    mem_gb = float(os.environ.get("ENTROPYRL_GRADER_MEM_GB", "4"))
    if mem_gb <= 0:
        return
    try:
        import resource

        cap = int(mem_gb * (1 << 30))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):
        pass


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the zygote exits, so that a worker stuck in C code cannot
    outlive a killed grading run."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(fd: int) -> None:
    """Worker loop on socket ``fd``: read ``[idx, pred, gold, inner_timeout]`` JSON messages,
    reply ``[idx, verdict]``. Says ``"ready"`` first; stops on EOF (the parent went away)."""
    from multiprocessing.connection import Connection

    _die_with_parent()
    _limit_memory()
    conn = Connection(fd)
    conn.send_bytes(b'"ready"')
    while True:
        try:
            idx, pred, gold, inner = json.loads(conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            os._exit(0)
        try:
            ok = bool(_mv_equiv(pred, gold, int(inner)))
        except BaseException:  # noqa: BLE001 - any failure (math-verify TimeoutException, MemoryError...) is a miss
            ok = False
        try:
            conn.send_bytes(json.dumps([idx, ok]).encode())
        except (OSError, ValueError):
            os._exit(0)


def _zygote(ctl_fd: int) -> None:
    """The zygote: imports and warms math-verify once, then forks a worker per request.

    Requests on the control socket are ``b"spawn"``; the answer is the worker's pid, with the
    parent's end of a fresh socket pair attached (SCM_RIGHTS). Single-threaded, so fork is safe.
    Exits when the parent closes the control socket."""
    import signal
    import socket

    _worker_setup()
    for gold, pred in (_WARMUP if os.environ.get("ENTROPYRL_GRADER_WARMUP", "1") != "0" else []):
        try:
            _mv_equiv(pred, gold, 2)
        except BaseException:  # noqa: BLE001 - warm-up only
            pass
    ctl = socket.socket(fileno=ctl_fd)
    ctl.sendall(b"R")

    def reap() -> None:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass

    while True:
        try:
            request = ctl.recv(16)
        except OSError:
            request = b""
        if not request:                                # the parent is done: wait for the workers
            deadline = time.monotonic() + 3.0         # (idle ones exit on EOF) so that their CPU
            while time.monotonic() < deadline:         # time is accounted to us, then exit
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        time.sleep(0.01)
                except ChildProcessError:
                    break
            os._exit(0)
        reap()
        mine, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:                                   # the worker
            ctl.close()
            theirs.close()
            _serve(mine.detach())
            os._exit(0)
        mine.close()
        try:
            socket.send_fds(ctl, [str(pid).encode()], [theirs.fileno()])
        finally:
            theirs.close()


class _Zygote:
    """``python -I grader.py --zygote``: a plain subprocess (never re-imports the caller's
    ``__main__``; safe to start from a multi-threaded parent) that forks warm workers."""

    def __init__(self):
        import socket

        self.ctl, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-W", "ignore", os.path.abspath(__file__), "--zygote",
                 str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                close_fds=True)
        finally:
            theirs.close()
        self.ready = False

    def spawn(self) -> tuple[int, int]:
        """A new worker: ``(pid, socket fd)``."""
        import socket

        if not self.ready:
            self.ctl.settimeout(WORKER_START_TIMEOUT)
            try:
                got = self.ctl.recv(1)
            except OSError:
                got = b""
            if got != b"R":
                raise RuntimeError("the grading process failed to start (is math-verify installed "
                                   f"for {sys.executable}?); exit code {self.proc.poll()}")
            self.ctl.settimeout(None)
            self.ready = True
        self.ctl.sendall(b"spawn")
        msg, fds, _, _ = socket.recv_fds(self.ctl, 64, 1)
        if not msg or not fds:
            raise RuntimeError(f"the grading process died (exit code {self.proc.poll()})")
        return int(msg.decode()), fds[0]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.ctl.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


class _Worker:
    """One forked grading process and our end of its socket."""

    def __init__(self, zygote: _Zygote):
        from multiprocessing.connection import Connection

        self.pid, fd = zygote.spawn()
        self.conn = Connection(fd)
        self.ready = False
        self.started = time.monotonic()
        self.queue: deque[int] = deque()   # item indices sent, in the order the worker takes them
        self.deadline = math.inf           # for the item at the head of the queue

    def stop(self, kill: bool) -> None:
        """Close our end (an idle worker exits on EOF); ``kill``: SIGKILL it too (a stuck worker)."""
        import signal

        try:
            self.conn.close()
        except OSError:
            pass
        if kill:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


WORKER_START_TIMEOUT = 60.0
QUEUE_DEPTH = 2          # items handed to a worker at once (one running, one waiting)


def _hung_up(conn) -> bool:
    """Whether the worker behind ``conn`` already exited (then its pid must not be signalled)."""
    try:
        if conn.poll(0):
            conn.recv_bytes()
    except (EOFError, OSError):
        return True
    return False


class GradingPool:
    """Worker processes that run math-verify, with a per-item deadline enforced by the parent."""

    def __init__(self, workers: int | None = None):
        self.size = max(1, workers or _cpu_count())
        self._zygote: _Zygote | None = None
        self._workers: list[_Worker] = []
        self.timeouts = 0      # items killed at their deadline since the pool started
        self.restarts = 0

    def _new_worker(self) -> _Worker:
        if self._zygote is None or not self._zygote.alive():
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = _Zygote()
        return _Worker(self._zygote)

    def _ensure(self, wanted: int) -> None:
        while len(self._workers) < min(wanted, self.size):
            self._workers.append(self._new_worker())

    def _replace(self, w: _Worker, kill: bool = True) -> None:
        w.stop(kill=kill)
        self._workers[self._workers.index(w)] = self._new_worker()
        self.restarts += 1

    def run(self, items: Sequence[tuple[str, str]], timeout: float,
            on_done: Callable[[int, bool, str], None]) -> None:
        """Grade ``(pred, gold)`` items with math-verify; ``on_done(index, verdict, reason)``.

        Each worker holds up to ``QUEUE_DEPTH`` items so that it never waits for the parent to be
        scheduled; it works through them in order. An item's ``timeout`` seconds start when the
        parent sees the worker take it up (the previous result arrived, or it was sent to an idle
        worker). A timed-out or dead worker's queued items go back to the pending queue."""
        if not items:
            return
        inner = max(1, int(math.ceil(timeout)) - 1)     # math-verify's own (signal) limit, whole seconds
        self._ensure(len(items))
        pending = deque(range(len(items)))

        def requeue(w: _Worker) -> None:
            while len(w.queue) > 1:
                pending.appendleft(w.queue.pop())

        while True:
            for w in list(self._workers):
                while w.ready and len(w.queue) < QUEUE_DEPTH and pending:
                    idx = pending.popleft()
                    pred, gold = items[idx]
                    try:
                        w.conn.send_bytes(json.dumps([idx, pred, gold, inner]).encode())
                    except (OSError, ValueError):        # dead worker: its items go elsewhere
                        pending.appendleft(idx)
                        if w.queue:
                            requeue(w)
                            pending.appendleft(w.queue.popleft())
                        self._replace(w, kill=False)
                        break
                    if not w.queue:
                        w.deadline = time.monotonic() + timeout
                    w.queue.append(idx)
            busy = [w for w in self._workers if w.queue]
            if not busy and not pending:
                return
            waiting = [w for w in self._workers if w.queue or not w.ready]
            deadlines = [w.deadline for w in busy] or [w.started + WORKER_START_TIMEOUT for w in waiting]
            ready = mp_wait([w.conn for w in waiting], timeout=max(0.0, min(deadlines) - time.monotonic()))
            for w in [w for w in waiting if w.conn in ready]:
                while True:
                    try:
                        msg = json.loads(w.conn.recv_bytes())
                    except (EOFError, OSError, ValueError):
                        msg = None
                    if msg is None:                       # the worker died (already gone: no kill)
                        requeue(w)
                        head = w.queue[0] if w.queue else None
                        self._replace(w, kill=False)
                        if head is not None:
                            on_done(head, False, "worker_died")
                        break
                    if msg == "ready":
                        w.ready = True
                    else:
                        idx, ok = msg
                        w.queue.popleft()
                        if w.queue:
                            w.deadline = time.monotonic() + timeout
                        on_done(idx, bool(ok), "math_verify" if ok else "mismatch")
                    if not w.conn.poll(0):
                        break
            now = time.monotonic()
            for w in list(self._workers):
                if w.queue and now >= w.deadline:
                    requeue(w)
                    head = w.queue[0]
                    self.timeouts += 1
                    self._replace(w, kill=not _hung_up(w.conn))   # kill: the only reliable way to stop it
                    on_done(head, False, "timeout")
                elif not w.ready and now - w.started > WORKER_START_TIMEOUT:
                    raise RuntimeError(f"a grading worker did not start within {WORKER_START_TIMEOUT:.0f} s")

    def close(self) -> None:
        for w in self._workers:
            w.stop(kill=bool(w.queue))
        self._workers = []
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


_POOL: GradingPool | None = None
_POOL_LOCK = threading.Lock()


def _pool(workers: int | None) -> GradingPool:
    global _POOL
    size = max(1, workers or _cpu_count())
    if _POOL is None or _POOL.size != size:
        if _POOL is not None:
            _POOL.close()
        _POOL = GradingPool(size)
    return _POOL


def shutdown_pool() -> None:
    """Stop the shared worker processes (also done at interpreter exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None


atexit.register(shutdown_pool)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def _as_text(x) -> str | None:
    if isinstance(x, (bytes, bytearray)):
        return bytes(x).decode("utf-8", errors="replace")
    if isinstance(x, str):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return repr(x) if isinstance(x, float) else str(x)
    return None


def _precheck(pred: str | None, gold: str | None) -> str | None:
    """A reason to return False without math-verify, "match" for the fast path, else None."""
    if gold is None or pred is None:
        return "no_answer" if pred is None else "bad_input"
    if not pred.strip() or not gold.strip():
        return "no_answer" if not pred.strip() else "bad_input"
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return "too_long"
    pk, gk = compact_key(pred), compact_key(gold)
    if pk and pk == gk:
        return "match"
    pv, gv = _rational(pk), _rational(gk)
    if pv is not None and gv is not None:
        # Plain numbers and integer fractions, compared exactly ("0.5" == "\\frac{1}{2}"). When
        # they differ but a decimal is within math-verify's 6-decimal rounding of the other
        # ("0.333333" vs "\\frac{1}{3}"), math-verify decides.
        if pv[0] == gv[0]:
            return "match"
        decimals = max(pv[1], gv[1])
        if decimals == 0 or abs(pv[0] - gv[0]) > Fraction(1, 10 ** min(decimals, 6)):
            return "numbers_differ"
        return None
    # Constant expressions ("3\\sqrt{13}", "-\\frac{\\pi}{6}", "2^{10}") whose values are clearly
    # apart cannot be equal: no math-verify needed. Only ever a *reject*; equality stays with it.
    a, b = numeric_value(pk), numeric_value(gk)
    if a is not None and b is not None and abs(a - b) > 1e-5 * max(1.0, abs(a), abs(b)):
        return "numbers_differ"
    return None


class _NotNumeric(Exception):
    pass


_TOKEN_RE = re.compile(r"\\(?:frac|sqrt|pi|cdot|times)(?![A-Za-z])|\d+(?:\.\d+)?|\.\d+|[-+*/^(){}\[\]]")


def numeric_value(key: str) -> float | None:
    """The value of a constant arithmetic expression in LaTeX, or None.

    A small recursive-descent evaluator (no ``eval``) over numbers, ``+ - *``, ``\\cdot``,
    ``\\times``, ``^``, ``\\frac``, ``\\sqrt`` (with an optional index), ``\\pi``, parentheses and
    braces, with implicit multiplication ("3\\sqrt{2}"). Anything else (a letter, a comma, a
    set, a slash, a huge power, an ambiguous "2^10") gives None."""
    if not key or len(key) > 200:
        return None
    tokens, pos = [], 0
    for m in _TOKEN_RE.finditer(key):
        if m.start() != pos:
            return None                      # something outside the grammar (a letter, a comma...)
        tokens.append(m.group())
        pos = m.end()
    if pos != len(key):
        return None
    i = 0

    def peek():
        return tokens[i] if i < len(tokens) else None

    def take(expected=None):
        nonlocal i
        tok = peek()
        if tok is None or (expected is not None and tok != expected):
            raise _NotNumeric
        i += 1
        return tok

    def finite(x: float) -> float:
        if not math.isfinite(x) or abs(x) > 1e100:
            raise _NotNumeric
        return x

    def expr() -> float:
        value = term()
        while peek() in ("+", "-"):
            value = finite(value + term() if take() == "+" else value - term())
        return value

    def starts_factor(tok) -> bool:
        return tok is not None and (tok[0].isdigit() or tok[0] == "." or tok in ("\\frac", "\\sqrt", "\\pi", "(", "{"))

    def term() -> float:
        value = unary()
        while True:
            tok = peek()
            if tok in ("*", "\\cdot", "\\times"):
                take()
                value = finite(value * unary())
            elif tok == "/":                 # "2/3\\pi": (2/3)pi or 2/(3pi)? Left to math-verify.
                raise _NotNumeric
            elif tok is not None and (tok[0].isdigit() or tok[0] == "."):
                raise _NotNumeric            # a number right after a factor ("1.5.2", "\\sqrt{2}3")
            elif starts_factor(tok):
                value = finite(value * power())
            else:
                return value

    def unary() -> float:
        if peek() in ("-", "+"):
            return -unary() if take() == "-" else unary()
        return power()

    def power() -> float:
        base = atom()
        if peek() == "^":
            take()
            exponent = group() if peek() == "{" else atom_single()
            if abs(exponent) > 64 or (base < 0 and exponent != int(exponent)) or (base == 0 and exponent < 0):
                raise _NotNumeric
            try:
                return finite(math.pow(base, exponent))
            except (OverflowError, ValueError):
                raise _NotNumeric from None
        return base

    def group() -> float:
        take("{")
        value = expr()
        take("}")
        return value

    def atom_single() -> float:
        """A one-character argument: ``\\sqrt2``, ``2^3``. Longer bare runs ("2^10", which LaTeX
        typesets as 2^1 0) are ambiguous: not numeric."""
        tok = take()
        if tok.isdigit() and len(tok) == 1:
            return float(tok)
        if tok == "\\pi":
            return math.pi
        raise _NotNumeric

    def arg() -> float:
        return group() if peek() == "{" else atom_single()

    def atom() -> float:
        tok = peek()
        if tok is None:
            raise _NotNumeric
        if tok[0].isdigit() or tok[0] == ".":
            take()
            return float(tok)
        if tok == "\\pi":
            take()
            return math.pi
        if tok == "(":
            take()
            value = expr()
            take(")")
            return value
        if tok == "{":
            return group()
        if tok == "\\frac":
            take()
            nxt = peek()
            if nxt is not None and nxt.isdigit() and len(nxt) == 2:   # \\frac12
                take()
                top, bottom = float(nxt[0]), float(nxt[1])
            else:
                top, bottom = arg(), arg()
            if bottom == 0:
                raise _NotNumeric
            return finite(top / bottom)
        if tok == "\\sqrt":
            take()
            index = 2.0
            if peek() == "[":
                take()
                index = expr()
                take("]")
                if index not in (2.0, 3.0, 4.0, 5.0):
                    raise _NotNumeric
            radicand = arg()
            if radicand < 0:
                raise _NotNumeric
            return finite(radicand ** (1.0 / index))
        raise _NotNumeric

    try:
        value = expr()
    except (_NotNumeric, RecursionError, OverflowError, ZeroDivisionError, ValueError):
        return None
    return value if i == len(tokens) else None


_FRAC_RE = re.compile(r"^(-?)\\frac(?:\{(-?\d{1,30})\}\{(\d{1,30})\}|(\d)(\d))$")


def _rational(key: str) -> tuple[Fraction, int] | None:
    """``(exact value, decimals written)`` of a compact key that is a plain decimal number or an
    integer fraction ``\\frac{a}{b}``; None otherwise."""
    if len(key) > 64:
        return None
    num = canonical_number(key)
    if num is not None:
        return Fraction(num), len(num.partition(".")[2])
    m = _FRAC_RE.match(key)
    if not m:
        return None
    top, bottom = (m.group(2), m.group(3)) if m.group(2) is not None else (m.group(4), m.group(5))
    if int(bottom) == 0:
        return None
    value = Fraction(int(top), int(bottom))
    return (-value if m.group(1) else value), 0


def grade_answers(preds: Sequence[str | None], golds: Sequence, *, workers: int | None = None,
                  timeout: float = DEFAULT_TIMEOUT,
                  progress: Callable[[int], None] | None = None) -> list[tuple[bool, str]]:
    """``(verdict, reason)`` for already extracted answers against gold answers."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} answers but {len(golds)} gold answers")
    out: list[tuple[bool, str] | None] = [None] * len(preds)
    unique: dict[tuple[str, str], list[int]] = {}    # identical pairs go to math-verify once
    for i, (p, g) in enumerate(zip(preds, golds)):
        p, g = _as_text(p) if p is not None else None, _as_text(g)
        pre = _precheck(p, g)
        if pre is None:
            unique.setdefault((p, g), []).append(i)
        else:
            out[i] = (pre == "match", pre)
            if progress:
                progress(1)
    items = list(unique)

    def done(j: int, ok: bool, reason: str) -> None:
        for i in unique[items[j]]:
            out[i] = (ok, reason)
        if progress:
            progress(len(unique[items[j]]))

    if items:
        with _POOL_LOCK:
            _pool(workers).run(items, float(timeout), done)
    return [o if o is not None else (False, "worker_died") for o in out]


def is_equiv(pred, gold, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether answer ``pred`` equals gold answer ``gold`` (both already extracted)."""
    return grade_answers([pred], [gold], timeout=timeout)[0][0]


def grade_batch(responses: Sequence, golds: Sequence, *, workers: int | None = None,
                timeout: float = DEFAULT_TIMEOUT,
                progress: Callable[[int], None] | None = None) -> list[GradeResult]:
    """Grade full model responses against gold answers, in parallel across worker processes.

    ``workers``: math-verify processes (None = CPUs available). ``timeout``: seconds per item,
    enforced by killing the worker. ``progress(k)`` is called as items finish."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
    extracted: list[str | None] = []
    too_long: set[int] = set()
    for i, r in enumerate(responses):
        text = _as_text(r)
        if text is not None and len(text) > MAX_RESPONSE_CHARS:
            too_long.add(i)
        extracted.append(extract_answer(text) if text is not None else None)
    verdicts = grade_answers(extracted, golds, workers=workers, timeout=timeout, progress=progress)
    return [GradeResult(correct=ok, extracted=extracted[i],
                        reason="too_long" if i in too_long else reason)
            for i, (ok, reason) in enumerate(verdicts)]


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--zygote":
    _zygote(int(sys.argv[2]))
