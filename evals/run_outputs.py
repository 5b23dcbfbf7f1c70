"""What ``entropyrl eval`` leaves behind: ``samples.jsonl`` and ``summary.json`` in its output folder
and an MLflow run (``_write_results``, ``_log_mlflow``), FINISHED, or FAILED with the one line that
ended it; for a run out of memory that line is ``memory_error``'s: what ran out, where, the keys
that lower it, and what is kept."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Mapping

from ..core.errors import UserError
from ..core.files import atomic_write_lines, atomic_write_text
from ..core.mlflow_store import resolve_uri
from ..core.oom import memory_kind
from ..core.tracking import TrackingStore
from ..models.loading import checkpoint_label
from .benchmarks import get_spec
from .results import average_over_benchmarks, flat_metrics
from .settings import EvalSettings

__all__ = ["memory_error"]


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
    status: str | None = None,
) -> dict:
    """Write ``samples.jsonl`` and ``summary.json`` into ``out_dir`` and log the MLflow run, FINISHED,
    or FAILED with ``error`` (the line that ended the eval; ``results`` then holds the benchmarks
    finished before it), or ``status`` (KILLED: stopped by a signal). Returns the summary."""
    from omegaconf import OmegaConf

    metrics = flat_metrics(results, prefix="eval")
    samples_path, summary_path = out_dir / "samples.jsonl", out_dir / "summary.json"
    atomic_write_lines(samples_path, (json.dumps(s) for s in samples))
    status = status or ("FINISHED" if error is None else "FAILED")
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
        if str(ev.backend) == "hf":
            advice.append(f"lower eval.batch_size (now {int(ev.batch_size or 16)})")
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
    if bool(cfg.tracking.enabled):
        kept += "; the MLflow run ended FAILED"
    return UserError(
        f"out of {memory_kind(exc)} while {doing} {bench} ({said}): " + "; ".join(advice) + f"; {kept}; run "
        f"`entropyrl eval {' '.join(unfinished)} ...` with those changes for the rest"
    )


def _log_mlflow(
    cfg, results, metrics: dict[str, float], files: list[Path], label: str, names: list[str], status: str = "FINISHED"
) -> tuple[str | None, str | None]:
    tr = cfg.tracking
    if not tr.enabled:
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
