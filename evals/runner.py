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
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..conf import to_plain
from ..core.errors import UserError
from ..core.files import atomic_write_lines, atomic_write_text
from ..core.mlflow_store import resolve_uri
from ..core.oom import is_out_of_memory, memory_kind
from ..core.outbox import short_http_retries
from ..core.resources import apply_threads
from ..core.tracking import TrackingStore, check_reachable
from ..models.loading import checkpoint_label, install_chat_template, load_policy, model_dir, resolve_model_path, stop_tokens
from ..models.tiny import check_representable, representable
from ..rollout.base import RolloutEngine, ToolTrace, build_rollout, rollout_engine
from ..rollout.multi_turn import ToolRollout
from ..tasks.problem import Problem
from .benchmarks import available_benchmarks, expand_benchmarks, get_spec, load_benchmark
from .code.code_eval import evaluate_code, is_code_problem
from .code.tool_executor import build_tool_executor, check_tools
from .generation import GenerationMeter, sample_texts
from .grading.answer_extraction import extract_answer
from .grading.grader import DEFAULT_TIMEOUT, grade_batch, no_answer_warning, reason_counts
from .metrics import mean_metrics, problem_metrics
from .prompts import available_templates, build_prompts, chat_use
from .reflection import ReflectionMatcher, density, matcher_for, reflection_block, reflection_eval_metrics, resolve_words

__all__ = ["EvalSettings", "eval_settings", "evaluate", "memory_error", "run_eval", "validate", "render_table"]

SUMMARY_KEYS = ("avg@n", "pass@1", "maj@n")  # averaged over benchmarks (n differs per benchmark)


@dataclass
class EvalSettings:
    """Decoding and grading settings; None = the benchmark's reference value."""

    n_samples: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int = 1024
    seed: int = 0
    prompt: str = "boxed"
    chat_template: Any = "auto"
    workers: int | None = None
    grade_timeout: float = DEFAULT_TIMEOUT
    sandbox: Any = None  # code benchmarks: SandboxLimits keys over the benchmark's (eval.sandbox)
    reflection_words: Any = "default"  # evals/reflection.py: a list name, a list of words, or [] (no reflection block)

    @classmethod
    def from_cfg(cls, cfg: Mapping, **fallback) -> EvalSettings:
        get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: d)

        def pick(key, default):
            value = get(key, None)
            return default if value is None else value

        s = cls(
            n_samples=pick("n_samples", fallback.get("n_samples")),
            temperature=pick("temperature", fallback.get("temperature")),
            top_p=pick("top_p", fallback.get("top_p")),
            max_new_tokens=int(pick("max_new_tokens", fallback.get("max_new_tokens", 1024))),
            seed=int(pick("seed", fallback.get("seed", 0))),
            prompt=str(pick("prompt", fallback.get("prompt", "boxed"))),
            chat_template=pick("chat_template", fallback.get("chat_template", "auto")),
            workers=pick("workers", fallback.get("workers")),
            grade_timeout=float(pick("grade_timeout", fallback.get("grade_timeout", DEFAULT_TIMEOUT))),
            sandbox=pick("sandbox", fallback.get("sandbox")),
            reflection_words=to_plain(get("reflection_words", fallback.get("reflection_words", "default"))),
        )
        if s.n_samples is not None and int(s.n_samples) < 1:
            raise UserError(f"eval.n_samples must be >= 1 (or null for the benchmark default), got {s.n_samples}")
        if s.grade_timeout <= 0:
            raise UserError(f"eval.grade_timeout must be > 0 seconds, got {s.grade_timeout}")
        return s


