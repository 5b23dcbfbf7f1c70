"""Warm-started local jobs: a sweep's jobs forked from one process that has imported their libraries.

A cold local job spends seconds before its first step on the interpreter and on imports (torch,
transformers, MLflow and its SQL store, matplotlib, the trainer), most loaded on first use. With
``launcher.warm_start=true`` the local launcher starts one *warm worker* per sweep (at its first
submission) that imports them once (``PRELOAD``) and forks each job from that state.

submitit's controller still starts one process per job task (``SUBMITIT_*`` environment, log
files), the small *job command* (``job``): it hands the worker its environment, directory and
streams over a unix socket; the worker forks a child that takes them on and runs submitit's
``process_job``; the job command exits as the child did, so submitit sees the job as before. The
controller's signals are passed to the child; one sent to the whole process group reaches the
child directly, as it reaches a cold job, and is not passed on twice. The child (its own pid in ``job.json``, its
own memory and torch threads) is killed with its job command and with the worker.

The worker runs no torch operation and starts no thread (checked before every fork), ignores the
group's stop signals, takes no new job once its stdin (a pipe from the sweep) reaches EOF and ends
after its last job. A job it cannot start fails with one ``error:`` line in its log naming
``launcher.warm_start=false``: nothing falls back silently.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

from ..core.helper_process import die_with_parent, ignore_group_stop_signals

# What the worker imports before its first fork, in order: what submitit and a training job load,
# eagerly or on first use (a model class, the MLflow store, the plots). A name that fails to import
# is skipped: the job imports it itself if it needs it. ".x" names are modules of this package.
PRELOAD = (
    *("submitit.core.submission", ".jobs", ".job_kinds", "mlflow", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store"),
    *("transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto", "matplotlib.pyplot"),
    "transformers.models.qwen2.modeling_qwen2",  # the embedded tiny model's class
)
# Signals the controller sends a job's process (and a user might): passed on to the child.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
# Threads a fork may leave behind safely: jemalloc's background thread (pyarrow's allocator, loaded
# by the MLflow stack), which jemalloc's own fork handlers stop and restart around a fork.
FORK_SAFE_THREADS = ("jemalloc_bg_thd",)
HINT = "set launcher.warm_start=false to start each job in a fresh process"
# The worker imports single-threaded (unset, importing torch starts a pool a fork would break); a
# child takes its job's environment back and the trainer sets its torch threads (trainer.threads).
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
WORKER_LOG = "warm_worker.log"
_POLL_S = 0.1


class WarmStartError(Exception):
    """A job cannot be started warm (the worker is gone, or refused to fork); one ``error:`` line."""


class Worker:
    """The warm worker of one submitit folder, started here; ``command()`` is the job command
    submitit's controller runs for each job task. Its stdin is a pipe from this process that keeps
    it taking jobs: ``close`` (or this process's end, however it ends) closes it."""

    def __init__(self, folder: Path, env: dict[str, str]):
        self.folder = Path(folder).resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.socket_path = self.folder / f"warm-{uuid.uuid4().hex[:12]}.sock"
        with (self.folder / WORKER_LOG).open("a") as log:
            argv = [sys.executable, "-u", "-m", __name__, "serve", str(self.socket_path)]
            env = {**env, **SINGLE_THREADED}
            self.process = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)

    def command(self) -> str:
        """The job command, shell-quoted (submitit's controller splits it with ``shlex``)."""
        argv = [sys.executable, "-u", "-m", __name__, "job", str(self.socket_path), str(self.process.pid), str(self.folder)]
        return shlex.join(argv)

    def close(self) -> None:
        """No new jobs: the worker ends once its running jobs have ended."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()


def preload() -> None:
    """Import ``PRELOAD`` (no torch operation, no thread), transformers' unused backends skipped
    first as ``load_policy`` does."""
    importlib.import_module("..models.hf_imports", __package__).skip_unused_backends()
    for name in PRELOAD:
        try:
            importlib.import_module(name, __package__)
        except Exception as exc:  # noqa: BLE001 - an optional library: the job imports what it needs
            print(f"warm worker: {name} not preloaded: {type(exc).__name__}: {exc}", flush=True)


def fork_refusal() -> str | None:
    """Why forking this process now would hand a job broken state (a thread, CUDA), or None."""
    tasks = Path("/proc/self/task")
    comms = [tasks / t / "comm" for t in (os.listdir(tasks) if tasks.is_dir() else []) if int(t) != os.getpid()]
    others = [n for n in (_read(c) for c in comms) if n not in FORK_SAFE_THREADS and n is not None]
    if others or threading.active_count() > 1:
        return f"the warm worker runs other threads ({', '.join(others) or 'python'}), which a forked job would inherit broken"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the warm worker has initialised CUDA, which a forked job could not use"
    return None


def serve(socket_path: Path) -> None:
    """The worker's life: preload, then fork a child per job request, until the sweep has closed
    the stdin pipe and the last job has ended."""
    ignore_group_stop_signals()
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with _in_folder(socket_path.parent):  # a relative name: a unix socket's path is short
        listener.bind(socket_path.name)
        os.chmod(socket_path.name, 0o600)
    listener.listen(64)
    print(f"warm worker {os.getpid()}: ready on {socket_path}", flush=True)
    jobs: dict[int, socket.socket | None] = {}  # child pid -> its job command's connection
    taking = True
    try:
        while taking or jobs:
            conns = {c.fileno(): (pid, c) for pid, c in jobs.items() if c is not None}
            readable, _, _ = select.select([listener, *([0] if taking else []), *conns], [], [], _POLL_S)
            if 0 in readable and not os.read(0, 4096):
                taking = False  # the sweep is done with us, or gone
            if listener in readable:
                _accept(listener, jobs, taking)
            for fd in readable:
                if fd in conns and not _relay_signals(*conns[fd]):
                    pid = conns[fd][0]
                    jobs[pid] = None
                    _kill(pid, signal.SIGKILL)  # its job command was killed: so is the job, as a cold one
            _reap(jobs)
    finally:
        with contextlib.suppress(OSError):
            socket_path.unlink()


def _accept(listener: socket.socket, jobs: dict[int, socket.socket | None], taking: bool) -> None:
    conn, _ = listener.accept()
    conn.settimeout(30)
    fds: list[int] = []
    try:
        request, fds = _read_request(conn)
        refusal = None if taking else "the sweep that started the warm worker has ended"
        refusal = refusal or (None if len(fds) == 3 else "the job command passed no standard streams")
        refusal = refusal or fork_refusal()
        if refusal:
            conn.sendall(_line({"error": refusal}))
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, [listener, conn, *(c for c in jobs.values() if c is not None)])
        jobs[pid] = conn  # a job command gone by now: its connection's end kills the child
        with contextlib.suppress(OSError):
            conn.sendall(_line({"pid": pid}))
    except (OSError, ValueError) as exc:
        print(f"warm worker: a job request failed: {exc}", flush=True)
        conn.close()
    finally:
        for fd in fds:
            os.close(fd)


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ValueError("the job command closed its request short")
        data += more
    return json.loads(data), list(fds)


def _relay_signals(pid: int, conn: socket.socket) -> bool:
    """Pass the signals a job command sends to its child; False once the job command is gone."""
    try:
        data = conn.recv(4096)
    except OSError:
        data = b""
    for line in data.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            _kill(pid, int(json.loads(line)["signal"]))
    return bool(data)


def _reap(jobs: dict[int, socket.socket | None]) -> None:
    """Collect ended children and tell each job command how its child ended."""
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = jobs.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(_line({"exit": os.waitstatus_to_exitcode(status)}))
            conn.close()


def _child(request: dict, fds: list[int], inherited: list[socket.socket]) -> None:
    """In the forked child: become the job's process (its streams, directory, environment and
    signal dispositions, as a cold job's would be) and run it; never returns."""
    code = 1
    try:
        die_with_parent()  # no job left running once the worker that reports its end is gone
        for sock in inherited:
            sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        submit = sys.modules["submitit.core.submission"]
        sys.argv = [str(Path(submit.__file__).with_name("_submit.py")), request["folder"]]
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()  # numpy's global generator from fresh entropy, as in a new process
        code = _run_job(submit.process_job, request["folder"])
    except BaseException:  # noqa: BLE001 - reported in the job's log, then the child ends
        traceback.print_exc()
    finally:
        _finish(code)


