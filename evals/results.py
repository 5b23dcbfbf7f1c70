"""An evaluation's results in the shapes its readers take: the tool-use figures of a batch of
responses (``tool_summary``, the same in training, validation and evaluation), the mean over
benchmarks (``average_over_benchmarks``), flat metric keys for MLflow and the trainer
(``flat_metrics``: ``<prefix>/<bench>/avg@<n>``, ...), and the table and reflection lines
``entropyrl eval`` prints (``render_table``, ``reflection_lines``)."""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..rollout.base import ToolTrace
from .reflection import ReflectionMatcher, density, reflection_block, reflection_eval_metrics

__all__ = ["average_over_benchmarks", "flat_metrics", "reflection_lines", "render_table", "tool_summary"]

SUMMARY_KEYS = ("avg@n", "pass@1", "maj@n")  # averaged over benchmarks (n differs per benchmark)


def tool_summary(trace) -> dict[str, float]:
    """The tool use of a batch of responses (a ``rollout.ToolTrace``), the same figures in training
    (``trainers/stats/tool_stats.py``), validation and evaluation: ``tools/turns/mean`` and
    ``tools/calls/mean`` per response, ``tools/error_frac`` (calls that errored / calls, 0 without
    a call), ``tools/called_frac`` (responses with a call) and, where the trace counts them,
    ``tools/malformed_frac``, ``/repeated_frac``, ``/void_frac``, ``/not_run_frac`` (responses with a
    malformed call, a repeated call, a void turn, a call written after the first of a message and
    not run)."""
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
