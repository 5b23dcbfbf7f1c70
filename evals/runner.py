"""The evaluation harness: benchmarks -> prompts -> samples -> grades -> metrics.

- ``evaluate(engine, tokenizer, benchmarks, settings)``: the shared core (used by the CLI and by
  training-time validation). Returns per-benchmark metrics and one record per sample.
- ``run_eval(cfg)``: ``entropyrl eval``: loads data and model from a composed ``conf/eval.yaml``,
  prints a table, writes ``<output_dir>/samples.jsonl`` and ``summary.json`` and logs an MLflow
  run (metric keys ``eval/<bench>/avg@<n>`` with ``@`` spelled ``_at_``, as MLflow forbids ``@``).
- ``validate(model, tokenizer, benchmarks, val_cfg, tools=...)``: ``{"val/<bench>/avg@<n>": ...}``
  for the trainer, with the in-memory policy, leaving its RNG state and train/eval mode as they
  were; in a tool run through the same multi-turn driver and tool as training, with the tool
  metrics (``val/<bench>/tools/calls/mean``, ...).

Running out of memory while generating or grading (``core/oom.py`` tells it from other errors) ends
``entropyrl eval`` in one line (``memory_error``) naming what ran out, where, and the keys that lower
it; the benchmarks already finished keep their results (samples.jsonl, summary.json with
``status: FAILED``) and the MLflow run holds them, ended FAILED.

Samples come from a rollout engine (``entropyrl.rollout``, the one stack training uses too):
``eval.backend=hf|vllm|<registered>``, its settings from ``eval.*`` and the section named after it
(``eval.vllm``). With ``tools=code_interpreter`` the engine samples multi-turn responses through the
tool driver (``rollout/multi_turn.py``, calls run in the code sandbox) and each benchmark's metrics
add the tool-use figures of ``tool_summary`` (``tools/turns/mean``, ``tools/calls/mean``,
``tools/error_frac``, ``tools/called_frac``, ``tools/{malformed,repeated,void}_frac``); every sample
records its ``turns`` and ``calls``.

Here: ``evaluate``, ``validate`` and the run of ``entropyrl eval``. Around them: the settings
(``evals/settings.py``), the model and engine (``evals/engine_setup.py``), the results' shapes, table
and flat metric keys (``evals/results.py``), the progress bar (``evals/progress_display.py``) and
what ``entropyrl eval`` writes and logs (``evals/run_outputs.py``); their names stay importable from
here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping

from ..core.errors import UserError
from ..core.mlflow_store import resolve_uri
from ..core.oom import is_out_of_memory
from ..core.outbox import short_http_retries
from ..core.resources import apply_threads
from ..core.tracking import check_reachable
from ..rollout.base import RolloutEngine, build_rollout
from ..rollout.multi_turn import ToolRollout
from ..tasks.problem import Problem
from .benchmarks import BenchmarkSpec, available_benchmarks, expand_benchmarks, get_spec, load_benchmark, repeated_note
from .code.code_eval import evaluate_code, is_code_problem
from .code.tool_executor import build_tool_executor, check_tools
from .engine_setup import _device as _device
from .engine_setup import _unrepresentable, _use_chat, make_engine
from .generation import sample_texts
from .grading.answer_extraction import extract_answer
from .grading.grader import grade_batch, no_answer_warning, reason_counts
from .metrics import mean_metrics, problem_metrics
from .progress_display import ProgressFn, beating, progress_bar, progress_display
from .prompts import available_templates, build_prompts
from .reflection import ReflectionMatcher, matcher_for, resolve_words
from .results import SUMMARY_KEYS as SUMMARY_KEYS
from .results import _add_reflection, flat_metrics, render_table, tool_summary
from .results import average_over_benchmarks as average_over_benchmarks
from .results import reflection_lines as reflection_lines
from .run_outputs import _log_mlflow as _log_mlflow
from .run_outputs import _write_results, memory_error
from .settings import EvalSettings, eval_settings
from .settings import _chat_option as _chat_option
from .settings import _chat_setting as _chat_setting

__all__ = ["EvalSettings", "eval_settings", "evaluate", "memory_error", "run_eval", "validate", "render_table"]


def evaluate(
    engine: RolloutEngine,
    tokenizer,
    benchmarks: Mapping[str, list[Problem]],
    settings: EvalSettings,
    *,
    progress: ProgressFn | None = None,
    into: tuple[dict, list] | None = None,
) -> tuple[dict[str, dict], list[dict]]:
    """Sample, grade and score each benchmark.

    Returns ``(results, samples)``: ``results[bench]`` holds ``n_samples``, ``problems``,
    ``temperature``, ``top_p`` and ``metrics`` (``avg@n``, ``pass@k``, ``maj@n`` means over
    problems); ``samples`` has one dict per generated response. ``into``: the ``(results,
    samples)`` to fill, benchmark by benchmark, so that a caller keeps the finished ones when a
    later one fails (a benchmark is finished once its name is in ``results``)."""
    results, samples = into if into is not None else ({}, [])
    matcher = matcher_for(resolve_words(settings.reflection_words, "eval.reflection_words"))
    for source, problems in benchmarks.items():
        spec = get_spec(source)
        bench = spec.name  # a data file given by path is labelled by its stem
        if problems and is_code_problem(problems[0]):  # run in the code sandbox: evals/code/code_eval.py
            _evaluate_code_benchmark(engine, tokenizer, bench, spec, problems, settings, matcher, progress, results, samples)
        else:
            _evaluate_answer_benchmark(engine, tokenizer, bench, spec, problems, settings, matcher, progress, results, samples)
    return results, samples


def _evaluate_code_benchmark(
    engine,
    tokenizer,
    bench: str,
    spec: BenchmarkSpec,
    problems: list,
    settings: EvalSettings,
    matcher: ReflectionMatcher,
    progress: ProgressFn | None,
    results: dict,
    samples: list[dict],
) -> None:
    """A benchmark of programs: ``evaluate_code`` runs each response in the sandbox."""
    results[bench], recs = evaluate_code(
        engine,
        tokenizer,
        bench,
        spec,
        problems,
        settings,
        chat=_use_chat(tokenizer, settings.chat_template),
        progress=progress,
    )
    _add_reflection(results[bench], recs, matcher, tokenizer)
    samples.extend(recs)


def _evaluate_answer_benchmark(
    engine,
    tokenizer,
    bench: str,
    spec: BenchmarkSpec,
    problems: list[Problem],
    settings: EvalSettings,
    matcher: ReflectionMatcher,
    progress: ProgressFn | None,
    results: dict,
    samples: list[dict],
) -> None:
    """A benchmark of answers: ``n`` responses per problem, each graded against the problem's answer;
    its result into ``results[bench]`` and one record per response appended to ``samples``."""
    n = int(settings.n_samples or spec.n_samples)
    temperature = float(spec.temperature if settings.temperature is None else settings.temperature)
    top_p = float(spec.top_p if settings.top_p is None else settings.top_p)
    total = n * len(problems)
    prompts = build_prompts(problems, settings.prompt, tokenizer, settings.chat_template)
    t0 = time.perf_counter()
    traces: list = []
    own: list[str] = []  # each response's own text (with a tool: its outputs left out)
    completions = sample_texts(
        engine,
        prompts,
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=settings.seed,
        progress=_phase_progress(progress, bench, "generate", total),
        traces=traces,
        own_texts=own,
    )
    trace = traces[0] if traces else None  # multi-turn with a tool: turns and calls per response
    t1 = time.perf_counter()
    flat = [c for group in completions for c in group]
    golds = [p.answer for p in problems for _ in range(n)]
    grades = grade_batch(
        flat,
        golds,
        workers=settings.workers,
        timeout=settings.grade_timeout,
        progress=_phase_progress(progress, bench, "grade", total),
    )
    t2 = time.perf_counter()
    first = len(samples)
    per_problem = _record_samples(samples, bench, problems, n, completions, grades, trace)
    results[bench] = {
        "n_samples": n,
        "problems": len(problems),
        "temperature": temperature,
        "top_p": top_p,
        "metrics": {**mean_metrics(per_problem), **({} if trace is None else tool_summary(trace))},
        "seconds": {"generate": round(t1 - t0, 3), "grade": round(t2 - t1, 3)},
        "grader_timeouts": sum(g.reason == "timeout" for g in grades),
        "grade_reasons": reason_counts(grades),
    }
    _add_reflection(results[bench], samples[first:], matcher, tokenizer, texts=own)
    warning = no_answer_warning(grades, bench)
    if warning:
        results[bench]["warning"] = warning


def _phase_progress(progress: ProgressFn | None, bench: str, phase: str, total: int) -> Callable[[int], None] | None:
    """The ``progress`` of one phase (generate, grade) of ``bench``, told that it starts: called with
    each step's count of finished responses. None without a ``progress``."""
    if progress is None:
        return None
    progress(bench, phase, 0, total)

    def advance(k: int) -> None:
        progress(bench, phase, k, total)

    # an engine that reports its decoding steps (hf) calls this with the tokens of each one:
    # phase "tokens" of the same benchmark (the caller's tokens/s and ETA)
    advance.tokens = lambda k: progress(bench, "tokens", k, total)  # type: ignore[attr-defined]
    return advance


