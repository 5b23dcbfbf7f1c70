"""The program run inside the sandbox (``python -I -S -c <this file>``): never imported by the package.

It splits itself in two before reading anything secret: the **candidate** process (a fork that
drops to its own uid, keeps only two pipes and then runs the untrusted program) and the **oracle**
(drops to another uid, reads the spec, runs the benchmark's tests and alone holds the result pipe
and the nonce). The tests see the program only through ``Remote*`` proxies: each call crosses a
pipe as plain data and is rebuilt here from a closed set of builtin types, so no object of the
program ever reaches the tests' ``==``. argv: result fd, oracle uid, candidate uid (``-`` = keep).
"""

import builtins
import marshal
import os
import resource
import sys
import time

from .harness_wire import (  # the sandbox runs harness_wire.py's text in front of this file
    BUILTIN_NAMES,
    HARNESS_FAILED_MARK,
    HARNESS_FAILED_STATUS,
    OUT_OF_MEMORY_REPLY,
    OUT_OF_MEMORY_STATUS,
    CrossingError,
    Ended,
    decode,
    decode_exc,
    encode,
    encode_exc,
    recv,
    send,
)

# --- the candidate's side -----------------------------------------------------------------------


def serve(req, resp, program, stdio):
    """Load ``program`` and answer requests until the oracle closes the pipe. Runs as the
    candidate: everything here may be rewritten by the program; only the pipes leave it."""
    clean = dict(builtins.__dict__)
    ns = {"__name__": "__main__", "__builtins__": clean}
    try:
        code = compile(program, "<program>", "exec")
        if not stdio:
            exec(code, ns)
        reply = ["ok", [k for k, v in list(ns.items()) if type(k) is str and callable(v)]]
    except BaseException as exc:  # noqa: BLE001 - reported, the oracle decides
        try:
            reply = encode_exc(exc)
        except MemoryError:
            reply = OUT_OF_MEMORY_REPLY
    send(resp, reply)
    flush()
    while True:
        try:
            msg = recv(req)
        except CrossingError:
            return
        try:
            op = msg[0]
            if op == "stdio":
                reply = ["v", encode(run_stdio(code, msg[1], clean))]
            elif op == "get":
                if msg[1] not in ns:
                    raise NameError(f"name '{msg[1]}' is not defined")
                obj = ns[msg[1]]
                reply = ["module"] if type(obj) is type(sys) else ["callable"] if callable(obj) else ["v", encode(obj)]
            else:
                target = ns[msg[1]] if op == "call" else getattr(ns[msg[1]](), msg[2])
                args, kwargs = decode(msg[-2]), decode(msg[-1])
                reply = ["v", encode(target(*args, **kwargs))]
        except CrossingError as exc:
            reply = ["bad", str(exc)]
        except BaseException as exc:  # noqa: BLE001
            reply = encode_exc(exc)
        try:
            send(resp, reply)
        except (TypeError, ValueError, RecursionError) as exc:
            send(resp, ["bad", f"reply not encodable: {type(exc).__name__}"])
        flush()


def flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the program may have replaced or closed them
            pass


def run_stdio(code, text, clean):
    import io

    old = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = io.StringIO(text), io.StringIO()
    try:
        try:
            exec(code, {"__name__": "__main__", "__builtins__": dict(clean)})
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        return sys.stdout.getvalue()
    finally:
        sys.stdin, sys.stdout = old


# --- the oracle's side --------------------------------------------------------------------------


class LoadFailed(Exception):
    """The program raised (or its process ended) while it was being loaded."""


