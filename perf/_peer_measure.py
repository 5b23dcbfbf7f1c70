"""One side's run of ``make bench-peers`` measured: its start-up (launch to its first step's row), each
step's own clock, the time between rows seen from outside, its peak resident memory and mean response
length; ``perf/peers.py`` runs both sides through it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

WARMUP = 2  # the first steps of a run, left out of its step times
POLL_S = 0.005  # how often the metrics files are looked at


def run(cmd: list[str], rows: Path, cwd: Path, threads: int) -> dict:
    """Run ``cmd``; seconds from launch to each row's appearance in ``rows`` (the first: its start-up),
    its peak RSS and wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[float] = []  # when each row appeared, from launch
    output: list[str] = []
    reader = _drain(proc, output)
    while True:  # wait4, not Popen.wait: its rusage is this child's own peak memory
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        count = rows.read_text().count("\n") if rows.exists() else 0
        seen += [time.perf_counter() - started] * (count - len(seen))
        time.sleep(POLL_S)
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    wall = time.perf_counter() - started
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed ({proc.returncode}): {''.join(output)[-2000:]}")
    return {"startup_s": seen[0], "row_times": seen, "wall_s": wall, "peak_rss_mb": _peak_mb(usage)}


def _drain(proc, output: list[str]):
    import threading

    thread = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    thread.start()
    return thread


def _peak_mb(usage) -> float:
    return round(usage.ru_maxrss / 1024, 1)  # Linux: kilobytes


def steady(rows: list[dict], row_times: list[float]) -> dict:
    """Min and median of the steps' own clocks after the warm-up, the mean seen from outside (the time
    between the warm-up's last row and the last row, over the steps between, logging included), the
    mean response length of those steps and their seconds per mean response token: a side whose
    responses ended sooner did less work in its steps, which the step times alone do not show."""
    times = [r["time/step"] for r in rows[WARMUP:]]
    lengths = [r["response_length/mean"] for r in rows[WARMUP:]]
    outside = (row_times[-1] - row_times[WARMUP - 1]) / (len(row_times) - WARMUP)
    return {
        "min": round(min(times), 4),
        "median": round(statistics.median(times), 4),
        "mean_outside": round(outside, 4),
        "response_tokens_mean": round(statistics.fmean(lengths), 2),
        "per_response_token": round(sum(times) / sum(lengths), 5),
    }


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures(measured: dict, rows: list[dict]) -> dict:
    clocks = steady(rows, measured["row_times"])
    return {
        "step_s_min": clocks["min"],
        "step_s_median": clocks["median"],
        "step_s_outside": clocks["mean_outside"],
        "response_tokens_mean": clocks["response_tokens_mean"],
        "step_s_per_response_token": clocks["per_response_token"],
        "startup_s": round(measured["startup_s"], 3),
        "peak_rss_mb": measured["peak_rss_mb"],
    }


def median_figures(runs: list[dict]) -> dict:
    """Each figure's median over the runs (a busy machine slows one run, not all of them)."""
    return {key: round(statistics.median(run[key] for run in runs), 4) for key in runs[0]}
