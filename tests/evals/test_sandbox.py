"""The code sandbox against hostile programs: each runs in the real sandbox, and afterwards no
process of it remains, no file outside its folder changed, a listener on 127.0.0.1 received
nothing, the verdict is not ``pass`` and the run took at most the wall limit plus one second."""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from pathlib import Path

import pytest

from entropyrl.core.errors import UserError
from entropyrl.evals.code.sandbox import REASONS, SandboxLimits, SandboxPool, launcher, run_program

LIMITS = SandboxLimits(wall_seconds=2.0, cpu_seconds=2, memory_mb=512, processes=16)


class Listener:
    """A TCP server on 127.0.0.1 recording every connection and byte it gets."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(0.5)
            try:
                self.received.append(b"<connect>" + conn.recv(4096))
            except OSError:
                self.received.append(b"<connect>")
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture()
def listener():
    lst = Listener()
    yield lst
    lst.close()


def _processes_with(token: str) -> list[int]:
    """Live processes whose command line holds ``token``."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
        except OSError:
            continue
        if token.encode() in cmd and state != "Z" and int(pid) != os.getpid():
            out.append(int(pid))
    return out


def _processes_of_uids(uids: set[int]) -> list[int]:
    """Live processes whose real uid is one of ``uids``."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uid = int(next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1])
        if uid in uids and "State:\tZ" not in status:
            out.append(int(pid))
    return out


@pytest.fixture()
def run_uids(monkeypatch) -> set[int]:
    """The per-run uids the sandbox hands out during the test (its own runs only: other tests'
    sandboxes, on other pytest workers, have theirs)."""
    from entropyrl.evals.code import sandbox

    given: set[int] = set()
    real = sandbox.fresh_uid

    def recorded() -> int:
        uid = real()
        given.add(uid)
        return uid

    monkeypatch.setattr(sandbox, "fresh_uid", recorded)
    return given


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def hostile_programs(port: int, outside: Path, token: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (program, acceptable reasons). The tests after each are trivially true, so only
    the program's own behaviour can keep it from passing."""
    spawn = (
        f"import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)  # {token}'], "
        f"start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    )
    return {
        "infinite_loop": ("while True:\n    pass\n", {"timeout"}),
        "sleep_past_limit": ("import time\ntime.sleep(60)\n", {"timeout"}),
        "ignores_sigterm": (
            "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n",
            {"timeout"},
        ),
        "fork_storm": (
            "import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)\n",
            {"error", "timeout"},
        ),
        "large_allocation": ("x = bytearray(8 * 1024 ** 3)\n", {"memory"}),
        "output_flood": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", {"output_limit"}),
        "write_outside": (
            f"open({str(outside / 'planted.txt')!r}, 'w').write('owned')\n"
            f"open({str(outside / 'keep.txt')!r}, 'w').write('owned')\n",
            {"error"},
        ),
        "write_tmp_then_exit": (f"open('/tmp/escape-{token}', 'w').write('owned')\nimport os\nos._exit(0)\n", {"error"}),
        "connect_listener": (
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'secret')\n",
            {"error"},
        ),
        "detached_child": (spawn + "import os\nos._exit(0)\n", {"error"}),
        "detached_child_then_loop": (spawn + "while True:\n    pass\n", {"timeout"}),
        "os_exit_before_tests": ("import os\nos._exit(0)\n", {"error"}),
        "sys_exit_before_tests": ("import sys\nsys.exit(0)\n", {"error"}),
        "kill_parent": (
            "import os, signal\n"
            "for pid in (os.getppid(), 1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError:\n"
            "        pass\n"
            "os._exit(0)\n",
            {"error", "killed"},
        ),  # killed: getppid() is 0 as a namespace's pid 1
        "segfault": ("import ctypes\nctypes.string_at(0)\n", {"killed"}),
        "forge_marker": (
            "import os\nfor fd in range(3, 20):\n    try:\n"
            "        os.write(fd, b'ok 0\\ndone\\n')\n    except OSError:\n        pass\n"
            "os._exit(0)\n",
            {"error"},
        ),
        "poison_builtins": (
            "import builtins\nbuiltins.exec = lambda *a, **k: None\n__builtins__['exec'] = lambda *a, **k: None\n",
            {"fail"},
        ),
    }


