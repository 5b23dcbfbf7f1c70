"""Every wait on a helper process is bounded: a text-metrics worker or a grading zygote that is
killed or stopped (SIGSTOP: a paused process) at its wait gives the caller a result within the
bound, never a hang. The processes are real; the signals are sent to them here."""

from __future__ import annotations

import os
import signal
import time

import pytest

from entropyrl.evals.grading import grader_pool
from entropyrl.evals.reflection import matcher_for
from entropyrl.rewards import text_facts
from entropyrl.rewards.text_facts import TextFactsPool, TextFactsSpec

TEXTS = ["wait, let me check: 2+2=4", "so 5", "hmm, actually 7 wait", "done", "but wait 9"]
SPEC = TextFactsSpec(matcher_for(("wait", "hmm", "actually")), 4, 1)


def _serving_pool():
    """``(want, said, pool)``: a one-worker text-facts pool that has answered one batch correctly, the
    batch's facts computed in this process, and the list the pool's lines go to."""
    want = TextFactsPool(0).submit(TEXTS, TextFactsSpec(SPEC.matcher, 4, 0)).result()
    said: list[str] = []
    pool = TextFactsPool(1, log=said.append)
    try:
        assert pool.submit(TEXTS, SPEC).result().counts.tolist() == want.counts.tolist()  # serving
    except BaseException:
        pool.close()
        raise
    return want, said, pool


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_text_metrics_worker_gone_at_its_wait_leaves_the_part_to_this_process(monkeypatch, how):
    monkeypatch.setattr(text_facts, "WAIT_SECONDS", 2.0)
    want, said, pool = _serving_pool()
    try:
        worker = pool._procs[0].proc
        os.kill(worker.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        start = time.monotonic()
        got = pool.submit(TEXTS, SPEC).result()  # the worker never answers
        assert time.monotonic() - start < 30
        assert got.counts.tolist() == want.counts.tolist() and pool.failures == 1 and pool.restart
        assert len(said) == 1 and ("no answer within 2 s" if how == "stopped" else "the worker ended") in said[0], said
        again = pool.submit(TEXTS, SPEC).result()  # started afresh
        assert again.counts.tolist() == want.counts.tolist() and pool.failures == 1
        assert worker.poll() is not None  # the stopped one was ended, not left behind
    finally:
        pool.close()


def test_a_text_metrics_worker_dead_before_the_send_is_said_as_ended_and_its_part_done_here():
    """The other side of the killed worker's race: the worker is gone (reaped) before the batch is
    handed over, so the send fails, not the receive; the part is computed here and said the same way."""
    want, said, pool = _serving_pool()
    try:
        worker = pool._procs[0].proc
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)  # dead and its socket end closed before the next send
        got = pool.submit(TEXTS, SPEC).result()
        assert got.counts.tolist() == want.counts.tolist() and pool.failures == 1 and pool.restart
        assert len(said) == 1 and "the worker ended (BrokenPipeError" in said[0], said
    finally:
        pool.close()


def test_a_stopped_grading_zygote_is_replaced_not_waited_on_for_ever(monkeypatch):
    monkeypatch.setattr(grader_pool, "SPAWN_TIMEOUT", 3.0)
    pool = grader_pool.GradingPool(1)
    done: dict[int, tuple[bool, str]] = {}
    try:
        pool.run([("1/2", "0.5")], 20.0, lambda i, ok, why: done.__setitem__(i, (ok, why)))
        assert done[0] == (True, "math_verify_match")
        zygote = pool._zygote.proc
        os.kill(zygote.pid, signal.SIGSTOP)  # alive, never answering
        os.kill(pool._workers[0].pid, signal.SIGKILL)  # its next worker has to come from the zygote
        done.clear()
        start = time.monotonic()
        pool.run([("3", "3"), ("2", "3")], 20.0, lambda i, ok, why: done.__setitem__(i, (ok, why)))
        assert time.monotonic() - start < 90
        assert done[1] == (False, "math_verify_mismatch") and 0 in done
        assert zygote.poll() is not None and pool._zygote.proc is not zygote
    finally:
        pool.close()


def test_grade_whose_grading_processes_cannot_run_ends_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import json

    from entropyrl.cli.app import run

    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"response": "so \\boxed{1/2}", "answer": "0.5"}) + "\n")
    grader_pool.shutdown_pool()  # the shared pool's zygote would serve this test otherwise
    monkeypatch.setattr(grader_pool, "_ZYGOTE_ENTRY", "os:_exit")  # it dies at once
    try:
        with pytest.raises(SystemExit) as code:
            run(["grade", str(src), "--out", str(dst), "--workers", "1"])
    finally:
        grader_pool.shutdown_pool()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code.value.code == 2 and len(errors) == 1, errors
    assert "grading stopped after 0 line(s): the grading process failed to start" in errors[0]
    assert not dst.exists()
