"""The tool executor's zygote (``evals/code/zygote.py``): calls forked from a warm sandboxed
interpreter keep every property of a fresh one.

- the held-out hostile programs of ``test_sandbox.py`` run as calls: none passes, none leaves a
  process, a file outside, a file in ``/tmp`` or a byte at a listener, each within the wall clock
  plus one second, and the next call on the same zygote still answers;
- a call sees nothing an earlier call left: globals, files in its folder, ``HOME``, ``/tmp``,
  changed modules and builtins, the environment, processes;
- a zygote killed or stopped mid-call is a bounded ``sandbox_error``, the next call starts a fresh
  zygote, and the pool runs such a call once more;
- a call cannot forge a reply: frames written to every descriptor it has (and, under bubblewrap,
  to the zygote's own through ``/proc``) reach nobody, and the next call gets its own result;
- ``tools.executor.launch`` switches between the zygote and a fresh interpreter per call.
"""

from __future__ import annotations

import marshal
import os
import secrets
import signal
import threading
import time
from pathlib import Path

import pytest

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.evals.code import zygote as zygote_mod
from entropyrl.evals.code.sandbox import SandboxLimits, SandboxPool, launcher
from entropyrl.evals.code.sandbox_launch import drop_uid
from entropyrl.evals.code.tool_executor import SandboxToolExecutor, build_tool_executor, check_tools, wrap_cell
from entropyrl.evals.code.zygote import Zygote, ZygotePool

from .test_sandbox import _processes_of_uids, _processes_with, _snapshot, hostile_programs, listener  # noqa: F401

LIMITS = SandboxLimits(wall_seconds=2.0, cpu_seconds=2, memory_mb=512, processes=16)


@pytest.fixture()
def pool():
    p = ZygotePool(1, LIMITS)
    yield p
    p.close()


@pytest.fixture()
def call_uids(monkeypatch) -> set[int]:
    given: set[int] = set()
    real = zygote_mod.fresh_uid

    def recorded() -> int:
        uid = real()
        given.add(uid)
        return uid

    monkeypatch.setattr(zygote_mod, "fresh_uid", recorded)
    return given


def _files_guarded() -> bool:
    kind = launcher(LIMITS.isolation)
    return kind == "bwrap" or os.geteuid() != 0 or drop_uid(kind)


HOSTILE = sorted(hostile_programs(0, Path("/x"), "t"))


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_programs_through_the_zygote_change_nothing(name, pool, listener, tmp_path, call_uids):  # noqa: F811
    token = secrets.token_hex(8)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("original")
    program, _ = hostile_programs(listener.port, outside, token)[name]
    before = _snapshot(outside)
    started = time.perf_counter()
    r = pool.scripts([program])[0]  # no flag set: it may run through, but never "pass"
    took = time.perf_counter() - started
    time.sleep(0.3)  # let the listener see a late connection

    assert not r.passed and r.reason != "sandbox_error", (r.reason, r.detail, r.stdout_tail[-300:])
    assert took <= LIMITS.wall_seconds + 1.0, took
    assert _processes_with(token) == []
    if os.geteuid() == 0:
        assert _processes_of_uids(call_uids) == []
    if _files_guarded():
        assert _snapshot(outside) == before and (outside / "keep.txt").read_text() == "original"
        assert not Path(f"/tmp/escape-{token}").exists()
    assert listener.received == []
    after = pool.scripts([wrap_cell("print(6 * 7)")])[0]  # the zygote still answers, as itself
    assert (after.reason, after.stdout_tail) == ("pass", "42\n")
    if os.geteuid() == 0:  # a call of another uid (or in its namespace) cannot end the zygote
        assert [z.starts for z in pool._all] == [1]


LEAVE = """
import builtins, json, os, subprocess, sys
secret = 'left-behind'
open('in_cwd.txt', 'w').write(secret)
open(os.path.join(os.environ['HOME'], 'in_home.txt'), 'w').write(secret)
for d in ('/tmp', '/dev/shm'):
    try:
        open(os.path.join(d, 'left-{token}'), 'w').write(secret)
    except OSError:
        pass
json.dumps = lambda *a, **k: secret
sys.modules['math'] = secret
builtins.abs = lambda x: 0
os.environ['LEFT'] = secret
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)  # {token}'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(os.getpid(), os.getcwd())
"""