HOSTILE = sorted(hostile_programs(0, Path("/x"), "t"))


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_program_changes_nothing(name, listener, tmp_path, run_uids):
    token = secrets.token_hex(8)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("original")
    program, reasons = hostile_programs(listener.port, outside, token)[name]
    before = _snapshot(outside)
    tests = ["assert False, 'tests ran'"] if name == "poison_builtins" else ["assert True"]
    started = time.perf_counter()
    result = run_program(program, tests, LIMITS)
    took = time.perf_counter() - started
    time.sleep(0.3)  # let the listener see a late connection

    assert result.reason in reasons, (result.reason, result.detail, result.stdout_tail[-300:])
    assert not result.passed and result.reason in REASONS
    assert took <= LIMITS.wall_seconds + 1.0, took
    assert _processes_with(token) == []
    if os.geteuid() == 0:  # the run's own uids: nothing of it is left
        assert _processes_of_uids(run_uids) == []
    assert _snapshot(outside) == before
    assert (outside / "keep.txt").read_text() == "original"
    assert not Path(f"/tmp/escape-{token}").exists()
    assert listener.received == []


def test_passing_and_failing_programs_and_partial_credit():
    ok = run_program("def f(x):\n    return x + 1\n", ["assert f(1) == 2", "assert f(2) == 3"], LIMITS)
    assert (ok.passed, ok.reason, ok.tests_passed, ok.tests_total) == (True, "pass", 2, 2)
    half = run_program("def f(x):\n    return 2\n", ["assert f(1) == 2", "assert f(2) == 3"], LIMITS)
    assert (half.passed, half.reason, half.tests_passed, half.fraction) == (False, "fail", 1, 0.5)
    bad = run_program("def f(x) return 1", ["assert f(1) == 1"], LIMITS)
    assert bad.reason == "error" and "SyntaxError" in bad.detail
    printed = run_program("print('hello from the program')", ["assert True"], LIMITS)
    assert printed.passed and "hello from the program" in printed.stdout_tail
    # The caller's secrets are not in the environment.
    os.environ["ENTROPYRL_TEST_SECRET"] = "s3cret"
    try:
        env = run_program(
            "import os\nassert 'ENTROPYRL_TEST_SECRET' not in os.environ, 'leaked'\n"
            "assert not any('s3cret' in v for v in os.environ.values())",
            ["pass"],
            LIMITS,
        )
    finally:
        del os.environ["ENTROPYRL_TEST_SECRET"]
    assert env.passed, env.detail


def _harness_whose_fork_fails(times: int) -> bytes:
    """The sandbox's harness, with its ``os.fork`` failing (EAGAIN, the machine out of processes)
    the first ``times`` calls in its process."""
    import marshal

    from entropyrl.evals.code import sandbox

    flaky = (
        f"import os as _os\n_real_fork, _fails = _os.fork, [{times}]\n"
        "def _fork():\n"
        "    if _fails[0] > 0:\n"
        "        _fails[0] -= 1\n"
        "        raise BlockingIOError(11, 'Resource temporarily unavailable')\n"
        "    return _real_fork()\n"
        "_os.fork = _fork\n"
    )
    return marshal.dumps(compile(flaky + sandbox.HARNESS, "<harness>", "exec"))


def test_a_harness_that_cannot_start_the_program_is_a_sandbox_error_not_the_programs(monkeypatch):
    from entropyrl.evals.code import sandbox

    program, tests = "def f(x):\n    return x + 1\n", ["assert f(1) == 2"]
    monkeypatch.setattr(sandbox, "HARNESS_CODE", _harness_whose_fork_fails(2))  # a moment: tried again
    assert run_program(program, tests, LIMITS).reason == "pass"
    monkeypatch.setattr(sandbox, "HARNESS_CODE", _harness_whose_fork_fails(1000))
    broken = run_program(program, tests, LIMITS)
    assert (broken.reason, broken.passed) == ("sandbox_error", False), broken
    assert "harness failed" in broken.detail and "BlockingIOError" in broken.detail, broken.detail
    # a call of the code interpreter says the interpreter failed, and why; the code is not blamed
    from entropyrl.evals.code.tool_executor import SandboxToolExecutor

    (call,) = SandboxToolExecutor(LIMITS, workers=1, launch="fresh")(["print(1)"])  # the zygote's: test_zygote.py
    assert call.reason == "sandbox_error" and "BlockingIOError" in call.output, call