def _record_samples(samples: list[dict], bench: str, problems: list[Problem], n: int, completions, grades, trace) -> list[dict]:
    """Append one record per response (its problem, text, extracted answer, grade; with a tool its
    turns and calls) to ``samples``; returns each problem's metrics over its ``n`` responses."""
    per_problem = []
    for i, p in enumerate(problems):
        mine = grades[i * n : (i + 1) * n]
        per_problem.append(problem_metrics([g.extracted for g in mine], [g.correct for g in mine]))
        for j, (text, g) in enumerate(zip(completions[i], mine)):
            samples.append(
                {
                    "benchmark": bench,
                    "problem_id": p.id,
                    "sample": j,
                    "answer": p.answer,
                    "response": text,
                    "extracted": g.extracted,
                    "correct": g.correct,
                    "reason": g.reason,
                    **({} if trace is None else {"turns": int(trace.turns[i * n + j]), "calls": int(trace.calls[i * n + j])}),
                }
            )
    return per_problem


# --------------------------------------------------------------------------------------------
# Training-time validation
# --------------------------------------------------------------------------------------------


def validate(
    model,
    tokenizer,
    benchmarks: list[str],
    val_cfg,
    *,
    tools=None,
    executor=None,
    max_new_tokens: int | None = None,
) -> dict[str, float]:
    """``{"val/<bench>/avg@<n>": ..., "val/<bench>/pass@<k>": ..., "val/<bench>/maj@<n>": ...}``.

    Reads from ``val_cfg`` (all optional): ``n_samples`` (default 1), ``limit`` (first N problems),
    ``temperature`` (0 = greedy), ``top_p``, ``max_new_tokens`` (null: the caller's
    ``max_new_tokens``, the training run's ``rollout.max_new_tokens``; 1024 without one),
    ``prompt`` (boxed), ``chat_template`` (auto), ``batch_size`` (16), ``seed`` (0), ``data_root``,
    ``workers``, ``grade_timeout``. The model's RNG state and train/eval mode are restored afterwards.

    ``tools``: the run's ``tools`` section. With ``tools.enabled`` the samples come through the
    multi-turn driver with the tool (``rollout/multi_turn.py``, as training and ``entropyrl eval``
    sample them), so a tool-using policy is validated with its tool, and each benchmark adds its
    ``val/<bench>/tools/...`` figures (``tool_summary``). ``executor``: the training run's tool
    executor, to share (None: one built from ``tools``)."""
    val_cfg = val_cfg if val_cfg is not None else {}
    get = val_cfg.get
    fallback = {} if max_new_tokens is None else {"max_new_tokens": int(max_new_tokens)}
    settings = EvalSettings.from_cfg(val_cfg, n_samples=1, **fallback)
    names = expand_benchmarks(benchmarks)
    data = {b: load_benchmark(b, get("data_root", None), get("limit", None)) for b in names}
    chat = _use_chat(tokenizer, settings.chat_template)
    engine = build_rollout(
        {"name": "hf", "batch_size": int(get("batch_size", None) or 16), "top_k": 0, "add_special_tokens": not chat},
        model,
        tokenizer,
    )
    if tools is not None and bool(tools.get("enabled", False)):  # the tool run's multi-turn driver
        engine = ToolRollout(
            engine,
            tools,
            executor if executor is not None else build_tool_executor(tools),
            {"add_special_tokens": not chat},
            final_answer=extract_answer,
        )
    results, _ = evaluate(engine, tokenizer, data, settings)
    return flat_metrics(results, prefix="val")