ProgressFn = Callable[[str, str, int, int], None]  # (benchmark, phase, advance, total)


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
            samples += recs
            continue
        n = int(settings.n_samples or spec.n_samples)
        temperature = float(spec.temperature if settings.temperature is None else settings.temperature)
        top_p = float(spec.top_p if settings.top_p is None else settings.top_p)
        total = n * len(problems)
        prompts = build_prompts(problems, settings.prompt, tokenizer, settings.chat_template)

        def tick(phase: str, bench: str = bench, total: int = total) -> Callable[[int], None] | None:
            if progress is None:
                return None
            progress(bench, phase, 0, total)

            def advance(k: int) -> None:
                progress(bench, phase, k, total)

            # an engine that reports its decoding steps (hf) calls this with the tokens of each one:
            # phase "tokens" of the same benchmark (the caller's tokens/s and ETA)
            advance.tokens = lambda k: progress(bench, "tokens", k, total)  # type: ignore[attr-defined]
            return advance

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
            progress=tick("generate"),
            traces=traces,
            own_texts=own,
        )
        trace = traces[0] if traces else None  # multi-turn with a tool: turns and calls per response
        t1 = time.perf_counter()
        flat = [c for group in completions for c in group]
        golds = [p.answer for p in problems for _ in range(n)]
        grades = grade_batch(flat, golds, workers=settings.workers, timeout=settings.grade_timeout, progress=tick("grade"))
        t2 = time.perf_counter()
        per_problem, first = [], len(samples)
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
    return results, samples


def _add_reflection(
    result: dict, recs: list[dict], matcher: ReflectionMatcher, tokenizer, texts: list[str] | None = None
) -> None:
    """Each sample's ``reflection`` block (count, density per 1k model tokens) and the benchmark's
    ``reflection`` figures (``reflection@n``, share, precision and recall against correctness:
    ``evals/reflection.py``); nothing when the word list is empty. ``texts``: what each sample's
    policy wrote, one per record (with a tool, its outputs left out: ``generation.policy_texts``);
    None: each record's ``response``."""
    if not matcher.enabled or not recs:
        return
    if texts is None:
        texts = [str(r.get("response", "")) for r in recs]
    elif len(texts) != len(recs):
        raise ValueError(f"_add_reflection: {len(texts)} texts for {len(recs)} samples")
    counts = None
    if tokenizer is not None:
        counts = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    by_problem: dict[Any, tuple[list[bool], list[bool]]] = {}
    for i, (rec, text) in enumerate(zip(recs, texts)):
        rec["reflection"] = reflection_block(text, matcher, None if counts is None else counts[i])
        flags = by_problem.setdefault(rec.get("problem_id"), ([], []))
        flags[0].append(rec["reflection"]["count"] > 0)
        flags[1].append(bool(rec.get("correct")))
    blocks = [r["reflection"] for r in recs]
    figures = reflection_eval_metrics([f[0] for f in by_problem.values()], [f[1] for f in by_problem.values()])
    result["reflection"] = {
        **{k: (v if math.isfinite(v) else None) for k, v in figures.items()},  # None: undefined
        "reflection/density": density(sum(b["count"] for b in blocks), sum(b["tokens"] for b in blocks)),
        "words": list(matcher.words),
    }


def tool_summary(trace) -> dict[str, float]:
    """The tool use of a batch of responses (a ``rollout.ToolTrace``), the same figures in training
    (``trainers/stats/tool_stats.py``), validation and evaluation: ``tools/turns/mean`` and
    ``tools/calls/mean`` per response, ``tools/error_frac`` (calls that errored / calls, 0 without
    a call), ``tools/called_frac`` (responses with a call) and, where the trace counts them,
    ``tools/malformed_frac``, ``/repeated_frac``, ``/void_frac`` (responses with a malformed call,
    a repeated call, a void turn)."""
    calls = float(trace.calls.sum())
    out = {
        "tools/turns/mean": float(trace.turns.float().mean()),
        "tools/calls/mean": float(trace.calls.float().mean()),
        "tools/error_frac": float(trace.errors.sum()) / calls if calls else 0.0,
        "tools/called_frac": float((trace.calls > 0).float().mean()),
    }
    for name in ToolTrace.ROW_COUNTS:
        counts = getattr(trace, name)
        if counts is not None:
            out[f"tools/{name}_frac"] = float((counts > 0).float().mean())
    return out


