"""How fast the command line answers (``make bench`` key ``startup``).

Wall time of ``entropyrl --help`` (the console script), ``python -m entropyrl.cli.main --help`` and
``entropyrl train --help``, against ``python -c pass`` (the interpreter alone) measured in the same
run, ``REPEATS`` alternating rounds each, median. Target: ``entropyrl --help`` under 1 s on an idle
machine (``target_help_seconds``); ``*_over_python`` is the time beyond the bare interpreter, the
part the CLI's imports cost. Also the peak memory of one ``--help`` (``ru_maxrss`` of the child).

    python perf/startup.py          # or make bench; python -X importtime -c "import entropyrl.cli.main"
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPEATS = 7


def _console_script() -> list[str]:
    beside = Path(sys.executable).with_name("entropyrl")
    found = str(beside) if beside.exists() else shutil.which("entropyrl")
    return [found] if found else [sys.executable, "-m", "entropyrl.cli.main"]


def _seconds(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env={**os.environ, "COLUMNS": "100"})
    return time.perf_counter() - t0


def _peak_mb(argv: list[str]) -> float:
    """Peak resident memory of one child running ``argv`` (the largest child so far, so measured first)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(before, after) / 1024, 1)


def run() -> dict:
    commands = {
        "python_pass": [sys.executable, "-c", "pass"],
        "entropyrl_help": [*_console_script(), "--help"],
        "module_help": [sys.executable, "-m", "entropyrl.cli.main", "--help"],
        "train_help": [*_console_script(), "train", "--help"],
    }
    peak = _peak_mb(commands["entropyrl_help"])
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(REPEATS):  # alternate, so that load beside us hits every command alike
        for name, argv in commands.items():
            times[name].append(_seconds(argv))
    median = {name: statistics.median(ts) for name, ts in times.items()}
    base = median["python_pass"]
    out: dict = {
        "repeats": REPEATS,
        "target_help_seconds": 1.0,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "help_peak_mb": peak,
    }
    for name, seconds in median.items():
        out[f"{name}_seconds"] = round(seconds, 3)
        if name != "python_pass":
            out[f"{name}_over_python_seconds"] = round(seconds - base, 3)
            out[f"{name}_ratio_vs_python"] = round(seconds / base, 2)
    out["help_under_target"] = median["entropyrl_help"] < out["target_help_seconds"]
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
