"""``entropyrl lab`` stops like a sweep: Ctrl-C (SIGINT to the whole group) or SIGTERM to the command
ends its running job at a step boundary (summary, MLflow run KILLED, no orphan), closes the lab's
parent run KILLED and prints one line with the command that continues it, exit 128 + the signal.
Real ``entropyrl lab`` subprocesses on the embedded model, a real MLflow sqlite store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.sweeps.test_sweep_stop import alive, wait_for_a_step

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


@pytest.mark.slow
@pytest.mark.parametrize("sig, group", [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["ctrl-c", "SIGTERM"])
def test_a_stop_signal_stops_the_lab_and_closes_its_records(tmp_path, sig, group):
    out = tmp_path / "lab"
    proc = subprocess.Popen(
        [*CLI, "lab", "--experiment", "claims", "--algos", "grpo", "--seeds", "0", "--out", str(out), "trainer.total_steps=500"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    job_dir = out / "runs" / "grpo" / "s0"
    job_pid = wait_for_a_step(proc, job_dir)
    if group:  # Ctrl-C in a terminal: once, to every process of the group
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig and "Traceback" not in err, err[-3000:]
    resume = f"stopped by {sig.name}: to continue: entropyrl lab --algos grpo --seeds 0 --experiment claims"
    assert resume in err and f"--out {out} --resume" in err, err[-2000:]
    assert not alive(job_pid)  # no orphan
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["status"] == "KILLED"  # the job ended at a step, its records written
    sweep = json.loads((out / "sweep.json").read_text())
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        runs = dict(con.execute("select run_uuid, status from runs").fetchall())
    assert runs[sweep["tracking"]["parent_run_id"]] == "KILLED" and runs[summary["mlflow_run_id"]] == "KILLED"