def average_over_benchmarks(results: Mapping[str, dict]) -> dict[str, float]:
    """Mean over benchmarks of avg@n, pass@1 and maj@n (each benchmark at its own n)."""
    if not results:
        return {}
    out = {}
    for key in SUMMARY_KEYS:
        vals = []
        for r in results.values():
            name = key.replace("@n", f"@{r['n_samples']}")
            if name in r["metrics"]:
                vals.append(r["metrics"][name])
        if vals:
            out[key] = sum(vals) / len(vals)
    return out


def flat_metrics(results: Mapping[str, dict], prefix: str = "eval") -> dict[str, float]:
    """``{"eval/<bench>/avg@32": ..., "eval/average/avg@n": ...}``."""
    out = {f"{prefix}/{b}/{k}": float(v) for b, r in results.items() for k, v in r["metrics"].items()}
    out.update(
        {
            f"{prefix}/{b}/{k}": float(v)
            for b, r in results.items()
            for k, v in r.get("reflection", {}).items()
            if isinstance(v, (int, float)) and math.isfinite(v)
        }
    )
    if len(results) > 1:
        out.update({f"{prefix}/average/{k}": float(v) for k, v in average_over_benchmarks(results).items()})
    return out


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


def _use_chat(tokenizer, chat_template) -> bool:
    use = chat_use(chat_template)  # "auto" | True | False: a template string is True, "none" False
    if use == "auto":
        return bool(getattr(tokenizer, "chat_template", None))
    return bool(use)


# --------------------------------------------------------------------------------------------
# entropyrl eval
# --------------------------------------------------------------------------------------------


def _chat_setting(cfg) -> Any:
    """eval.chat_template, falling back to model.chat_template (false for the embedded model): what
    ``install_chat_template`` takes (auto, true, false/none, or a Jinja template string)."""
    ev = cfg.eval.get("chat_template", "auto")
    if ev not in (None, "auto"):
        return ev
    return cfg.model.get("chat_template", None) if "model" in cfg else None


def _chat_option(cfg) -> str:
    """The key ``_chat_setting`` read, for its error messages."""
    return "eval.chat_template" if cfg.eval.get("chat_template", "auto") not in (None, "auto") else "model.chat_template"


def _device(setting: str):
    import torch

    if setting in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(str(setting))
    except RuntimeError:
        raise UserError(f"eval.device '{setting}' is not a torch device (auto, cpu, cuda, cuda:1...)") from None