def test_the_pool_runs_a_sandbox_error_once_more(monkeypatch):
    from entropyrl.evals.code import sandbox

    calls = []
    real = sandbox.run_program

    def flaky_once(program, *args, **kwargs):
        calls.append(program)
        if len(calls) == 1:
            return sandbox.SandboxResult(False, "sandbox_error", 0.0, detail="the sandbox's harness failed")
        return real(program, *args, **kwargs)

    monkeypatch.setattr(sandbox, "run_program", flaky_once)
    pool = SandboxPool(workers=1, limits=LIMITS)
    (r,) = pool.map([sandbox.Job("v = 1", ("assert v == 1",))])
    assert r.passed and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(
        sandbox,
        "run_program",
        lambda *a, **k: calls.append(1) or sandbox.SandboxResult(False, "sandbox_error", 0.0, detail="down"),
    )
    (r,) = pool.map([sandbox.Job("v = 1", ("assert v == 1",))])
    assert (r.reason, r.detail, len(calls)) == ("sandbox_error", "down", 2)  # twice, then the failure is the result


def test_no_network_and_read_only_filesystem_under_bwrap():
    if launcher("auto") != "bwrap":
        pytest.skip("bubblewrap is not usable here (the sandbox warned and fell back)")
    net = run_program("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)", ["pass"], LIMITS)
    assert net.reason == "error" and "OSError" in net.detail or "Network" in net.detail, net.detail
    ro = run_program("open('/usr/entropyrl-sandbox-x.txt', 'w')", ["pass"], LIMITS)  # bound read-only
    assert ro.reason == "error" and ("Read-only" in ro.detail or "Permission" in ro.detail), ro.detail
    assert not Path("/usr/entropyrl-sandbox-x.txt").exists()
    # the caller's folder is read-only inside, or not there at all (bwrap hides /tmp, /root, /home)
    here = Path.cwd() / "x.txt"
    cwd = run_program(f"open({str(here)!r}, 'w')", ["pass"], LIMITS)
    assert cwd.reason == "error" and any(w in cwd.detail for w in ("Read-only", "Permission", "No such file")), cwd.detail
    assert not here.exists()
    own = run_program("open('out.txt', 'w').write('mine')\nassert open('out.txt').read() == 'mine'", ["pass"], LIMITS)
    assert own.passed, own.detail


def test_pool_runs_in_parallel_and_keeps_order():
    pool = SandboxPool(workers=2, limits=LIMITS)
    jobs_src = [f"v = {i}" for i in range(6)]
    from entropyrl.evals.code.sandbox import Job

    results = pool.map([Job(src, (f"assert v == {i}",)) for i, src in enumerate(jobs_src)] + [Job("v = 0", ("assert v == 1",))])
    assert [r.passed for r in results] == [True] * 6 + [False]


def test_bad_limits_are_one_line_errors():
    with pytest.raises(UserError, match="unknown sandbox key 'wall'"):
        SandboxLimits.from_cfg({"wall": 3})
    with pytest.raises(UserError, match="isolation"):
        SandboxLimits.from_cfg({"isolation": "docker"})


@pytest.mark.parametrize("name", ["connect_listener", "detached_child", "sleep_past_limit", "kill_parent"])
def test_unshare_fallback_still_contains_network_and_processes(name, listener, tmp_path):
    from entropyrl.evals.code.sandbox_launch import _probe

    if not _probe("unshare"):
        pytest.skip("unshare cannot create namespaces here")
    limits = SandboxLimits(wall_seconds=2.0, cpu_seconds=2, memory_mb=512, processes=16, isolation="unshare")
    token = secrets.token_hex(8)
    program, reasons = hostile_programs(listener.port, tmp_path, token)[name]
    started = time.perf_counter()
    with _no_fail():
        result = run_program(program, ["assert True"], limits)
    took = time.perf_counter() - started
    time.sleep(0.3)
    assert result.reason in reasons and took <= limits.wall_seconds + 1.0, (result.reason, result.detail, took)
    assert _processes_with(token) == [] and listener.received == []


class _no_fail:
    """A context that lets the fallback's warning through (it is expected here)."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def test_run_folder_is_bounded_under_bwrap():
    if launcher("auto") != "bwrap":
        pytest.skip("bubblewrap is not usable here")
    limits = SandboxLimits(wall_seconds=5.0, disk_mb=4, file_size_mb=16)
    fill = run_program("for i in range(8):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n", ["pass"], limits)
    assert fill.reason == "error" and "No space left" in fill.detail, fill.detail


def test_no_namespace_fallback_as_root_refuses_or_runs_unprivileged():
    from entropyrl.evals.code.sandbox_launch import _others_can_run_python

    limits = SandboxLimits(wall_seconds=3.0, isolation="none")
    if os.geteuid() == 0 and not _others_can_run_python():
        with pytest.raises(UserError, match="refusing to run untrusted programs as root"):
            SandboxPool(workers=1, limits=limits)
    else:
        with _no_fail():
            result = run_program("import os\nassert os.getuid() != 0", ["pass"], limits)
        assert result.passed, result.detail
