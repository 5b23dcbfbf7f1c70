"""What a local sweep pays per job to start (``make bench`` key ``sweep``).

The same sweep twice in one run: ``JOBS`` short jobs on the toy task (3 steps each, one at a time,
one torch thread), once with each job started cold (``launcher.warm_start=false``: a fresh
interpreter that imports torch, transformers, MLflow and the trainer) and once forked from the
sweep's warm worker (``launcher.warm_start=true``, ``sweeps/warm_worker.py``). The jobs' training
is the same, so the difference is start-up: ``saved_per_job_s`` spreads it over the jobs after the
first (the first warm job waits for the worker's imports, as a cold job does for its own);
``wall_ratio`` is warm over cold wall time of the whole sweep.

    python perf/sweep.py          # or make bench sweep
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOBS = 4
JOB = [
    "ablation=clip",
    "variants=[symmetric]",
    "launcher=local",
    "launcher.max_parallel=1",
    "launcher.threads_per_job=1",
    "poll_seconds=0.2",
    "data=toy",
    "train.trainer.total_steps=3",
    "train.trainer.prompts_per_step=4",
    "train.trainer.mini_batch_prompts=4",
    "train.trainer.val_every=0",
    "train.trainer.save_every=0",
    "train.val.prompts=0",
]


def _sweep_seconds(folder: Path, warm: bool) -> float:
    seeds = ",".join(str(s) for s in range(JOBS))
    argv = [sys.executable, "-m", "entropyrl.cli.main", "sweep", *JOB, f"seeds=[{seeds}]"]
    argv += [f"sweep_dir={folder / 'sweep'}", f"tracking.uri=sqlite:///{folder / 'mlflow.db'}"]
    argv += [f"launcher.warm_start={'true' if warm else 'false'}"]
    started = time.perf_counter()
    out = subprocess.run(argv, cwd=folder, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"the {'warm' if warm else 'cold'} sweep failed: {out.stderr[-2000:]}")
    return time.perf_counter() - started


def run() -> dict:
    seconds = {}
    for warm in (False, True):
        with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
            seconds["warm" if warm else "cold"] = _sweep_seconds(Path(tmp), warm)
    return {
        "jobs": JOBS,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "cold_s": round(seconds["cold"], 2),
        "warm_s": round(seconds["warm"], 2),
        "wall_ratio": round(seconds["warm"] / seconds["cold"], 3),
        "saved_per_job_s": round((seconds["cold"] - seconds["warm"]) / (JOBS - 1), 2),
    }


if __name__ == "__main__":
    print(run())