class Link:
    """The oracle's end of the two pipes to the candidate. The load reply is read when first
    needed, so the oracle prepares the tests while the candidate loads the program."""

    def __init__(self, req, resp):
        self.req, self.resp, self.loaded, self.on_load = req, resp, False, None

    def ensure_loaded(self):
        if self.loaded:
            return
        self.loaded = True
        try:
            reply = recv(self.resp)
        except CrossingError as exc:
            raise LoadFailed(exc) from None
        if type(reply) is list and len(reply) == 3 and reply[0] == "E":
            raise LoadFailed(decode_exc(reply))
        if type(reply) is not list or len(reply) != 2 or reply[0] != "ok" or type(reply[1]) is not list:
            raise LoadFailed(CrossingError("malformed load reply"))
        if self.on_load:
            self.on_load([n for n in reply[1] if type(n) is str])

    def ask(self, msg):
        self.ensure_loaded()
        try:
            send(self.req, msg)
        except OSError:
            raise Ended("the program's process ended") from None
        reply = recv(self.resp)
        if type(reply) is not list or not reply:
            raise CrossingError("malformed reply")
        if reply[0] == "v" and len(reply) == 2:
            try:
                return decode(reply[1])
            except (TypeError, ValueError, IndexError, RecursionError, OverflowError) as exc:
                raise CrossingError(f"malformed value ({type(exc).__name__}: {exc})") from None
        if reply[0] == "E" and len(reply) == 3:
            raise decode_exc(reply)
        if reply[0] == "bad" and len(reply) == 2:
            raise CrossingError(str(reply[1]))
        if reply == ["callable"]:
            return RemoteFunction(self, msg[1])
        if reply == ["module"]:
            # The tests use a module the program imported ("math.isclose" in an MBPP assert):
            # the oracle's own copy of that name, never the program's.
            return __import__(msg[1])
        raise CrossingError("malformed reply")


class RemoteFunction:
    """A function of the program, called across the pipe with plain-data arguments."""

    def __init__(self, link, name):
        self._link, self.__name__ = link, name

    def __call__(self, *args, **kwargs):
        return self._link.ask(["call", self.__name__, encode(list(args)), encode(dict(kwargs))])

    def __repr__(self):
        return f"<function {self.__name__} of the program>"


class TestGlobals(dict):
    """The tests' globals: a name neither the tests nor the builtins define is the program's,
    fetched across the pipe (a value as plain data, a function as a ``RemoteFunction``)."""

    def __init__(self, link):
        super().__init__(__name__="__main__", __builtins__=dict(builtins.__dict__))
        self._link = link

    def __missing__(self, name):
        if name in BUILTIN_NAMES or name.startswith("__"):
            raise KeyError(name)
        value = self._link.ask(["get", name])
        if isinstance(value, (RemoteFunction, type(sys))):
            self[name] = value
        return value


def ended(pid):
    """``(reason, detail)`` for a candidate that is gone, from its exit status."""
    import signal

    status = 0
    for _ in range(100):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        return "error", "the program's process closed its pipe"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return ("timeout", "CPU time limit") if sig == signal.SIGXCPU else ("killed", f"killed by signal {sig}")
    if os.WEXITSTATUS(status) == OUT_OF_MEMORY_STATUS:
        return "memory", "MemoryError: the program's process ran out of memory"
    return "error", f"the program's process exited (status {os.WEXITSTATUS(status)}) before the tests finished"


def oracle(link, spec, fd, pid):
    nonce = spec["nonce"]

    def say(msg):
        os.write(fd, (nonce + " " + msg + "\n").encode())

    def why(exc):
        return type(exc).__name__ + ": " + str(exc).replace("\n", " ")[:300]

    ns = TestGlobals(link)

    def stdio_case(text, want):
        got = link.ask(["stdio", text])
        if type(got) is not str:
            raise CrossingError("printed output is not text")
        lines = [ln.strip() for ln in got.strip().splitlines()]
        assert lines == [ln.strip() for ln in want.strip().splitlines()], "wrong output"

    def method_of(cls, name, *args, **kwargs):
        return link.ask(["method", cls, name, encode(list(args)), encode(dict(kwargs))])

    ns["_stdio_case"], ns["_method_of"] = stdio_case, method_of

    def known(names):
        # The program's functions, listed at load: the tests reach them without asking by name.
        for name in names:
            if name not in BUILTIN_NAMES and not name.startswith("__"):
                ns.setdefault(name, RemoteFunction(link, name))

    link.on_load = known
    try:
        try:
            if spec["setup"]:
                exec(compile(spec["setup"], "<tests>", "exec"), ns)
        finally:
            link.ensure_loaded()
    except LoadFailed as failed:
        exc = failed.args[0]
        if isinstance(exc, Ended):
            say(" ".join(ended(pid)))
        else:
            say(
                ("memory " if isinstance(exc, MemoryError) else "error ")
                + ("program: " if isinstance(exc, CrossingError) else "")
                + why(exc)
            )
        return
    except MemoryError as exc:
        say("memory " + why(exc))
        return
    except BaseException as exc:  # noqa: BLE001
        say("error " + why(exc))
        return
    for i, test in enumerate(spec["tests"]):
        try:
            exec(compile(test, f"<test {i}>", "exec"), ns)
        except MemoryError as exc:
            say(f"memory {i} {why(exc)}")
        except Ended:
            reason, detail = ended(pid)
            say(f"{reason} {i} {detail}")
            return
        except (AssertionError, CrossingError) as exc:
            say(f"fail {i} {why(exc)}")
        except BaseException as exc:  # noqa: BLE001
            say(f"error {i} {why(exc)}")
        else:
            say(f"ok {i}")
    say("done")


