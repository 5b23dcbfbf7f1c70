"""A rank of a data-parallel run that dies or stalls: the others end within
``trainer.collective_timeout_s`` in one ``error:`` line (trainers/parallel/process_group.py
``peer_failure``), keeping the steps already logged and a FAILED summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

CLI_MODULE = "entropyrl.cli.main"


def test_a_collective_that_lost_its_peer_is_one_line():
    from entropyrl.core.errors import UserError
    from entropyrl.trainers.parallel.distributed import DistInfo, peer_failure

    info = DistInfo(rank=0, world_size=2)
    closed = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:8395. "
        "This is typically caused by a remote worker crashing."
    )
    error = peer_failure(closed, info, 600.0, step=3, saved_step=0)
    assert isinstance(error, UserError)
    text = str(error)
    assert "rank 0 of 2" in text and "Connection closed by peer" in text and "pair.cc" not in text
    assert "another rank's process ended" in text and "steps 1-2 are in metrics.jsonl" in text and "\n" not in text
    stalled = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
        "Timed out waiting 10000ms for send operation to complete"
    )
    assert "trainer.collective_timeout_s=10" in str(peer_failure(stalled, info, 10.0, step=2))
    # not a collective's failure, or one process: left to the other handlers
    assert peer_failure(RuntimeError("shape mismatch"), info, 600.0) is None
    assert peer_failure(closed, DistInfo(rank=0, world_size=1), 600.0) is None


def test_a_peer_lost_before_the_first_step_is_one_line_too(monkeypatch):
    """Set-up and resume take part in collectives as a step does: a rank lost there ends the others
    in the same one line, naming the phase; any other error passes through as it is."""
    from entropyrl.conf import compose
    from entropyrl.core.errors import UserError
    from entropyrl.trainers.run.bookkeeping import lost_peer_is_one_line

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = compose("train", ["trainer.collective_timeout_s=30"])
    closed = RuntimeError("[/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:8395. Typically a crash.")
    for during in ("during set-up", "before its first step"):
        with pytest.raises(UserError) as raised:
            with lost_peer_is_one_line(cfg, during):
                raise closed
        text = str(raised.value)
        assert text.startswith(f"rank 1 of 2: a collective with the other ranks failed {during} (Connection closed by peer")
        assert "pair.cc" not in text and "\n" not in text and raised.value.__suppress_context__
    stalled = RuntimeError("[/gloo/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete")
    with pytest.raises(UserError, match=r"before its first step .*trainer.collective_timeout_s=30 s"):
        with lost_peer_is_one_line(cfg, "before its first step"):
            raise stalled
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with lost_peer_is_one_line(cfg, "during set-up"):
            raise RuntimeError("shape mismatch")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(RuntimeError, match="Connection closed"):  # one process: nothing to blame on a peer
        with lost_peer_is_one_line(cfg, "during set-up"):
            raise closed


@pytest.mark.slow
def test_rank_killed_mid_run_ends_the_other_in_one_line(tmp_path, free_port, child_env):
    """Two ranks started by hand (no torchrun agent to stop the survivor): kill -9 rank 1 once a
    step is logged; rank 0 exits with one ``error:`` line naming the other rank, no traceback,
    and its metrics.jsonl rows and a FAILED summary stay."""
    run = tmp_path / "run"
    args = [
        "trainer.total_steps=500",
        "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=2",
        "val.prompts=0",
        "trainer.progress=false",
        "tracking.enabled=false",
        "trainer.collective_timeout_s=20",
        f"output_dir={run}",
    ]
    base = {**child_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = []
    for rank in (0, 1):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", CLI_MODULE, "train", *args],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    rank0, rank1 = procs
    try:
        metrics = run / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.read_text().strip()):
            assert rank0.poll() is None and rank1.poll() is None, "a rank ended before its first step"
            assert time.monotonic() < deadline, "no step logged within 120 s"
            time.sleep(0.2)
        os.kill(rank1.pid, 9)
        killed = time.monotonic()
        try:
            out, err = rank0.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("rank 0 still runs 60 s after rank 1 was killed")
        took = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert rank0.returncode == 2, err[-3000:]
    assert took < 40, took
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert "rank 0 of 2" in errors[0] and "another rank" in errors[0], errors[0]
    assert "Traceback" not in err, err[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert rows and rows[0]["step"] == 1
    assert json.loads((run / "summary.json").read_text())["status"] == "FAILED"
