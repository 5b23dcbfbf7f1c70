"""Grading throughput and worst-case latency: our parallel grader vs plain math-verify.

Items: the 500 MATH-500 reference solutions, each graded twice: against its own gold answer
(right) and against another problem's answer (wrong, the next problem whose answer differs),
1,000 items, half right, like a mid-training batch. The baseline is sequential
``verify(parse("$gold$"), parse(solution))`` (math-verify's defaults) in a fresh interpreter,
timed after its import.

Two figures. ``speedup_vs_math_verify`` is the steady state our grader is built for (its worker
pool lives for a whole eval or training run): both sides first grade the same 400 *other* items
(OlympiadBench answers, right and wrong), which warms math-verify's ANTLR parser on both,
then the 1,000 timed ones; ``REPEATS`` alternating runs per side, the fastest counts (other jobs
on a shared machine only ever slow a run down). ``cold_speedup_vs_math_verify`` is one fresh run
of each with nothing graded before, our process start-up (the zygote imports math-verify while
the parent extracts answers and runs the fast path; no warm-up before the first batch) included,
as in a one-shot ``entropyrl grade``. ``fast_path_share``: the items decided without math-verify.

Worst case: each pathological input (exponent towers, a 1 MB response, unbalanced braces,
binary garbage, deep nesting), each with a wrong gold answer, graded alone; ``max_item_seconds``
is the slowest wall time and must stay within ``time_limit_seconds + 1``.

    python perf/grading.py          # or make bench
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

TIME_LIMIT = 5.0


def _data_dir() -> Path:
    from entropyrl.evals.benchmarks import PACKAGED_DATA

    env = os.environ.get("ENTROPYRL_DATA")
    return Path(env) if env else PACKAGED_DATA


def _read(rel: str) -> list[dict]:
    path = _data_dir() / rel
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _right_and_wrong(solutions: list[str], golds: list[str]) -> tuple[list[str], list[str]]:
    """Each solution against its own answer, then against the next different answer."""
    from entropyrl.evals.grading.grader import compact_key

    swapped = []
    for i, g in enumerate(golds):
        j = next(j % len(golds) for j in range(i + 1, i + len(golds)) if compact_key(golds[j % len(golds)]) != compact_key(g))
        swapped.append(golds[j])
    return solutions + solutions, golds + swapped


def _items() -> tuple[list[str], list[str]]:
    """The 1,000 timed items: MATH-500, right and wrong."""
    rows = _read("math500/test.jsonl")
    return _right_and_wrong([r["solution"] for r in rows], [str(r["answer"]) for r in rows])


def _warmup_items() -> tuple[list[str], list[str]]:
    """400 other items that warm both graders' math-verify up (ANTLR's parser builds its DFA
    cache as it sees input): OlympiadBench answers, boxed, against their own answer and against
    the next problem's answer (about 40% of them reach math-verify on our side)."""
    rows = _read("qwen-math-eval/olympiadbench/test.jsonl")[:200]
    answers = [", ".join(str(a) for a in r["final_answer"]).replace("$", "") for r in rows]
    return _right_and_wrong(["The answer is $\\boxed{" + a + "}$." for a in answers], answers)


PATHOLOGICAL = [
    ("\\boxed{9^{9^{9^{9}}}}", "5"),
    ("\\boxed{9^{9^{9^{9}}}}", "9^{9^{9^{9}}}+1"),
    ("\\boxed{10^{10^{10^{10}}}-10^{10^{10^{10}}}}", "1"),
    ("x" * 1_000_000 + "\\boxed{5}", "6"),
    ("\\boxed{" + "(" * 400 + "1" + ")" * 400 + "}", "2"),
    ("\\boxed{" + "{" * 100_000, "5"),
    ("\\boxed{" + "{" * 300 + "1" + "}" * 300 + "}", "2"),
    (bytes(range(256)).decode("latin-1") * 4000, "5"),
    ("\\boxed{\x00\ud800\x01}", "5"),
    ("\\boxed{" + "\\frac{1}{" * 150 + "2" + "}" * 150 + "}", "0"),
]


REPEATS = 2  # each side runs this many times; the fastest run counts

_BASELINE = """
import json, sys, time
from math_verify import parse, verify
data = json.load(open(sys.argv[1]))
def grade(items):
    return [bool(verify(parse("$" + g + "$"), parse(r))) for r, g in items]
out = {}
for name in ("warmup", "timed"):
    if data[name]:
        t0, c0 = time.perf_counter(), time.process_time()
        verdicts = grade(data[name])
        out[name] = {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "verdicts": verdicts}
print(json.dumps(out))
"""


