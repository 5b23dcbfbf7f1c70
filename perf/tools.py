"""Tool use (``tools=code_interpreter``): the sandboxed executor's calls per second, and what the
tool costs a training step on the tool task against the same step without the tool.

- ``executor``: batches of small calls (the tool task's additions) through the executor a training
  run builds (``evals/code/tool_executor.py``, the default ``tools.executor`` limits and the
  strongest isolation that works here), ``workers`` at a time; ``calls_per_s`` over the batches,
  with the default ``tools.executor.launch=zygote`` (each call a fork of a warm sandboxed
  interpreter). ``executor_fresh``: the same with ``launch=fresh`` (a new sandboxed interpreter
  per call, the design the zygote replaced); ``calls_per_s_fresh`` and ``calls_speedup`` (zygote
  over fresh) compare the two in the same run.
- ``step``: two ``entropyrl train`` subprocesses on ``data=tool_arith``, one with
  ``tools=code_interpreter`` and one without (the task answered in one go), the same batch
  (``PROMPTS`` x ``N``), one torch thread each, run one after the other. Time per step is the mean
  ``time/step`` after the first ``WARMUP`` steps; ``tool_time_frac`` is the with-tool run's mean
  ``tools/time_frac`` (the share of the step's wall time spent running calls) and ``step_ratio``
  the with-tool time per step over the without-tool one (multi-turn generation, the calls and the
  longer responses together).

    .venv/bin/python perf/run.py tools
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

STEPS, WARMUP = 8, 2
PROMPTS, N = 16, 8  # 128 responses a step
BATCHES, CALLS = 3, 32


def _executor(launch: str = "zygote") -> dict:
    from entropyrl.conf import compose
    from entropyrl.evals.code.tool_executor import build_tool_executor

    tools = compose("train", ["data=tool_arith", "tools=code_interpreter", f"tools.executor.launch={launch}"]).tools
    executor = build_tool_executor(tools)
    codes = [f"{1000 + 37 * i}+{9999 - 53 * i}" for i in range(CALLS)]
    executor(codes[:2])  # the pool and the launcher warmed up
    started = time.perf_counter()
    errors = 0
    for _ in range(BATCHES):
        errors += sum(r.error for r in executor(codes))
    elapsed = time.perf_counter() - started
    executor.close()
    return {
        "launch": launch,
        "calls": BATCHES * CALLS,
        "calls_per_s": round(BATCHES * CALLS / elapsed, 2),
        "errors": errors,
        "workers": executor.pool.workers,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }


def _train(folder: Path, with_tool: bool) -> list[dict]:
    from _timed_train import timed_steps

    task = ["data=tool_arith", *(["tools=code_interpreter"] if with_tool else [])]
    batch = [f"trainer.prompts_per_step={PROMPTS}", f"trainer.mini_batch_prompts={PROMPTS}", f"rollout.n={N}"]
    return timed_steps(folder, "tool" if with_tool else "plain", STEPS, WARMUP, task + batch)


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(float(r[key]) for r in rows if r.get(key) is not None)


def run() -> dict:
    result = {"executor": _executor("zygote"), "executor_fresh": _executor("fresh")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plain, tool = _train(folder, with_tool=False), _train(folder, with_tool=True)
    with_s, without_s = _mean(tool, "time/step"), _mean(plain, "time/step")
    result["step"] = {
        "steps_timed": len(tool),
        "responses_per_step": PROMPTS * N,
        "step_s_with_tool": round(with_s, 4),
        "step_s_without_tool": round(without_s, 4),
        "step_ratio": round(with_s / without_s, 3),
        "tool_time_frac": round(_mean(tool, "tools/time_frac"), 4),
        "calls_per_response": round(_mean(tool, "tools/calls/mean"), 3),
        "call_error_frac": round(_mean(tool, "tools/error_frac"), 4),
    }
    result["calls_per_s"] = result["executor"]["calls_per_s"]
    result["calls_per_s_fresh"] = result["executor_fresh"]["calls_per_s"]
    result["calls_speedup"] = round(result["calls_per_s"] / result["calls_per_s_fresh"], 2)
    result["step_ratio"] = result["step"]["step_ratio"]
    result["tool_time_frac"] = result["step"]["tool_time_frac"]
    return result