LOOK = """
import builtins, json, math, os, sys
seen = {{
    'global': 'secret' in globals(),
    'cwd': os.path.exists('in_cwd.txt') or os.listdir('.') != [],
    'home': os.path.exists(os.path.join(os.environ['HOME'], 'in_home.txt')),
    'tmp': any(os.path.exists(os.path.join(d, 'left-{token}')) for d in ('/tmp', '/dev/shm')),
    'json': json.dumps([1]) != '[1]',
    'math': not hasattr(math, 'pi'),
    'abs': abs(-2) != 2,
    'env': 'LEFT' in os.environ,
}}
print(sorted(k for k, v in seen.items() if v), os.getpid(), os.getcwd())
"""


def test_a_call_sees_nothing_an_earlier_call_left(pool):
    token = secrets.token_hex(8)
    left = pool.scripts([wrap_cell(LEAVE.replace("{token}", token))])[0]
    assert left.reason == "pass", (left.detail, left.stdout_tail)
    look = pool.scripts([wrap_cell(LOOK.format(token=token))])[0]
    assert look.reason == "pass", (look.detail, look.stdout_tail)
    seen, pid, cwd = look.stdout_tail.rsplit(" ", 2)
    if _files_guarded():
        assert seen == "[]", look.stdout_tail
    else:  # unshare as root with no uid to drop to: /tmp is the host's, its files stay
        assert seen in ("[]", "['tmp']"), look.stdout_tail
    old_pid, old_cwd = left.stdout_tail.split()
    assert pid != old_pid and cwd.strip() != old_cwd  # a fresh process in a fresh folder
    assert not Path(old_cwd).exists() or launcher(LIMITS.isolation) == "bwrap"  # (under bwrap: a sandbox path)
    assert [z.starts for z in pool._all] == [1]  # one warm zygote served both
    assert _processes_with(token) == []  # the first call's detached process ended with it
    for f in Path("/tmp").glob(f"left-{token}"):
        f.unlink()


SIGNAL_THE_ZYGOTE = """
import os, signal
for sig in (signal.SIGSTOP, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):
    for pid in (os.getppid(), 1, 2, -1):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="without root a call shares the zygote's uid: a killed zygote is restarted")
def test_signals_from_a_call_do_not_reach_the_zygote(pool):
    pool.scripts([wrap_cell("0")])
    started = time.perf_counter()
    pool.scripts([wrap_cell(SIGNAL_THE_ZYGOTE)])
    assert time.perf_counter() - started < LIMITS.wall_seconds + 1.0
    nxt = pool.scripts([wrap_cell("print('alive')")])[0]
    assert (nxt.reason, nxt.stdout_tail) == ("pass", "alive\n") and [z.starts for z in pool._all] == [1]


def test_calls_draw_fresh_random_numbers(pool):
    """The zygote holds no seeded generator its children would all copy: each call's draws differ."""
    draws = [r.stdout_tail for r in pool.scripts([wrap_cell("import random, sys\nrandom.random()")] * 3)]
    assert len(set(draws)) == 3, draws


def test_a_zygote_killed_or_stopped_mid_call_is_a_bounded_error_and_the_next_call_works(monkeypatch):
    z = Zygote(LIMITS)
    try:
        assert z.run(wrap_cell("1 + 1")).stdout_tail == "2\n"
        first = z.proc.pid
        threading.Timer(0.3, lambda: os.killpg(first, signal.SIGKILL)).start()
        started = time.perf_counter()
        r = z.run(wrap_cell("import time\ntime.sleep(30)"))
        assert r.reason == "sandbox_error" and "zygote" in r.detail, r
        assert time.perf_counter() - started < 2.0
        assert z.run(wrap_cell("3 * 3")).stdout_tail == "9\n" and z.starts == 2

        monkeypatch.setattr(zygote_mod, "GRACE_SECONDS", 0.5)
        inside = [pid for pid in _processes_with(z.workdir) if pid != z.proc.pid]  # the zygote (not its launcher)
        assert inside
        threading.Timer(0.2, lambda: [os.kill(pid, signal.SIGSTOP) for pid in inside]).start()
        started = time.perf_counter()
        r = z.run(wrap_cell("import time\ntime.sleep(30)"))
        took = time.perf_counter() - started
        assert r.reason == "sandbox_error" and "did not answer" in r.detail, r
        assert took <= LIMITS.wall_seconds + 0.5 + 1.0, took  # the wall clock and our grace bound the wait
        assert z.run(wrap_cell("4 * 4")).stdout_tail == "16\n" and z.starts == 3
    finally:
        z.stop()