def _baseline(timed: tuple[list[str], list[str]], warmup: tuple[list[str], list[str]] | None) -> dict:
    """Plain sequential math-verify in a fresh interpreter, timed inside it after the import:
    ``{"timed": {"seconds", "cpu", "verdicts"}, "warmup": ...}``."""
    import subprocess
    import sys
    import tempfile

    payload = {"timed": list(zip(*timed)), "warmup": list(zip(*warmup)) if warmup else []}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
    try:
        out = subprocess.run([sys.executable, "-c", _BASELINE, f.name], capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pool_cpu() -> float:
    """CPU seconds used so far by this process and the grading processes alive now (Linux /proc)."""
    from entropyrl.evals.grading import grader_pool

    total = time.process_time()
    pool = grader_pool._POOL
    pids = [w.pid for w in pool._workers] if pool else []
    if pool and pool._zygote:
        pids.append(pool._zygote.proc.pid)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return float("nan")
    return total


def _ours(timed, warmup) -> tuple[float, float, list]:
    """Our grader from a fresh pool (its start is timed when there is no warm-up):
    ``(seconds, cpu seconds of parent + zygote + workers, results)``."""
    from entropyrl.evals.grading.grader import grade_batch, shutdown_pool

    shutdown_pool()
    if warmup:
        grade_batch(*warmup, timeout=TIME_LIMIT)
    cpu0 = _pool_cpu() if warmup else float("nan")  # (cold: the processes start inside)
    started = time.perf_counter()
    results = grade_batch(*timed, timeout=TIME_LIMIT)
    seconds = time.perf_counter() - started
    cpu = _pool_cpu() - cpu0
    shutdown_pool()
    return seconds, cpu, results


def run() -> dict:
    from entropyrl.evals.grading.grader import cpu_count, grade_answers, grade_batch, shutdown_pool

    timed, warmup = _items(), _warmup_items()
    n = len(timed[0])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    # Cold: fresh processes on both sides, nothing graded before (like a one-shot `entropyrl grade`).
    cold_ours = _ours(timed, None)
    cold_mv = _baseline(timed, None)["timed"]
    # Steady state (the pool lives for a whole eval / training run): both sides first grade the
    # same 400 other items, then the 1,000 timed ones. Alternating runs, fastest of each.
    ours_runs, mv_runs = [], []
    for _ in range(REPEATS):
        ours_runs.append(_ours(timed, warmup))
        mv_runs.append(_baseline(timed, warmup)["timed"])
    ours_seconds, ours_cpu, ours = min(ours_runs, key=lambda r: r[0])
    best_mv = min(mv_runs, key=lambda r: r["seconds"])
    base = best_mv["verdicts"]

    grade_answers(["x"], ["y"])  # workers up: time the items, not the start
    item_times = []
    for response, gold in PATHOLOGICAL:
        t0 = time.perf_counter()
        [res] = grade_batch([response], [gold], timeout=TIME_LIMIT)
        item_times.append(time.perf_counter() - t0)
        assert res.correct is False
    shutdown_pool()

    return {
        "speedup_vs_math_verify": round(best_mv["seconds"] / ours_seconds, 3),
        "ours_seconds": round(ours_seconds, 3),
        "math_verify_seconds": round(best_mv["seconds"], 3),
        "max_item_seconds": round(max(item_times), 3),
        "time_limit_seconds": TIME_LIMIT,
        "n_items": n,
        "agreement": round(sum(o.correct == b for o, b in zip(ours, base)) / n, 4),
        "cold_speedup_vs_math_verify": round(cold_mv["seconds"] / cold_ours[0], 3),
        "cold_ours_seconds": round(cold_ours[0], 3),  # includes starting the processes
        "cold_math_verify_seconds": round(cold_mv["seconds"], 3),
        "ours_accuracy": round(sum(o.correct for o in ours) / n, 4),
        "math_verify_accuracy": round(sum(base) / n, 4),
        "fast_path_share": round(sum(o.decided_by == "fast_path" for o in ours) / n, 4),
        "workers": cpu_count(),
        "repeats": REPEATS,
        "ours_runs_seconds": [round(r[0], 3) for r in ours_runs],
        "math_verify_runs_seconds": [round(r["seconds"], 3) for r in mv_runs],
        "ours_cpu_seconds": round(ours_cpu, 3),  # parent + zygote + workers, fastest steady run
        "math_verify_cpu_seconds": round(best_mv["cpu"], 3),
        "load_average_at_start": round(load, 2),  # other jobs on the machine skew wall times
        "pathological_seconds": [round(t, 3) for t in item_times],
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
