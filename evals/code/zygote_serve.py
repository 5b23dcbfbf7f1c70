"""The zygote: the program run inside the sandbox (``python -I -S -c BOOT``) by ``zygote.py``;
standard library only, never imported by the package.

Started once per worker inside the same launcher as a fresh run (bubblewrap: new network, pid,
ipc and uts namespaces and a read-only root holding only the interpreter; unshare: network and
pid namespaces), it loads what a tool call's wrapper needs and then, per request, forks a
**child** that runs the call's program, and nothing else:

- the zygote never runs, compiles or parses a call's text: the child compiles it after the fork;
- the child first keeps only its own pipes (output on 1 and 2, the verdict on 3, /dev/null on 0),
  starts its own session, drops to the request's uid (when root), applies the per-call rlimits
  (CPU, address space, processes, open files, file size, no core), moves to a fresh folder of
  its own, and only then runs the program. It is a fork of a pristine parent, so whatever it
  changes (globals, modules, builtins, the environment) dies with it;
- the zygote reads the child's output through a pipe it owns and frames the reply itself, so a
  child cannot write a reply, another call's result or a frame: the zygote's own pipes are closed
  in the child, the zygote is not dumpable (no ``/proc/<pid>/fd`` or ptrace by the same uid), and
  a child of another uid cannot signal it;
- after the child ends (or passes the wall clock or the output cap) every process of the call is
  killed: its session, and in a pid namespace every process but the zygote and its init
  (``kill(-1)``), else every process of the call's uid; then the call's folder is removed, and
  under bubblewrap the private ``/tmp``, ``/dev/shm`` and run folder are emptied (elsewhere the
  files the call's uid left there), so the next call finds nothing of it.

Protocol (the host is trusted, a child never reaches these pipes): the host writes
``4-byte length + marshal(code or None)`` once (the wrapper a cell request calls, compiled by the
host from its own text), then per call ``4-byte length + marshal([id, program, uid or -1, wall
seconds, output cap])`` on stdin (program: a script's text, or a cell ``[code, show_last,
replay]`` passed as data to the wrapper's ``_entropyrl_cell``); the
zygote answers ``4-byte length + marshal([id, status, code, verdict, output, seconds])`` on
stdout, status in ``exited`` (code: exit status), ``signaled`` (code: signal), ``timeout``,
``output_limit``, ``fork_failed`` (code: errno); verdict ``P`` (the script ran through), ``F``
(it failed: its flag ``_entropyrl_script_failed_`` is set), ``M`` (out of memory) or empty.
argv: pid namespace (1/0), wipe /tmp (1/0), cpu, address space, processes, open files, file size,
the run folder.
"""

import ast  # noqa: F401 - loaded once here for every call's wrapper (tool_executor._CELL)
import builtins
import linecache  # noqa: F401
import marshal
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback  # noqa: F401

OUT_OF_MEMORY_STATUS = 86


def read_exact(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            raise SystemExit(0)  # the host closed the pipe: it is gone or done with us
        b += c
    return b


def write_all(fd, data):
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view) :]


def cap(kind, value, hard=None):
    try:
        resource.setrlimit(kind, (value, value if hard is None else hard))
    except (ValueError, OSError):
        pass


def fork_retry():
    """``os.fork()``, tried again for about a second while the machine is out of processes."""
    delay = 0.01
    while True:
        try:
            return os.fork()
        except OSError as exc:
            if delay > 0.6 or exc.errno not in (11, 12):  # EAGAIN, ENOMEM
                raise
            time.sleep(delay)
            delay *= 2


def child(program, uid, out_w, ver_w, folder, lim, prelude):
    """The call's process: isolate, limit, run ``program``; never returns."""
    status = 0
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(ver_w, 3)
        os.closerange(4, 65536)  # the zygote's pipes to the host among them
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if uid >= 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        cap(resource.RLIMIT_CPU, lim["cpu"], lim["cpu"] + 1)
        cap(resource.RLIMIT_FSIZE, lim["fsize"])
        cap(resource.RLIMIT_NOFILE, lim["nofile"])
        cap(resource.RLIMIT_CORE, 0)
        cap(resource.RLIMIT_NPROC, lim["nproc"])
        cap(resource.RLIMIT_AS, lim["as"])
        os.chdir(folder)
        os.environ["HOME"] = os.environ["TMPDIR"] = folder
        sys.set_int_max_str_digits(0)
        scope = {"__name__": "__main__", "__builtins__": builtins}
        try:
            if type(program) is str:
                exec(compile(program, "<cell>", "exec"), scope)
                failed = scope.get("_entropyrl_script_failed_", 1)  # unset: it never got there
            else:  # a cell: the prelude's wrapper, the call's code as data
                exec(prelude, scope)
                failed = scope["_entropyrl_cell"](program[0], program[1], program[2])
            verdict = b"F" if failed else b"P"
        except MemoryError:
            verdict = b"M"
        flush()
        os.write(3, verdict)
    except MemoryError:
        status = OUT_OF_MEMORY_STATUS
    except BaseException:  # noqa: BLE001 - the wrapper itself failed: no verdict, the status says it
        status = 1
    finally:
        flush()
        os._exit(status)


def flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the program may have replaced or closed them
            pass