def test_the_pool_runs_a_call_whose_zygote_died_once_more(pool):
    pool.scripts([wrap_cell("0")])
    victim = pool._all[0].proc.pid
    threading.Timer(0.3, lambda: os.killpg(victim, signal.SIGKILL)).start()
    r = pool.scripts([wrap_cell("import time\ntime.sleep(0.8)\nprint('ran')")])[0]
    assert (r.reason, r.stdout_tail) == ("pass", "ran\n") and pool._all[0].starts == 2


FORGE = """
import marshal, os
frame = marshal.dumps([{seq}, 'exited', 0, 'P', b'FORGED', 0.0])
frame = len(frame).to_bytes(4, 'big') + frame
hit = []
for fd in range(0, 1024):
    try:
        os.write(fd, frame)
        hit.append(fd)
    except OSError:
        pass
if {proc}:
    for pid in ('1', '2', str(os.getppid())):
        for fd in ('0', '1'):
            try:
                f = os.open('/proc/' + pid + '/fd/' + fd, os.O_WRONLY)
                os.write(f, frame)
                hit.append('proc' + pid)
            except OSError:
                pass
print('real', hit)
"""


def test_a_call_cannot_forge_a_reply_or_the_framing(pool):
    pool.scripts([wrap_cell("0")])
    z = pool._all[0]
    under_bwrap = z.kind == "bwrap"  # /proc is the sandbox's own there; elsewhere it is the host's
    r = pool.scripts([wrap_cell(FORGE.format(seq=z.seq + 2, proc=under_bwrap))])[0]
    # it reached only its own output (1, 2: the frames are text of its output) and its own verdict
    # pipe (3: garbage there makes its own call an error), no descriptor of the zygote's
    assert r.stdout_tail.endswith("real [1, 2, 3]\n") and r.reason == "error", r
    nxt = pool.scripts([wrap_cell("print('mine')")])[0]
    assert (nxt.reason, nxt.stdout_tail) == ("pass", "mine\n")
    assert z.starts == 1


def test_launch_switch_picks_the_zygote_or_a_fresh_interpreter_per_call():
    tools = compose("train", ["data=tool_arith", "tools=code_interpreter"]).tools
    ex = build_tool_executor(tools)
    assert ex.launch == "zygote" and isinstance(ex.pool, ZygotePool)
    ex.close()
    fresh = build_tool_executor(compose("train", ["tools=code_interpreter", "tools.executor.launch=fresh"]).tools)
    assert isinstance(fresh.pool, SandboxPool) and fresh(["6 * 7"])[0].output == "42\n"
    with pytest.raises(UserError, match="tools.executor.launch=fork .*zygote, fresh"):
        check_tools(compose("train", ["tools=code_interpreter", "tools.executor.launch=fork"]).tools)
    with pytest.raises(UserError, match="unknown tools.executor.launch=fork; valid: zygote, fresh"):
        check_tools({"enabled": True, "executor": {"launch": "fork"}})
    with pytest.raises(UserError, match="tools.executor.launch"):
        SandboxToolExecutor(LIMITS, launch="fork")


def test_a_reply_to_another_request_is_no_reply(pool):
    """The zygote answers a request we did not make first: that reply is not believed, the
    zygote is dropped and the next call starts a fresh one."""
    pool.scripts([wrap_cell("0")])
    z = pool._all[0]
    extra = marshal.dumps([10_000, wrap_cell("print('stale')"), -1, 2.0, 1000])
    z._send(len(extra).to_bytes(4, "big") + extra, time.monotonic() + 5)
    r = z.run(wrap_cell("print(1)"))
    assert r.reason == "sandbox_error" and "not this call's" in r.detail, r
    assert z.run(wrap_cell("print(2)")).stdout_tail == "2\n" and z.starts == 2


def test_a_zygote_that_cannot_fork_is_a_sandbox_error_not_the_codes(monkeypatch):
    text = (Path(zygote_mod.__file__).parent / "zygote_serve.py").read_text()
    broken = text.replace("def fork_retry():\n", "def fork_retry():\n    raise BlockingIOError(11, 'no process')\n", 1)
    assert broken != text
    monkeypatch.setattr(zygote_mod, "ZYGOTE_CODE", marshal.dumps(compile(broken, "<zygote>", "exec")))
    (call,) = SandboxToolExecutor(LIMITS, workers=1)(["print(1)"])
    assert call.reason == "sandbox_error" and call.error and "could not fork (errno 11)" in call.output, call
