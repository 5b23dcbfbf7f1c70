"""a sweep stops like a run, and resumes as it was started.

SIGTERM to a local sweep stops its running job (no orphan process), marks the parent MLflow run
KILLED and prints a resume line; a bare `entropyrl sweep ablation=clip --resume` after a sweep
started with overrides reuses them (no diff, no retyping), and changing one prints a readable diff.
Real `entropyrl sweep` subprocesses with the local launcher, a real MLflow sqlite store."""

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

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
JOB = [
    "data=toy",
    "train.trainer.prompts_per_step=4",
    "train.trainer.mini_batch_prompts=4",
    "train.trainer.val_every=0",
    "train.trainer.save_every=0",
    "train.val.prompts=0",
]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_for_a_step(proc: subprocess.Popen, job_dir: Path, timeout: float = 300) -> int:
    """Wait until the job in ``job_dir`` has logged a step (``proc`` still running); its pid."""
    deadline = time.monotonic() + timeout
    while not (job_dir / "metrics.jsonl").exists() or not (job_dir / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the job logged no step in time"
        time.sleep(0.2)
    return int(json.loads((job_dir / "job.json").read_text())["pid"])


def inherit_an_ignored_sigint() -> None:
    """The sweep starts with SIGINT ignored, as a process started in the background of a script (or
    from a pytest-xdist worker) does: its own handler, not Python's default, must stop it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, group",
    [
        (signal.SIGTERM, False),
        (signal.SIGTERM, True),
        (signal.SIGINT, False),
        (signal.SIGINT, True),  # Ctrl-C in a terminal: the whole group
    ],
    ids=["SIGTERM", "SIGTERM-to-the-group", "SIGINT", "SIGINT-to-the-group"],
)
def test_a_stop_signal_stops_a_local_sweep_and_its_job(tmp_path, sig, group):
    """SIGTERM (a scheduler, ``timeout``) and SIGINT (Ctrl-C) alike: one line, no traceback, the
    job stopped at a step boundary, the sweep's parent run and the job's child run KILLED. With
    ``group`` the sweep gets the signal twice, then its process group (as ``timeout`` sends it):
    still one stop, not a second one cutting the first short. SIGINT is sent to a sweep that inherited
    it ignored, which only the sweep's own handler stops."""
    db = tmp_path / "mlflow.db"
    proc = subprocess.Popen(
        [
            *CLI,
            "sweep",
            "ablation=clip",
            "variants=[symmetric]",
            "seeds=[0]",
            "sweep_dir=sw",
            "launcher=local",
            f"tracking.uri=sqlite:///{db}",
            "train.trainer.total_steps=500",
            *JOB,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
        preexec_fn=inherit_an_ignored_sigint if sig == signal.SIGINT else None,
    )
    job_dir = tmp_path / "sw" / "runs" / "symmetric" / "s0"
    job_pid = wait_for_a_step(proc, job_dir)
    if sig == signal.SIGINT and group:  # Ctrl-C in a terminal: once, to every process of the group
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    if group and sig == signal.SIGTERM:
        time.sleep(0.1)
        os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig and "Traceback" not in err, err[-3000:]
    assert f"stopped by {sig.name}; to continue: entropyrl sweep ablation=clip --resume sweep_dir=" in err
    assert not alive(job_pid)  # no orphan
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    with sqlite3.connect(db) as con:
        status = con.execute("select status from runs where run_uuid = ?", (sweep["tracking"]["parent_run_id"],)).fetchone()[0]
    assert status == "KILLED"
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["status"] == "KILLED"  # the job ended cleanly
    with sqlite3.connect(db) as con:
        child = con.execute("select status from runs where run_uuid = ?", (summary["mlflow_run_id"],)).fetchone()[0]
    assert child == "KILLED"


@pytest.mark.slow
def test_a_bare_resume_reuses_the_sweeps_overrides(tmp_path):
    uri = f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"
    first = subprocess.run(
        [
            *CLI,
            "sweep",
            "ablation=clip",
            "variants=[symmetric]",
            "seeds=[0]",
            "launcher=local",
            uri,
            "trainer.total_steps=2",
            *JOB,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run(
        [*CLI, "sweep", "ablation=clip", "--resume", uri], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert "--resume: the sweep's own overrides: trainer.total_steps=2" in again.stderr
    assert "1 jobs (1 done, 0 still queued/running, 0 to run)" in again.stderr
    changed = subprocess.run(
        [*CLI, "sweep", "ablation=clip", "--resume", uri, "trainer.total_steps=3", *JOB],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert changed.returncode == 2 and "trainer.total_steps: 2 -> 3" in changed.stderr, changed.stderr[-3000:]


@pytest.mark.parametrize("content", ["", "{}", "[]"])
def test_status_of_an_emptied_sweep_file_is_one_line(tmp_path, content):
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "sweep.json").write_text(content)
    out = subprocess.run([*CLI, "status", "sw"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "sweep None" not in out.stdout, out.stderr[-2000:]
    assert lines[0].startswith("error: ") and "sweep.json" in lines[0]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError], ids=["stopped", "failed"])
def test_a_report_that_does_not_finish_closes_the_parent_run(tmp_path, monkeypatch, capsys, failure):
    """The report finishes the parent run; stopped (Ctrl-C) or failing while it is built, the
    parent was left RUNNING. Now it ends KILLED / FAILED, the job's run stays FINISHED, and one
    line says how to write the report."""
    import entropyrl.sweeps.following as following
    from entropyrl.cli.app import run

    def report_cut_short(*_a, **_k):
        raise failure("while writing the report")

    monkeypatch.setattr(following, "build_report", report_cut_short)
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "ablation=gate", "variants=[off]", "seeds=[0]", "launcher=debug", "sweep_dir=sw"]
    args += [f"tracking.uri=sqlite:///{tmp_path / 'ml.db'}", "train.trainer.total_steps=1", "train.trainer.prompts_per_step=4"]
    args += ["train.trainer.mini_batch_prompts=4", "train.val.prompts=0", "train.trainer.save_every=0"]
    with pytest.raises((SystemExit, failure)):
        run(args)
    with sqlite3.connect(tmp_path / "ml.db") as db:
        runs = dict(db.execute("select name, status from runs"))
    assert runs == {"sweep-sw": "KILLED" if failure is KeyboardInterrupt else "FAILED", "off-s0": "FINISHED"}, runs
    said = capsys.readouterr()
    assert "the report was not written; the jobs' results are kept: `entropyrl report" in said.err + said.out