# --- start: limits, the split, privileges -------------------------------------------------------


def cap(kind, value, hard=None):
    try:
        resource.setrlimit(kind, (value, value if hard is None else hard))
    except (ValueError, OSError):
        pass


def become(uid, lim):
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    cap(resource.RLIMIT_NPROC, lim["nproc"])
    cap(resource.RLIMIT_AS, lim["as"])


def fork_candidate():
    """``os.fork()``, tried again while the machine is out of processes for a moment (EAGAIN, as
    when other runs' programs fill the process table): about a second in all, then the error."""
    delay = 0.01
    while True:
        try:
            return os.fork()
        except (BlockingIOError, MemoryError, OSError) as exc:
            if delay > 0.6 or (isinstance(exc, OSError) and exc.errno not in (11, 12)):  # EAGAIN, ENOMEM
                raise
            time.sleep(delay)
            delay *= 2


def main():
    fd = int(sys.argv[1])
    oracle_uid, candidate_uid = (None if a == "-" else int(a) for a in sys.argv[2:4])
    keys = ("cpu", "as", "nproc", "nofile", "fsize")
    lim = dict(zip(keys, map(int, sys.argv[4:9])), cwd=sys.argv[9])
    sys.set_int_max_str_digits(0)
    cap(resource.RLIMIT_CPU, lim["cpu"], lim["cpu"] + 1)
    cap(resource.RLIMIT_FSIZE, lim["fsize"])
    cap(resource.RLIMIT_NOFILE, lim["nofile"])
    cap(resource.RLIMIT_CORE, 0)
    to_cand, from_oracle = os.pipe()
    from_cand, to_oracle = os.pipe()
    pid = fork_candidate()
    if pid == 0:
        # The candidate: nothing secret has been read yet; keep only our two pipe ends.
        for f in (0, fd, from_oracle, from_cand):
            os.close(f)
        become(candidate_uid, lim)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(lim["cwd"])
        status = 0
        try:
            first = recv(to_cand)
            serve(to_cand, to_oracle, first[0], first[1])
        except MemoryError:  # while reporting: the exit status says it
            status = OUT_OF_MEMORY_STATUS
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status)
    os.close(to_cand)
    os.close(to_oracle)
    if oracle_uid is None:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace or /proc/<pid>/mem by the same uid
    become(oracle_uid, lim)
    spec = marshal.loads(sys.stdin.buffer.read())
    link = Link(from_oracle, from_cand)
    try:
        send(from_oracle, [spec["program"], bool(spec["stdio"])])
    except OSError:
        pass
    oracle(link, spec, fd, pid)
    os.close(from_oracle)
    # No wait for the candidate: it flushed its output before each reply, and the namespace (or
    # the caller's sweep of its uid) ends it with us.


if __name__ == "__main__":
    status = 0
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - the harness itself failed: say so, never as the program's result
        status = HARNESS_FAILED_STATUS
        try:
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
            os.write(2, f"\n{HARNESS_FAILED_MARK} {msg}\n".encode("utf-8", "replace"))
        except BaseException:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)
