"""Code sandbox throughput and per-program overhead (``make bench`` key ``sandbox``).

Items: the 164 canonical HumanEval solutions, each with its own ``check``.

- ``programs_per_second``: all 164 graded by a ``SandboxPool`` of 2 workers (2 cores), wall
  time of the whole batch; ``all_164_seconds`` must stay under ``target_all_164_seconds`` (15).
- ``overhead_ratio_vs_bare_python``: sequential seconds per program in the sandbox divided by
  seconds per program of a bare ``python -c "<program + tests>"`` subprocess (the same interpreter,
  same programs, no isolation, no harness), on the first ``SEQUENTIAL`` problems. Target <= 2.
  Fastest of ``REPEATS`` alternating rounds per side (other jobs only ever slow a run down).
  ``overhead_ratio_vs_bare_python_IS``: the same against ``python -I -S -c`` (how the sandbox
  starts its interpreter), i.e. the cost of bwrap, the harness and the clean-up alone.
- ``oracle_vs_one_interpreter_ratio``: sequential seconds per program of the current design (the
  oracle in its own process, every call across a pipe) divided by the previous design's (program,
  tests and marker in one interpreter; ``perf/_sandbox_baseline.py``), same launcher, same
  programs, alternating rounds. Target <= 1.5. ``calls_per_program`` and ``seconds_per_call``: the
  pipe's own cost, from a program called ``CALLS`` times.

    python perf/sandbox.py          # or make bench
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

REPEATS = 3
SEQUENTIAL = 40
CALLS = 2000


def _bare(programs: list[str], flags: tuple[str, ...] = ()) -> float:
    t0 = time.perf_counter()
    for src in programs:
        subprocess.run([sys.executable, *flags, "-c", src], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t0) / len(programs)


def _sandboxed(problems, run_program, job_for) -> float:
    t0 = time.perf_counter()
    for p in problems:
        job = job_for(p, p.prompt + p.canonical)
        r = run_program(job.program, list(job.tests), setup=job.setup)
        assert r.passed, (p.id, r.reason, r.detail)
    return (time.perf_counter() - t0) / len(problems)


def _one_interpreter(problems) -> float:
    from _sandbox_baseline import run_one_interpreter

    t0 = time.perf_counter()
    for p in problems:
        assert run_one_interpreter(p.prompt + p.canonical, [f"check({p.entry_point})"], p.test), p.id
    return (time.perf_counter() - t0) / len(problems)


def _per_call(run_program) -> float:
    """Seconds one call across the pipe costs: a loop of CALLS calls minus a loop of one."""
    prog = "def f(x):\n    return [x, str(x)]\n"
    many = f"for i in range({CALLS}):\n    assert f(i) == [i, str(i)]"
    best = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        assert run_program(prog, [many]).passed
        t1 = time.perf_counter()
        assert run_program(prog, ["assert f(1) == [1, '1']"]).passed
        best.append((t1 - t0) - (time.perf_counter() - t1))
    return max(0.0, min(best)) / CALLS


def run() -> dict:
    from entropyrl.evals.code.code_tasks import grade_code, job_for, load_humaneval
    from entropyrl.evals.code.sandbox import SandboxPool, launcher, run_program

    problems = load_humaneval()
    kind = launcher("auto")
    pool = SandboxPool(workers=2)
    t0 = time.perf_counter()
    results = grade_code(problems, [p.canonical for p in problems], pool)
    batch = time.perf_counter() - t0
    passed = sum(r.passed for _, r in results)

    first = problems[:SEQUENTIAL]
    bare_src = [p.prompt + p.canonical + "\n" + p.test + f"\ncheck({p.entry_point})\n" for p in first]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    bare_runs, lean_runs, box_runs, one_runs = [], [], [], []
    for _ in range(REPEATS):
        bare_runs.append(_bare(bare_src))
        lean_runs.append(_bare(bare_src, ("-I", "-S")))
        box_runs.append(_sandboxed(first, run_program, job_for))
        one_runs.append(_one_interpreter(first))
    bare, lean, box, one = min(bare_runs), min(lean_runs), min(box_runs), min(one_runs)
    calls = [p.test.count("candidate(") for p in first]
    return {
        "launcher": kind,
        "programs": len(problems),
        "passed": passed,
        "all_164_seconds": round(batch, 3),
        "target_all_164_seconds": 15.0,
        "programs_per_second": round(len(problems) / batch, 2),
        "workers": pool.workers,
        "sandbox_seconds_per_program": round(box, 4),
        "bare_python_seconds_per_program": round(bare, 4),
        "overhead_ratio_vs_bare_python": round(box / bare, 3),
        "target_overhead_ratio": 2.0,
        # The sandbox starts its interpreter with -I -S (no site-packages): against a bare
        # subprocess started the same way, the isolation's own cost shows.
        "bare_python_IS_seconds_per_program": round(lean, 4),
        "overhead_ratio_vs_bare_python_IS": round(box / lean, 3),
        "one_interpreter_seconds_per_program": round(one, 4),
        "oracle_vs_one_interpreter_ratio": round(box / one, 3),
        "target_oracle_vs_one_interpreter_ratio": 1.5,
        "calls_per_program": round(sum(calls) / len(calls), 1),
        "seconds_per_call": round(_per_call(run_program), 7),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