def make_engine(cfg, log: Callable[[str], None] = print) -> tuple[RolloutEngine, Any, str]:
    """``(engine, tokenizer, model_label)`` for ``cfg.model`` and ``cfg.eval.backend``.

    An engine that starts from the model's folder (``loads_from_path``: vLLM) gets that folder as
    ``model_path`` and no model; any other gets the model loaded here, on ``eval.device``. Its
    config: ``eval.batch_size``, ``eval.seed``, no top-k, then the ``eval.<backend>`` section."""
    ev = cfg.eval
    backend = str(ev.get("backend", "hf"))
    engine_cls = rollout_engine(backend, "eval.backend")
    label = str(cfg.model.get("path") or cfg.model.get("name") or "model")
    if cfg.model.get("path"):  # a checkpoint / run folder -> its model folder (said in the log)
        label = resolve_model_path(label, log=log)
    engine_cfg = {
        "name": backend,
        "option": "eval.backend",
        "batch_size": int(ev.get("batch_size", 16) or 16),
        "top_k": 0,
        "seed": int(ev.get("seed", 0)),
        "dtype": cfg.model.get("dtype") or None,
    }
    engine_cfg.update({k: v for k, v in (to_plain(ev.get(backend, None)) or {}).items() if v is not None})
    if getattr(engine_cls, "loads_from_path", False):
        from transformers import AutoTokenizer

        path = model_dir(cfg.model, log=log)  # the converted GGUF folder, model.path's model, or the embedded one
        model, tokenizer = None, AutoTokenizer.from_pretrained(path)
        engine_cfg["model_path"] = path
        # model.stop_tokens (a chat model's end of turn): the folder's generation_config knows only its EOS
        engine_cfg["extra_stop_ids"] = stop_tokens(cfg.model, tokenizer)
    else:
        model_cfg = {**(to_plain(cfg.model) or {}), "path": label} if cfg.model.get("path") else cfg.model
        model, tokenizer = load_policy(model_cfg, log=log)
        model.to(_device(ev.get("device", "auto")))
    # the template asked for (eval's, else the model's) on the tokenizer the prompts are built with
    chat = install_chat_template(tokenizer, _chat_setting(cfg), option=_chat_option(cfg))
    engine_cfg["add_special_tokens"] = not _use_chat(tokenizer, chat)
    engine = engine_cls(engine_cfg, model, tokenizer)
    tools = cfg.get("tools")
    if tools is not None and bool(tools.get("enabled", False)):  # tools=code_interpreter: multi-turn
        engine = ToolRollout(engine, tools, build_tool_executor(tools), engine_cfg, final_answer=extract_answer)
    return engine, tokenizer, label


def _unrepresentable(data: Mapping[str, list], settings: EvalSettings, tokenizer, mode: str) -> list[str]:
    """One counted line per benchmark whose prompts hold characters the model cannot represent
    (``eval.unrepresentable: warn``; ``error``: a ``UserError`` naming the rows, the characters and the
    fix). The embedded model reads digits and a few symbols only: a benchmark with it is a smoke run
    of the pipeline, said so rather than silently scored on prompts it never saw."""
    lines = []
    for source, problems in data.items():
        if not problems or is_code_problem(problems[0]):
            continue
        prompts = build_prompts(problems, settings.prompt, tokenizer, settings.chat_template)
        note = check_representable(
            tokenizer,
            prompts,
            [p.id or str(i) for i, p in enumerate(problems)],
            what=f"eval {get_spec(source).name}",
            option="eval.unrepresentable",
            mode=mode,
        )
        if note:
            lines.append(note)
            kept = representable(tokenizer, prompts)  # a prompt of which nothing is left: out, and counted in the note
            if not kept:
                raise UserError(
                    f"eval {get_spec(source).name}: no prompt keeps a character the model can represent, so there is "
                    "nothing to generate from: use a real model (e.g. model=smollm2-135m)"
                )
            if len(kept) < len(problems):
                data[source][:] = [problems[i] for i in kept]
    return lines


def render_table(results: Mapping[str, dict], title: str = "entropyrl eval"):
    from rich.table import Table

    table = Table(title=title)
    for col in ("benchmark", "problems", "n", "avg@n", "pass@k (k=1,2,4..)", "maj@n"):
        table.add_column(col, justify="left" if col == "benchmark" else "right")
    for b, r in results.items():
        n, m = r["n_samples"], r["metrics"]
        passes = "  ".join(f"{m[k]:.3f}" for k in m if k.startswith("pass@"))
        maj = f"{m[f'maj@{n}']:.3f}" if f"maj@{n}" in m else "-"  # code benchmarks have no maj@n
        table.add_row(b, str(r["problems"]), str(n), f"{m[f'avg@{n}']:.3f}", passes, maj)
    if len(results) > 1:
        avg = average_over_benchmarks(results)
        table.add_row(
            "[bold]average[/bold]",
            "",
            "",
            f"{avg.get('avg@n', math.nan):.3f}",
            f"{avg.get('pass@1', math.nan):.3f} (pass@1)",
            f"{avg.get('maj@n', math.nan):.3f}",
        )
    return table


