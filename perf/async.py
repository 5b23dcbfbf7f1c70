"""Asynchronous training (``trainer.staleness``): time per step at k=0, 1 and 2 in the same run,
on the tiny model with the default task, trainer and rollout worker one thread each.

Each run is an ``entropyrl train`` subprocess (``trainer.threads=1``, no tracking, no validation,
no checkpoint before the end). Time per step is the mean ``time/step`` of the steps after the
first ``WARMUP`` (at k=1 the first step also waits for the worker to load its model). From the
k=0 run's phase times, generation ``gen = time/generate`` and training ``train = time/step - gen``,
the ideal overlap is ``(gen + train) / max(gen, train)``; ``speedup`` is k=0's time per step over
k=1's (``speedup_k2`` over k=2's), ``fraction_of_ideal`` is ``speedup / ideal_speedup``. The idle shares are the k=1 run's means of ``async/trainer_idle_frac`` and
``async/worker_idle_frac``. Two processes of one thread each need two free cores: on a machine
where something else runs, or whose CPUs do not add up, the speed-up falls short of the ideal.
``parallel_capacity`` says which: the throughput of two one-thread matmul loops run at once over
one run alone (2.0: two free cores; 1.0: no gain from a second process).

    .venv/bin/python perf/run.py async
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS, WARMUP = 20, 4
PROMPTS, N = 32, 8  # the default task's batch: 256 responses a step (GRPO keeps them all)


def _run(folder: Path, staleness: int) -> list[dict]:
    from _timed_train import timed_steps

    batch = [f"trainer.staleness={staleness}", f"trainer.prompts_per_step={PROMPTS}", f"rollout.n={N}"]
    return timed_steps(folder, f"k{staleness}", STEPS, WARMUP, batch)


_MATMUL_LOOP = (
    "import time, torch; torch.set_num_threads(1); a = torch.randn(256, 256); t = time.perf_counter()\n"
    "for _ in range(1500): a @ a\n"
    "print(time.perf_counter() - t)"
)


def _matmul_seconds(copies: int) -> float:
    procs = [subprocess.Popen([sys.executable, "-c", _MATMUL_LOOP], stdout=subprocess.PIPE, text=True) for _ in range(copies)]
    return max(float(p.communicate()[0]) for p in procs)


def parallel_capacity() -> float:
    """Throughput of two one-thread processes at once relative to one alone."""
    return 2 * _matmul_seconds(1) / _matmul_seconds(2)


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(float(r[key]) for r in rows)


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="entropyrl-bench-async-") as tmp:
        sync = _run(Path(tmp), 0)
        overlapped = _run(Path(tmp), 1)
        two = _run(Path(tmp), 2)
    step0, step1, step2 = (_mean(rows, "time/step") for rows in (sync, overlapped, two))
    gen = _mean(sync, "time/generate")
    train = step0 - gen
    ideal = (gen + train) / max(gen, train)
    return {
        "steps_timed": len(sync),
        "time_per_step_k0_s": round(step0, 4),
        "time_per_step_k1_s": round(step1, 4),
        "generate_s_k0": round(gen, 4),
        "train_s_k0": round(train, 4),
        "time_per_step_k2_s": round(step2, 4),
        "speedup": round(step0 / step1, 3),
        "ideal_speedup": round(ideal, 3),
        "fraction_of_ideal": round(step0 / step1 / ideal, 3),
        "speedup_k2": round(step0 / step2, 3),
        "trainer_idle_frac": round(_mean(overlapped, "async/trainer_idle_frac"), 3),
        "worker_idle_frac": round(_mean(overlapped, "async/worker_idle_frac"), 3),
        "samples_per_s_k0": round(PROMPTS * N / step0, 1),
        "samples_per_s_k1": round(_mean(overlapped, "async/samples_per_s"), 1),
        "samples_per_s_k2": round(_mean(two, "async/samples_per_s"), 1),
        "staleness_mean_k1": round(_mean(overlapped, "async/staleness/mean"), 3),
        "staleness_mean_k2": round(_mean(two, "async/staleness/mean"), 3),
        "parallel_capacity": round(parallel_capacity(), 3),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