# --------------------------------------------------------------------------------------------
# entropyrl eval
# --------------------------------------------------------------------------------------------


def run_eval(cfg, console=None) -> dict:
    """``entropyrl eval``: see the module docstring. Returns the summary dict."""
    from rich.console import Console

    console = console or Console(stderr=True)
    ev = cfg.eval
    requested = list(cfg.get("benchmarks") or [])
    if cfg.get("benchmark") and cfg.benchmark.get("name"):  # `+benchmark=aime24` (the config group)
        requested.append(str(cfg.benchmark.name))
    names = expand_benchmarks(requested)
    if not names:
        raise UserError(
            "no benchmark given: entropyrl eval BENCH... (one or more of "
            f"{', '.join(available_benchmarks())}, or a .jsonl/.parquet file)"
        )
    limit = ev.get("limit")
    if limit is not None and int(limit) < 1:
        raise UserError(f"eval.limit must be >= 1 (or null for every problem), got {limit}")
    settings = eval_settings(cfg)
    if settings.prompt not in available_templates():
        raise UserError(f"unknown eval.prompt '{settings.prompt}'; valid: {', '.join(available_templates())}")
    data = {b: load_benchmark(b, ev.get("data_root"), limit) for b in names}  # fail fast, before the model
    for line in filter(None, (repeated_note(b, problems) for b, problems in data.items())):
        console.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
    check_tools(cfg.get("tools"))
    tr = cfg.tracking
    if tr.enabled:  # as train does: an unreachable server fails before generating, not after
        check_reachable(resolve_uri(tr))
        short_http_retries()
    out_dir = Path(str(cfg.output_dir))
    fresh = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    began = time.time()
    try:
        return _run_into(cfg, console, out_dir, names, data, settings)
    except BaseException as exc:  # Ctrl-C, SIGTERM, a crash: no empty folder of ours left behind, one line
        wrote = (out_dir / "summary.json").is_file() and (out_dir / "summary.json").stat().st_mtime >= began
        if fresh and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
            line = f"eval stopped before any result: nothing written ({out_dir} removed)"
        elif wrote:
            line = f"eval stopped: the benchmarks it finished are in {out_dir}/summary.json and samples.jsonl"
        else:
            line = f"eval stopped before any result: nothing written ({out_dir} holds an earlier run's files, left as they were)"
        if not isinstance(exc, UserError):  # a user error is its own one line
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        raise