def _run_job(process_job, folder: str) -> int:
    """submitit's ``process_job``, with the exit code the interpreter would give it."""
    try:
        process_job(folder)
        return 0
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except KeyboardInterrupt:
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends a process
        traceback.print_exc()
        return 1


def _finish(code: int) -> None:
    """End this process as the interpreter would: threads joined, atexit run, streams flushed; a
    negative ``code`` ends it by that signal."""
    try:
        with contextlib.suppress(Exception):
            getattr(threading, "_shutdown", lambda: None)()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code < 0:
            _die_by(-code)
        os._exit(code & 0xFF)


def run_job_command(socket_path: Path, worker_pid: int, folder: str) -> int:
    """Have the worker fork this job, pass it the controller's signals, and return how it ended
    (an exit code, or minus the signal that ended it)."""
    parent = os.getppid()  # submitit's controller: the signals it sends are passed on
    sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # taken by sigtimedwait, with their sender
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)  # an ignored signal would be dropped, not kept pending
    request = {"folder": folder, "cwd": os.getcwd(), "env": dict(os.environ), "sigint_ignored": sigint_ignored}
    conn = _connect(socket_path, worker_pid, parent, sigint_ignored)
    socket.send_fds(conn, [_line(request)], [0, 1, 2])
    where = f"the warm worker (pid {worker_pid}, log {socket_path.parent / WORKER_LOG})"
    buffer, forked = b"", False
    while True:
        readable, _, _ = select.select([conn], [], [], _POLL_S)
        data = conn.recv(4096) if readable else None
        if data == b"":
            raise WarmStartError(f"{where} ended before this job did, and the job with it; {HINT}")
        buffer += data or b""
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            reply = json.loads(line)
            if "error" in reply:
                raise WarmStartError(f"{where} cannot start this job: {reply['error']}; {HINT}")
            if "exit" in reply:
                return int(reply["exit"])
            forked = True  # {"pid": ...}: signals can reach the child now (until then they wait, pending)
        for sig in _signals_from(parent) if forked else ():
            conn.sendall(_line({"signal": int(sig)}))