def reflection_lines(results: Mapping[str, dict]) -> list[str]:
    """One line per benchmark with a ``reflection`` block: reflection@n, the share of reflecting
    samples, their precision and recall against correctness, density per 1k tokens."""
    out = []
    for b, r in results.items():
        ref = r.get("reflection")
        if not ref:
            continue
        at = next(k for k in ref if k.startswith("reflection@"))
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731  (None: no sample reflects / is correct)
        out.append(
            f"{b}: {at} {fmt(ref[at])}, reflecting samples {fmt(ref['reflection/frac'])}, precision "
            f"{fmt(ref['reflection/precision'])}, recall {fmt(ref['reflection/recall'])} (against correctness), "
            f"{ref['reflection/density']:.2f} per 1k tokens"
        )
    return out


def _log_mlflow(
    cfg, results, metrics: dict[str, float], files: list[Path], label: str, names: list[str], status: str = "FINISHED"
) -> tuple[str | None, str | None]:
    tr = cfg.get("tracking") or {}
    if not tr.get("enabled", True):
        return None, None
    import logging

    from omegaconf import OmegaConf

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # no "Creating initial tables" chatter
    uri = resolve_uri(tr)
    try:
        store = TrackingStore(uri)
        tags = {str(k): str(v) for k, v in (tr.get("tags") or {}).items()}
        tags.update({"entropyrl.command": "eval", "entropyrl.output_dir": str(Path(cfg.output_dir).resolve())})
        run_name = tr.get("run_name") or f"eval-{checkpoint_label(label)}-{'-'.join(names)[:60]}"
        params = {f"eval.{k}": str(v) for k, v in OmegaConf.to_container(cfg.eval, resolve=True).items()}
        params.update({"model": label, "benchmarks": ",".join(names)})
        params.update({f"eval.n_samples.{b}": str(r["n_samples"]) for b, r in results.items()})
        run_id = store.open_run(
            str(tr.get("experiment") or "entropyrl"),
            str(run_name),
            tags=tags,
            params=params,
            parent_run_id=tr.get("parent_run_id"),
        )
        try:
            store.log_metrics(run_id, metrics)
            for f in files:
                store.log_artifact(run_id, f)
        except BaseException as exc:  # Ctrl-C, SIGTERM or the store failing half-way: the run closed, not RUNNING
            with contextlib.suppress(Exception):
                store.finish(run_id, status="KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
            raise
        store.finish(run_id, status=status)
        return run_id, uri
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - tracking store trouble is the user's setup
        raise UserError(
            f"cannot log the eval to MLflow at {uri}: {str(exc).splitlines()[0]} "
            f"(check MLFLOW_TRACKING_URI/tracking.uri, or tracking.enabled=false)"
        ) from None


def eval_settings(cfg) -> EvalSettings:
    """The settings of ``entropyrl eval`` from a composed ``conf/eval.yaml``: ``eval.*``, where null the
    model preset's ``model.eval.*`` (a 135M model needs neither 1024 tokens nor many samples to
    start), where null too the benchmark's reference values (``evaluate``)."""
    preset = {k: v for k, v in (to_plain(cfg.model.get("eval", None)) or {}).items() if v is not None}
    settings = EvalSettings.from_cfg(cfg.eval, **preset)
    settings.chat_template = _chat_setting(cfg)
    return settings


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
    check_tools(cfg.get("tools"))
    tr = cfg.get("tracking") or {}
    if tr.get("enabled", True):  # as train does: an unreachable server fails before generating, not after
        check_reachable(resolve_uri(tr))
        short_http_retries()
    out_dir = Path(str(cfg.output_dir))
    fresh = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _run_into(cfg, console, out_dir, names, data, settings)
    except BaseException as exc:  # Ctrl-C, SIGTERM, a crash: no empty folder of ours left behind, one line
        if fresh and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
            line = f"eval stopped before any result: nothing written ({out_dir} removed)"
        else:
            line = f"eval stopped: what it wrote is in {out_dir}"
        if not isinstance(exc, UserError):  # a user error is its own one line
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        raise


def _run_into(cfg, console, out_dir: Path, names: list[str], data: dict, settings: EvalSettings) -> dict:
    """``run_eval`` from the model on: generate, grade, write into ``out_dir``, log the MLflow run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    ev = cfg.eval
    # generation on the CPUs left to this run, as training does: torch's default (one thread per
    # core) beside a busy process makes every parallel region wait for its slowest thread
    threads = apply_threads(ev.get("threads", 0), option="eval.threads")

    engine, tokenizer, label = make_engine(cfg, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    unreadable = _unrepresentable(data, settings, tokenizer, str(ev.get("unrepresentable", "warn") or "warn"))
    for line in unreadable:
        console.print(f"[yellow]warning[/yellow]: {line}", highlight=False)
    started = time.perf_counter()
    batch = int(ev.get("batch_size", 16) or 16)
    every = float(ev.get("heartbeat_s", 30.0) or 30.0)
    results: dict[str, dict] = {}
    samples: list[dict] = []
    under_way: dict[str, str] = {}  # the benchmark and phase (generate, grade) running: what an error names
    out_of_memory: BaseException | None = None
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[meter]}"),
            console=console,
            transient=False,
        ) as bar:
            tasks: dict[tuple[str, str], int] = {}
            meters: dict[str, GenerationMeter] = {}

            def progress(bench: str, phase: str, advance: int, total: int) -> None:
                meter = meters.get(bench)
                if phase == "tokens":  # one decoding step of the generate phase (hf)
                    if meter is not None:
                        meter.tokens(advance)
                        _show(bench, meter)
                    return
                under_way.update(benchmark=bench, phase=phase)
                key = (bench, phase)
                if key not in tasks:
                    tasks[key] = bar.add_task(f"{phase:8s} {bench}", total=total, meter="")
                    if phase == "generate":
                        meters[bench] = meter = GenerationMeter(total, settings.max_new_tokens, batch, every_s=every)
                        if not console.is_terminal:  # a log file: say what starts, then a heartbeat line
                            console.print(
                                f"generate {bench}: {total} responses of up to {settings.max_new_tokens} tokens, {batch} at once",
                                markup=False,
                                highlight=False,
                            )
                if advance:
                    bar.advance(tasks[key], advance)
                    if phase == "generate" and meter is not None:
                        meter.sequences(advance)
                        _show(bench, meter)

            def _show(bench: str, meter: GenerationMeter) -> None:
                bar.update(tasks[(bench, "generate")], meter=meter.line())
                if not console.is_terminal and meter.due():
                    console.print(f"generate {bench}: {meter.line()}", markup=False, highlight=False)

            evaluate(engine, tokenizer, data, settings, progress=progress, into=(results, samples))
    except (RuntimeError, MemoryError) as exc:  # out of memory: the finished benchmarks are written below
        if not is_out_of_memory(exc):
            raise
        exc.__traceback__ = None  # the failed batch's tensors go before the results are written
        out_of_memory = exc
    finally:
        engine.close()

    warnings = unreadable + [r["warning"] for r in results.values() if "warning" in r]  # many responses cut short
    for line in warnings:
        console.print(f"[yellow]warning[/yellow]: {line}", highlight=False)
    if out_of_memory is not None:
        samples = [s for s in samples if s.get("benchmark") in results]  # the failed benchmark's are partial
        error = memory_error(out_of_memory, cfg, settings, data, results, under_way, out_dir)
        _write_results(cfg, out_dir, label, names, results, samples, started, threads, warnings, str(error))
        raise error
    return _write_results(cfg, out_dir, label, names, results, samples, started, threads, warnings)


def _write_results(
    cfg,
    out_dir: Path,
    label: str,
    names: list[str],
    results: dict,
    samples: list[dict],
    started: float,
    threads: int,
    warnings: list[str],
    error: str | None = None,
) -> dict:
    """Write ``samples.jsonl`` and ``summary.json`` into ``out_dir`` and log the MLflow run, FINISHED,
    or FAILED with ``error`` (the line that ended the eval; ``results`` then holds the benchmarks
    finished before it). Returns the summary."""
    from omegaconf import OmegaConf

    metrics = flat_metrics(results, prefix="eval")
    samples_path, summary_path = out_dir / "samples.jsonl", out_dir / "summary.json"
    atomic_write_lines(samples_path, (json.dumps(s) for s in samples))
    status = "FINISHED" if error is None else "FAILED"
    summary = {
        "model": label,
        "status": status,
        **({} if error is None else {"error": error}),
        "benchmarks": results,
        "average": average_over_benchmarks(results),
        "metrics": metrics,
        "output_dir": str(out_dir.resolve()),
        "seconds": round(time.perf_counter() - started, 3),
        "threads": threads,
        "warnings": warnings,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    atomic_write_text(summary_path, json.dumps(summary, indent=2))
    run_id, uri = _log_mlflow(cfg, results, metrics, [samples_path, summary_path], label, names, status=status)
    if run_id:
        summary.update({"mlflow_run_id": run_id, "tracking_uri": uri})
        atomic_write_text(summary_path, json.dumps(summary, indent=2))
    return summary


def memory_error(
    exc: BaseException, cfg, settings: EvalSettings, data: Mapping, results: Mapping, under_way: Mapping, out_dir: Path
) -> UserError:
    """The one line for an eval that ran out of memory (``exc``): what ran out and where (the
    benchmark and phase ``under_way``, else the first unfinished one), the keys that lower it, and
    what is kept (the benchmarks in ``results``) with the command's arguments that finish the rest."""
    ev = cfg.eval
    unfinished = [source for source in data if get_spec(source).name not in results]
    started = under_way.get("benchmark") not in (None, *results)  # else it failed before its first phase
    bench = under_way["benchmark"] if started else (get_spec(unfinished[0]).name if unfinished else "?")
    phase = under_way.get("phase") if started else None
    doing = {"generate": "generating", "grade": "grading"}.get(str(phase), "evaluating")
    said = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    said = said if len(said) <= 160 else said[:157] + "..."
    spec = next((get_spec(source) for source in unfinished if get_spec(source).name == bench), None)
    n = int(settings.n_samples or (spec.n_samples if spec is not None else 1))
    advice = []
    if doing == "grading":
        advice.append(f"fewer grading processes, eval.workers (now {settings.workers or 'one per CPU'})")
    else:
        if str(ev.get("backend", "hf")) == "hf":
            advice.append(f"lower eval.batch_size (now {int(ev.get('batch_size', 16) or 16)})")
        advice.append(f"shorten eval.max_new_tokens (now {settings.max_new_tokens})")
    advice.append(f"fewer samples per problem, eval.n_samples (now {n})")
    advice.append(f"fewer problems, eval.limit (now {ev.get('limit') or 'all'})")
    if results:
        kept = (
            f"the finished benchmark{'s' if len(results) > 1 else ''} ({', '.join(results)}) "
            f"{'are' if len(results) > 1 else 'is'} kept in {out_dir}/summary.json and samples.jsonl"
        )
    else:
        kept = "no benchmark had finished"
    if bool((cfg.get("tracking") or {}).get("enabled", True)):
        kept += "; the MLflow run ended FAILED"
    return UserError(
        f"out of {memory_kind(exc)} while {doing} {bench} ({said}): " + "; ".join(advice) + f"; {kept}; run "
        f"`entropyrl eval {' '.join(unfinished)} ...` with those changes for the rest"
    )