def _run_into(cfg, console, out_dir: Path, names: list[str], data: dict, settings: EvalSettings) -> dict:
    """``run_eval`` from the model on: generate, grade, write into ``out_dir``, log the MLflow run."""
    ev = cfg.eval
    # generation on the CPUs left to this run, as training does: torch's default (one thread per
    # core) beside a busy process makes every parallel region wait for its slowest thread
    threads = apply_threads(ev.threads, option="eval.threads")

    engine, tokenizer, label = make_engine(cfg, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    unreadable = _unrepresentable(data, settings, tokenizer, str(ev.unrepresentable or "warn"))
    for line in unreadable:
        console.print(f"[yellow]warning[/yellow]: {line}", highlight=False)
    started = time.perf_counter()
    results: dict[str, dict] = {}
    samples: list[dict] = []
    under_way: dict[str, str] = {}  # the benchmark and phase (generate, grade) running: what an error names
    ended = _generate_and_grade(cfg, console, engine, tokenizer, data, settings, (results, samples), under_way)

    warnings = unreadable + [r["warning"] for r in results.values() if "warning" in r]  # many responses cut short
    for line in warnings:
        console.print(f"[yellow]warning[/yellow]: {line}", highlight=False)
    if ended is None:
        return _write_results(cfg, out_dir, label, names, results, samples, started, threads, warnings)
    samples = [s for s in samples if s.get("benchmark") in results]  # the unfinished benchmark's are partial
    if isinstance(ended, KeyboardInterrupt):  # Ctrl-C or SIGTERM: the finished benchmarks kept, the run KILLED
        if results:
            doing = f"{under_way.get('phase', 'evaluating')} {under_way.get('benchmark', '?')}"
            line = f"stopped while {doing}: the finished benchmarks ({', '.join(results)}) are kept"
            _write_results(cfg, out_dir, label, names, results, samples, started, threads, warnings, line, status="KILLED")
        raise ended
    error = memory_error(ended, cfg, settings, data, results, under_way, out_dir)
    _write_results(cfg, out_dir, label, names, results, samples, started, threads, warnings, str(error))
    raise error


def _generate_and_grade(
    cfg, console, engine: RolloutEngine, tokenizer, data: dict, settings: EvalSettings, into: tuple[dict, list], under_way: dict
) -> BaseException | None:
    """``evaluate`` into ``into`` under a progress bar, the engine closed after. Returns what stopped it
    early, running out of memory or a stop signal (``KeyboardInterrupt``), with the benchmarks finished
    before it in ``into``; else None. Any other error is raised."""
    ev = cfg.eval
    batch = int(ev.batch_size or 16)
    every = float(ev.heartbeat_s or 30.0)
    try:
        with progress_bar(console) as bar:
            progress = progress_display(bar, console, settings, batch, every, under_way)
            with beating(progress.beat, every):  # a heartbeat line on time, whatever the engine reports
                evaluate(engine, tokenizer, data, settings, progress=progress, into=into)
    except (RuntimeError, MemoryError) as exc:  # out of memory: the finished benchmarks are written after
        if not is_out_of_memory(exc):
            raise
        exc.__traceback__ = None  # the failed batch's tensors go before the results are written
        return exc
    except KeyboardInterrupt as exc:  # stop_signals: Ctrl-C and SIGTERM; a repeat is only recorded
        return exc
    finally:
        engine.close()
    return None