def _connect(socket_path: Path, worker_pid: int, parent: int, sigint_ignored: bool) -> socket.socket:
    """The connection to the worker, once it listens (it may still be importing); a
    ``WarmStartError`` once it is gone. A signal from the controller before then ends this process
    as it would a job still starting."""
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with _in_folder(socket_path.parent):
                conn.connect(socket_path.name)
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
        if not _alive(worker_pid):
            raise WarmStartError(
                f"the warm worker (pid {worker_pid}) that starts this sweep's jobs is gone (its log: "
                f"{socket_path.parent / WORKER_LOG}); {HINT}"
            )
        for sig in _signals_from(parent):
            if not (sig == signal.SIGINT and sigint_ignored):
                _die_by(sig)
        time.sleep(0.05)


def _signals_from(parent: int) -> list[int]:
    """The pending forwarded signals that ``parent`` sent (others, e.g. a Ctrl-C to the whole
    process group, reached the child directly and are dropped here)."""
    pending = iter(lambda: signal.sigtimedwait(FORWARDED, 0), None)
    return [info.si_signo for info in pending if info.si_pid == parent]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # a thread that has just ended
        return None


def _line(message: dict) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _die_by(sig: int) -> None:
    """End this process by signal ``sig`` (its default action), as a process killed by it ends."""
    signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default action does not end the process


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, not yet collected by its parent, does not)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except ProcessLookupError:
        return False
    except (OSError, IndexError):  # not ours to signal, or no /proc (not Linux): it runs
        return True


@contextlib.contextmanager
def _in_folder(folder: Path):
    here = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "serve":
        return serve(Path(argv[1])) or 0
    if len(argv) == 4 and argv[0] == "job":
        try:
            return run_job_command(Path(argv[1]), int(argv[2]), argv[3])
        except WarmStartError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 1
    print("usage: python -m entropyrl.sweeps.warm_worker serve SOCKET | job SOCKET WORKER_PID FOLDER", file=sys.stderr)
    return 2


if __name__ == "__main__":
    _code = main(sys.argv[1:])
    if _code < 0:
        _die_by(-_code)
    sys.exit(_code)
