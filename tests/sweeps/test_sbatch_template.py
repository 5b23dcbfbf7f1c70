"""examples/slurm/train.sbatch without SLURM: a shell script that asks for GPUs, time, a requeue
and the stop signal, and refuses to run without an ``output_dir`` (a requeued job must find its
checkpoints). tests/e2e/test_slurm.py submits it to the local SLURM."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "train.sbatch"


def test_template_asks_slurm_for_gpus_a_signal_and_a_requeue():
    text = TEMPLATE.read_text()
    assert subprocess.run(["bash", "-n", str(TEMPLATE)]).returncode == 0
    directives = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", text, re.M))
    assert directives["gpus-per-node"] == directives["ntasks-per-node"]  # one task per GPU
    assert directives["signal"].startswith("USR1@") and "requeue" in directives
    assert "-m entropyrl.cli.main train" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text


def test_template_without_output_dir_is_one_error_line(tmp_path):
    out = subprocess.run(["bash", str(TEMPLATE), "algo=stare"], capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: pass output_dir=") and len(out.stderr.strip().splitlines()) == 1
