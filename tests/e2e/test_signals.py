"""SIGTERM, SIGUSR1, SIGUSR2 and SIGINT end a training run cleanly: a checkpoint at the step boundary,
summary.json, the MLflow run KILLED (read from the sqlite store), a line saying how to resume, exit
status 128 + signal; a second signal stops at once, the same signal delivered twice (a process-group
kill, as `timeout` and `scancel` send) does not. Real `entropyrl train` subprocesses, real
signals, a real MLflow store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entropyrl.trainers.run.stop_signals import REPEAT_WINDOW_S, RunInterrupted, StopSignals

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def small_run(workdir: Path, fast_train: list[str], *extra: str) -> list[str]:
    """A run far longer than the test waits, with tiny steps (the signal ends it)."""
    return [
        *CLI,
        "train",
        *fast_train,
        "trainer.total_steps=500",
        "trainer.save_every=0",
        "trainer.val_every=0",
        "val.prompts=0",
        "trainer.threads=1",
        "output_dir=run",
        f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}",
        *extra,
    ]


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def start_and_wait_for_step(cmd: list[str], cwd: Path, step: int = 1, timeout: float = 240) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while max(logged_steps(cwd / "run"), default=0) < step:
        if proc.poll() is not None:
            raise AssertionError(f"train exited early ({proc.returncode}): {proc.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("no step logged in time")
        time.sleep(0.05)
    return proc


def start_inside_step_one(workdir: Path, fast_train: list[str], **popen) -> subprocess.Popen:
    """A run with slow steps (many PPO epochs over the batch), about a second into its step 1:
    with one stop signal, step 1 would still finish and be saved."""
    cmd = small_run(workdir, fast_train, "trainer.ppo_epochs=100")
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.monotonic() + 240
    while not (workdir / "run" / "tracking.json").exists():  # written just before the first step
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    time.sleep(1.0)
    return proc


def mlflow_status(workdir: Path, run_id: str) -> str:
    with sqlite3.connect(workdir / "mlflow.db") as db:
        return db.execute("select status from runs where run_uuid = ?", (run_id,)).fetchone()[0]


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))


def stop_with(sig: int, workdir: Path, fast_train: list[str], step: int = 1) -> tuple[dict, str]:
    """Start a run, send ``sig`` once step ``step`` is logged; check it ended cleanly; (summary, stderr)."""
    proc = start_and_wait_for_step(small_run(workdir, fast_train), workdir, step=step)
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    run_dir = workdir / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = logged_steps(run_dir)
    assert summary["status"] == "KILLED" and summary["steps"] == steps[-1] < 500
    assert checkpoint_steps(run_dir) == [steps[-1]]  # saved at the step boundary it stopped on
    assert mlflow_status(workdir, summary["mlflow_run_id"]) == "KILLED"
    assert f"received {signal.Signals(sig).name}" in err
    assert f"stopped at step {steps[-1]} of 500" in err and "run the same command again" in err
    assert f"it resumes from step {steps[-1]}" in err
    return summary, err


@pytest.mark.slow
def test_sigterm_ends_the_run_cleanly_and_resume_continues_it(in_tmp, fast_train):
    stopped, _ = stop_with(signal.SIGTERM, in_tmp, fast_train, step=2)
    k = stopped["steps"]
    out = subprocess.run(
        small_run(in_tmp, fast_train, f"trainer.total_steps={k + 2}"), cwd=in_tmp, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stderr and f"(step {k})" in out.stderr
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["mlflow_run_id"] == stopped["mlflow_run_id"]
    assert logged_steps(in_tmp / "run") == list(range(1, k + 3))
    assert mlflow_status(in_tmp, summary["mlflow_run_id"]) == "FINISHED"
    with sqlite3.connect(in_tmp / "mlflow.db") as db:
        history = [
            s
            for (s,) in db.execute(
                "select step from metrics where run_uuid = ? and key = 'entropy' order by step", (summary["mlflow_run_id"],)
            )
        ]
    assert history == list(range(1, k + 3))  # one continuous sequence, nothing twice


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT], ids=lambda s: s.name)
def test_other_stop_signals_end_the_run_the_same_way(sig, in_tmp, fast_train):
    stop_with(sig, in_tmp, fast_train)


@pytest.mark.slow
def test_a_second_signal_stops_at_once(in_tmp, fast_train):
    proc = start_inside_step_one(in_tmp, fast_train)
    proc.send_signal(signal.SIGTERM)
    time.sleep(REPEAT_WINDOW_S + 0.5)  # a second request, not the first one delivered twice
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["status"] == "KILLED" and summary["steps"] == 0, summary  # step 1 was cut short
    assert logged_steps(in_tmp / "run") == []
    assert checkpoint_steps(in_tmp / "run") == []  # no checkpoint of a half-done step
    assert "no checkpoint yet" in err
    assert mlflow_status(in_tmp, summary["mlflow_run_id"]) == "KILLED"


def test_a_repeat_within_the_window_is_the_same_stop(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("entropyrl.trainers.run.stop_signals.time.monotonic", lambda: clock[0])
    lines: list[str] = []
    stop = StopSignals(lines.append)
    stop._handle(signal.SIGTERM, None)
    clock[0] += 0.01
    stop._handle(signal.SIGTERM, None)  # the process group's copy of the same stop
    clock[0] += REPEAT_WINDOW_S * 0.9
    stop._handle(signal.SIGINT, None)  # within the window of the last signal counted
    assert stop.requested == signal.SIGTERM and stop.count == 1 and len(lines) == 1
    clock[0] += REPEAT_WINDOW_S
    with pytest.raises(RunInterrupted) as raised:
        stop._handle(signal.SIGTERM, None)  # a later, deliberate second signal
    assert raised.value.exit_code == 128 + signal.SIGTERM


@pytest.mark.slow
def test_a_process_group_kill_stops_at_the_step_boundary(in_tmp, fast_train):
    """`timeout` signals its command, then the command's process group: the trainer gets SIGTERM twice
    in a row (and a launcher forwarding it, a moment later). That is one stop: the step in progress finishes and is saved."""
    proc = start_inside_step_one(in_tmp, fast_train, start_new_session=True)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)  # the group's copy comes a moment later (as a launcher's forward does): not coalesced
    os.killpg(proc.pid, signal.SIGTERM)
    _out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "received SIGTERM" in err, err[-3000:]
    assert "worker failed" not in err, err[-3000:]  # the helpers leave the stop to the trainer
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["status"] == "KILLED" and summary["steps"] >= 1, summary
    assert checkpoint_steps(in_tmp / "run") == [summary["steps"]]  # the step in progress finished and was saved


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_during_set_up_ends_at_once_leaving_no_run_folder(sig, in_tmp):
    """During the warm start SIGTERM's default ended the process with no word and left the run folder
    holding only its lock; a SIGINT inherited ignored (a job started in a script's background) was
    ignored. Null: the stop line names the folder removed, and nothing of a run is left."""
    cmd = [*CLI, "train", "model.warm_start.steps=3997", "output_dir=run", "tracking.enabled=false", "trainer.threads=1"]
    proc = subprocess.Popen(
        cmd,
        cwd=in_tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    seen, deadline = "", time.monotonic() + 120
    while "warm start" not in seen:  # the set-up is under way, far from its end
        line = proc.stderr.readline()
        assert (line or proc.poll() is None) and time.monotonic() < deadline, seen[-3000:]
        seen += line
    assert (in_tmp / "run" / ".lock").exists()
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=60)
    err = seen + rest
    assert proc.returncode == 128 + sig and "Traceback" not in err, err[-3000:]
    line = f"stopped by {sig.name} during set-up, before the first step: nothing trained ({Path('run')} removed)"
    assert line in err, err[-3000:]
    assert not (in_tmp / "run").exists()


def test_a_second_signal_waits_for_the_checkpoint_being_written(in_tmp, fast_train, monkeypatch):
    """Stop, then stop again while step 1's checkpoint is written: the second signal waits for the
    save (it says so) instead of cutting it in half; the run then ends as a stop does, its
    checkpoint kept. A second signal outside a save still stops at once (the handler's null)."""
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import GRPOTrainer, train

    real_save = GRPOTrainer.save

    def save_while_stopped_twice(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the first stop: after this step
        time.sleep(REPEAT_WINDOW_S + 0.3)  # a second request, not the first delivered twice
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # delivered (the handler runs in this thread, inside the save)
        return real_save(self)

    monkeypatch.setattr(GRPOTrainer, "save", save_while_stopped_twice)
    cfg = compose(
        "train",
        [*fast_train, "trainer.total_steps=4", "trainer.save_every=1", "trainer.val_every=0", "val.prompts=0"]
        + ["trainer.threads=1", "output_dir=run", f"tracking.uri=sqlite:///{in_tmp / 'mlflow.db'}"],
    )
    lines: list[str] = []
    with pytest.raises(RunInterrupted) as stopped:
        train(cfg, log=lines.append)
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert any("again: finishing the checkpoint of step 1 first" in m for m in lines), lines
    assert checkpoint_steps(in_tmp / "run") == [1]
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["status"] == "KILLED" and summary["steps"] == 1

    stop = StopSignals(lines.append)
    stop._handle(signal.SIGTERM, None)
    stop._last_at -= REPEAT_WINDOW_S + 1
    with pytest.raises(RunInterrupted):
        stop._handle(signal.SIGTERM, None)
