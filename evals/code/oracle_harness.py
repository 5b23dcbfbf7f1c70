"""The program run inside the sandbox (``python -I -S -c <this file>``): never imported by the package.

It splits itself in two before reading anything secret: the **candidate** process (a fork that
drops to its own uid, keeps only two pipes and then runs the untrusted program) and the **oracle**
(drops to another uid, reads the spec, runs the benchmark's tests and alone holds the result pipe
and the nonce). The tests see the program only through ``Remote*`` proxies: each call crosses a
pipe as plain data and is rebuilt here from a closed set of builtin types, so no object of the
program ever reaches the tests' ``==``. argv: result fd, oracle uid, candidate uid (``-`` = keep).
"""

import builtins
import json
import marshal
import os
import resource
import sys
import time

MAX_REPLY = 32 << 20
BUILTIN_NAMES = frozenset(builtins.__dict__)
EXCEPTIONS = {k: v for k, v in builtins.__dict__.items()
              if isinstance(v, type) and issubclass(v, Exception) and not issubclass(v, Warning)}


class CrossingError(Exception):
    """A value or a message that cannot cross between the two processes (a typed ``fail``)."""


class Ended(CrossingError):
    """The candidate's process is gone (exited, killed, out of CPU time)."""


class CandidateError(Exception):
    """An exception of a type the program defined itself, rebuilt by name and message."""


# --- plain data: encode exactly-typed builtin values, decode into fresh builtin values -----------

def encode(x, depth=0):
    if depth > 200:
        raise CrossingError("value nested deeper than 200 levels")
    t = type(x)
    if x is None:
        return None
    if t is bool:
        return x
    if t is int:
        return ["i", hex(x)]
    if t is float:
        return ["f", x.hex()]
    if t is complex:
        return ["c", x.real.hex(), x.imag.hex()]
    if t is str:
        return ["s", x]
    if t is bytes:
        return ["b", x.hex()]
    if t in (list, tuple, set, frozenset):
        return [{list: "l", tuple: "t", set: "S", frozenset: "F"}[t], [encode(v, depth + 1) for v in x]]
    if t is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]]
    raise CrossingError(f"a value of type {t.__name__} cannot cross the process boundary (plain data only)")


def decode(x):
    if x is None or x is True or x is False:
        return x
    if type(x) is not list or not x or type(x[0]) is not str:
        raise CrossingError("malformed value")
    tag = x[0]
    if tag == "i":
        return int(x[1], 16)
    if tag == "f":
        return float.fromhex(x[1])
    if tag == "c":
        return complex(float.fromhex(x[1]), float.fromhex(x[2]))
    if tag == "s" and type(x[1]) is str:
        return x[1]
    if tag == "b":
        return bytes.fromhex(x[1])
    if tag in ("l", "t", "S", "F") and type(x[1]) is list:
        items = [decode(v) for v in x[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d" and type(x[1]) is list:
        return {decode(k): decode(v) for k, v in x[1]}
    raise CrossingError("malformed value")


def encode_exc(exc):
    return ["E", type(exc).__name__, str(exc)[:2000]]


def decode_exc(msg):
    name, text = str(msg[1]), str(msg[2])
    cls = EXCEPTIONS.get(name)
    return cls(text) if cls is not None else CandidateError(f"{name}: {text}")


# --- framing: 4-byte length, then JSON ---------------------------------------------------------

def send(fd, obj):
    data = json.dumps(obj).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def recv(fd, limit=MAX_REPLY):
    head = _read(fd, 4)
    size = int.from_bytes(head, "big")
    if size > limit:
        raise CrossingError(f"reply of {size} bytes is over the {limit}-byte limit")
    return json.loads(_read(fd, size))


def _read(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise Ended("the program's process ended")
        buf += chunk
    return buf


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
        reply = ["ok"]
    except BaseException as exc:  # noqa: BLE001 - reported, the oracle decides
        reply = encode_exc(exc)
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
                reply = ["callable"] if callable(obj) else ["v", encode(obj)]
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

class Link:
    """The oracle's end of the two pipes to the candidate."""

    def __init__(self, req, resp):
        self.req, self.resp = req, resp

    def ask(self, msg):
        try:
            send(self.req, msg)
        except OSError:
            raise Ended("the program's process ended") from None
        try:
            reply = recv(self.resp)
        except (ValueError, RecursionError) as exc:
            raise CrossingError(f"malformed reply ({type(exc).__name__})") from None
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
        if isinstance(value, RemoteFunction):
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
    try:
        loaded = recv(link.resp)
        if loaded != ["ok"]:
            raise decode_exc(loaded) if type(loaded) is list and len(loaded) == 3 else CrossingError("bad load")
        if spec["setup"]:
            exec(compile(spec["setup"], "<tests>", "exec"), ns)
    except MemoryError as exc:
        say("memory " + why(exc))
        return
    except Ended:
        say("%s %s" % ended(pid))
        return
    except CrossingError as exc:
        say("error program: " + why(exc))
        return
    except BaseException as exc:  # noqa: BLE001
        say("error " + why(exc))
        return
    for i, test in enumerate(spec["tests"]):
        try:
            exec(compile(test, "<test %d>" % i, "exec"), ns)
        except MemoryError as exc:
            say("memory %d %s" % (i, why(exc)))
        except Ended:
            reason, detail = ended(pid)
            say("%s %d %s" % (reason, i, detail))
            return
        except (AssertionError, CrossingError) as exc:
            say("fail %d %s" % (i, why(exc)))
        except BaseException as exc:  # noqa: BLE001
            say("error %d %s" % (i, why(exc)))
        else:
            say("ok %d" % i)
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


def main():
    fd = int(sys.argv[1])
    oracle_uid, candidate_uid = (None if a == "-" else int(a) for a in sys.argv[2:4])
    lim = json.loads(sys.argv[4])
    sys.set_int_max_str_digits(0)
    cap(resource.RLIMIT_CPU, lim["cpu"], lim["cpu"] + 1)
    cap(resource.RLIMIT_FSIZE, lim["fsize"])
    cap(resource.RLIMIT_NOFILE, lim["nofile"])
    cap(resource.RLIMIT_CORE, 0)
    to_cand, from_oracle = os.pipe()
    from_cand, to_oracle = os.pipe()
    pid = os.fork()
    if pid == 0:
        # The candidate: nothing secret has been read yet; keep only our two pipe ends.
        for f in (0, fd, from_oracle, from_cand):
            os.close(f)
        become(candidate_uid, lim)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(lim["cwd"])
        try:
            first = recv(to_cand)
            serve(to_cand, to_oracle, first[0], first[1])
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(0)
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
    # The candidate ends on the closed pipe (flushing what it printed); wait briefly for it.
    for _ in range(50):
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
        time.sleep(0.01)


if __name__ == "__main__":
    try:
        main()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0)