def sweep(pid, uid, pidns):
    """Kill every process of the call: its session, then all of the namespace but us (or all of
    its uid); reap what is ours."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if pidns:
        # everyone in the namespace but us and its init, again while a fork storm still adds some
        for _ in range(100):
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                break
            reap(block=True)
            time.sleep(0.001)
    elif uid >= 0:
        helper = fork_retry()
        if helper == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                for _ in range(100):
                    os.kill(-1, signal.SIGKILL)  # ends (ProcessLookupError) once none of the uid is left
            finally:
                os._exit(0)
        os.waitpid(helper, 0)
    reap(block=pidns)


def reap(block):
    """Reap our ended children (in a pid namespace whose init we are: the orphans handed to us)."""
    while True:
        try:
            done, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if not done:
            return


def remove(path):
    def fix(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=fix)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def clean(folder, home, uid, wipe):
    """Remove what the call left: its folder, anything in the run folder, and in ``/tmp`` and
    ``/dev/shm`` everything (``wipe``: private to this sandbox) or what its uid owns."""
    remove(folder)
    for d in (home, "/tmp", "/dev/shm"):
        if d != home and not wipe and uid < 0:
            continue
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            p = os.path.join(d, name)
            if p == home or home.startswith(p + "/"):
                continue  # the run folder itself (under /tmp): only its contents go
            try:
                owner = os.lstat(p).st_uid
            except OSError:
                continue
            if d == home or wipe or owner == uid:
                remove(p)


def run_call(n, program, uid, wall, max_out, lim, home, pidns, wipe, prelude):  # noqa: C901 - one call's fork, limits, wait and sweep in the order the kernel needs them
    started = time.monotonic()
    folder = os.path.join(home, f"call-{n}")
    os.mkdir(folder, 0o700)
    if uid >= 0:
        os.chown(folder, uid, uid)
    out_r, out_w = os.pipe()
    ver_r, ver_w = os.pipe()
    try:
        pid = fork_retry()
    except OSError as exc:
        for fd in (out_r, out_w, ver_r, ver_w):
            os.close(fd)
        remove(folder)
        return ["fork_failed", exc.errno or 0, "", b"", 0.0]
    if pid == 0:
        child(program, uid, out_w, ver_w, folder, lim, prelude)
    os.close(out_w)
    os.close(ver_w)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    os.set_blocking(out_r, False)
    os.set_blocking(ver_r, False)
    out, status, wstatus, reading = bytearray(), None, None, True
    deadline = started + wall
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        fds = ([out_r] if reading else []) + ([pidfd] if pidfd is not None else [])
        ready, _, _ = select.select(fds, [], [], min(left, 0.02) if pidfd is None else left)
        if out_r in ready:
            try:
                chunk = os.read(out_r, 65536)
            except BlockingIOError:
                chunk = None
            if chunk == b"":
                reading = False
            elif chunk:
                out += chunk
                if len(out) > max_out:
                    status = "output_limit"
                    break
        done, ws = os.waitpid(pid, os.WNOHANG)
        if done:
            wstatus = ws
            break
    if status is None:  # ended: what it wrote before it ended is in the pipe
        while len(out) <= max_out:
            try:
                chunk = os.read(out_r, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            out += chunk
        if len(out) > max_out:
            status = "output_limit"
    try:
        verdict = os.read(ver_r, 1).decode("ascii", "replace")
    except (BlockingIOError, OSError):
        verdict = ""
    sweep(pid, uid, pidns)
    if wstatus is None:
        try:
            _, wstatus = os.waitpid(pid, 0)
        except ChildProcessError:
            wstatus = 0
    for fd in (out_r, ver_r) + ((pidfd,) if pidfd is not None else ()):
        os.close(fd)
    clean(folder, home, uid, wipe)
    seconds = time.monotonic() - started
    if status is not None:
        return [status, 0, "", bytes(out), seconds]
    if os.WIFSIGNALED(wstatus):
        return ["signaled", os.WTERMSIG(wstatus), verdict, bytes(out), seconds]
    return ["exited", os.WEXITSTATUS(wstatus), verdict, bytes(out), seconds]


def main():
    # kill(-1) only where it reaches this sandbox alone: a namespace whose first processes we are
    pidns = sys.argv[1] == "1" and os.getpid() in (1, 2)
    wipe = pidns and sys.argv[2] == "1"  # bubblewrap: /tmp and /dev/shm are this sandbox's own
    keys = ("cpu", "as", "nproc", "nofile", "fsize")
    lim = dict(zip(keys, map(int, sys.argv[3:8])))
    home = sys.argv[8]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a call's SIGINT to us is nothing
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace or /proc/<pid>/fd by the same uid
    except Exception:  # noqa: BLE001 - without ctypes the uid (or namespace) still guards us
        pass
    prelude = marshal.loads(read_exact(int.from_bytes(read_exact(4), "big")))  # the host's compiled wrapper, or None
    n = 0
    while True:
        size = int.from_bytes(read_exact(4), "big")
        req = marshal.loads(read_exact(size))
        n += 1
        reply = run_call(n, req[1], int(req[2]), float(req[3]), int(req[4]), lim, home, pidns, wipe, prelude)
        data = marshal.dumps([req[0]] + reply)
        write_all(1, len(data).to_bytes(4, "big") + data)


if __name__ == "__main__":
    main()
