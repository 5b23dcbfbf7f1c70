"""The code sandbox's previous design, for ``perf/sandbox.py`` only: program, tests and pass
marker in ONE interpreter (the design that was replaced because a program could game it). Started
with the same launcher and mounts as the current sandbox, so the two differ only in the harness."""

from __future__ import annotations

import marshal
import os
import secrets
import shutil
import subprocess
import tempfile

from entropyrl.evals.code.sandbox import SandboxLimits, _communicate, _kill_group, _verdict
from entropyrl.evals.code.sandbox_launch import drop_uid, fresh_uid, interpreter, launch_prefix, launcher, sandbox_env

HARNESS = r"""
import os, sys, marshal, resource, builtins
def main(spec):
    fd, lim, write, run, comp = spec["fd"], spec["limits"], os.write, exec, compile
    # Bound now: the program can rebind names in the real builtins module, not these locals.
    AssertErr, MemErr, BaseExc, kind, text, items = AssertionError, MemoryError, BaseException, type, str, enumerate
    def cap(kind, value, hard=None):
        try:
            resource.setrlimit(kind, (value, value if hard is None else hard))
        except (ValueError, OSError):
            pass
    cap(resource.RLIMIT_CPU, lim["cpu"], lim["cpu"] + 1); cap(resource.RLIMIT_FSIZE, lim["fsize"])
    cap(resource.RLIMIT_NOFILE, lim["nofile"]); cap(resource.RLIMIT_CORE, 0)
    if spec["uid"] is not None:
        os.setgroups([]); os.setgid(spec["uid"]); os.setuid(spec["uid"])
    cap(resource.RLIMIT_NPROC, lim["nproc"]); cap(resource.RLIMIT_AS, lim["as"])
    null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
    os.chdir(spec["cwd"])
    nonce = spec.pop("nonce")
    def say(msg):
        write(fd, (nonce + " " + msg + "\n").encode())
    def why(exc):
        return kind(exc).__name__ + ": " + text(exc).replace("\n", " ")[:300]
    # The program and the tests each get their own copy of the builtins: a program that replaces
    # exec, len or AssertionError changes neither the harness nor what the tests see.
    clean = dict(builtins.__dict__)
    ns = {"__name__": "__main__", "__builtins__": dict(clean)}
    try:
        run(comp(spec["program"], "<program>", "exec"), ns)
        ns = {k: v for k, v in ns.items() if k != "__builtins__"}
        ns["__builtins__"] = dict(clean)
        if spec["setup"]:
            run(comp(spec["setup"], "<tests>", "exec"), ns)
    except MemErr as exc:
        say("memory " + why(exc)); return
    except BaseExc as exc:
        say("error " + why(exc)); return
    for i, test in items(spec["tests"]):
        try:
            run(comp(test, "<test %d>" % i, "exec"), ns)
        except MemErr as exc:
            say("memory %d %s" % (i, why(exc)))
        except AssertErr as exc:
            say("fail %d %s" % (i, why(exc)))
        except BaseExc as exc:
            say("error %d %s" % (i, why(exc)))
        else:
            say("ok %d" % i)
    say("done")
main(marshal.loads(sys.stdin.buffer.read()))
try:
    sys.stdout.flush(); sys.stderr.flush()
finally:
    os._exit(0)
"""


def run_one_interpreter(program: str, tests: list[str], setup: str = "", limits: SandboxLimits | None = None) -> bool:
    """Whether every test passed, graded the previous way."""
    lim = limits or SandboxLimits()
    kind = launcher(lim.isolation)
    workdir = tempfile.mkdtemp(prefix="entropyrl-base-")
    uid = fresh_uid() if drop_uid(kind) else None
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    proc = None
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        spec = {
            "program": program,
            "setup": setup,
            "tests": tests,
            "nonce": nonce,
            "fd": write_fd,
            "uid": uid,
            "cwd": workdir,
            "limits": {
                "cpu": lim.cpu_seconds,
                "as": lim.memory_mb << 20,
                "nproc": lim.processes,
                "nofile": lim.open_files,
                "fsize": lim.file_size_mb << 20,
            },
        }
        cmd = launch_prefix(kind, workdir, lim.disk_mb) + [interpreter(), "-I", "-S", "-c", HARNESS]
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
        os.close(write_fd)
        write_fd = -1
        import time

        _, res, _ = _communicate(proc, marshal.dumps(spec), read_fd, lim, time.perf_counter())
    finally:
        if proc is not None:
            _kill_group(proc)
            proc.wait(timeout=5)
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
    return _verdict(res.decode("utf-8", "replace").splitlines(), nonce, len(tests))[0] == "pass"
