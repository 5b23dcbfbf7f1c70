"""The grading processes' side: the zygote that forks workers, and the worker loop.

See ``grader_pool`` for the parent's side (deadlines, kills, replacements). A worker reads
``[idx, pred, gold, inner_timeout]`` JSON messages and answers ``[idx, verdict]``; it is capped in
address space (``ENTROPYRL_GRADER_MEM_GB``, default 4; 0 = no cap) and dies with the zygote.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque

from ...core.helper_process import die_with_parent
from .math_verify_compare import WARMUP, mv_equiv

__all__ = ["zygote"]


def _worker_setup() -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)  # math-verify logs every timeout / parse failure


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
    outlive a killed grading run. The zygote is single-threaded (it forks the workers from its main
    thread), as ``die_with_parent`` needs."""
    die_with_parent()


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
            ok = bool(mv_equiv(pred, gold, int(inner)))
        except BaseException:  # noqa: BLE001 - any failure (math-verify TimeoutException, MemoryError...) is a miss
            ok = False
        try:
            conn.send_bytes(json.dumps([idx, ok]).encode())
        except (OSError, ValueError):
            os._exit(0)


def zygote(ctl_fd: int) -> None:
    """The zygote: imports math-verify once, then forks a worker per request.

    Requests on the control socket are single bytes: ``s`` (spawn: the answer is the worker's pid,
    with the parent's end of a fresh socket pair attached, SCM_RIGHTS) and ``w`` (warm up: grade a
    few answers of the usual shapes between requests, so that workers forked later, replacements
    of killed ones, start with math-verify's parsers and sympy's caches warm). The parent asks for
    it at its first kill, so a cold start is not delayed by it.
    Single-threaded, so fork is safe. Exits when the parent closes the control socket."""
    import select
    import socket

    _worker_setup()
    import math_verify  # noqa: F401 - imported once here, inherited by every worker

    ctl = socket.socket(fileno=ctl_fd)
    try:
        ctl.sendall(b"R")
    except OSError:  # the parent needed no math-verify after all and is gone
        os._exit(0)
    warmups: deque = deque()
    warm_asked = False

    def reap() -> None:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass

    while True:
        if warmups and not select.select([ctl], [], [], 0)[0]:
            gold, pred = warmups.popleft()
            try:
                mv_equiv(pred, gold, 2)
            except BaseException:  # noqa: BLE001 - warm-up only
                pass
            continue
        try:
            request = ctl.recv(64)
        except OSError:
            request = b""
        if not request:  # the parent is done: wait for the workers
            deadline = time.monotonic() + 3.0  # (idle ones exit on EOF) so that their CPU
            while time.monotonic() < deadline:  # time is accounted to us, then exit
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        time.sleep(0.01)
                except ChildProcessError:
                    break
            os._exit(0)
        for command in request:
            if command == ord("w") and not warm_asked:
                warm_asked = True
                if os.environ.get("ENTROPYRL_GRADER_WARMUP", "1") != "0":
                    warmups.extend(WARMUP)
            elif command == ord("s"):
                reap()
                mine, theirs = socket.socketpair()
                pid = os.fork()
                if pid == 0:  # the worker
                    ctl.close()
                    theirs.close()
                    _serve(mine.detach())
                    os._exit(0)
                mine.close()
                try:
                    socket.send_fds(ctl, [str(pid).encode()], [theirs.fileno()])
                finally:
                    theirs.close()
