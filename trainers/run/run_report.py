"""What a finished (or stopped) run reports: headline figures from its metric rows, the files rank 0
writes at the end (``write_run_report``), and the live progress bar of the training loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from ...conf import to_plain
from ...core.schema import bind
from ...core.schema.train import Trainer
from ..interventions import INTERVENTIONS
from .plots import plot_attribution, plot_quadrants, plot_reflection, plot_tool_use, plot_training_curves
from .regime import report_regime
from .run_dir import FIGURES, atomic_write_text

__all__ = ["summarize", "validation_text", "async_summary", "async_text", "write_run_report", "TrainingProgress"]


def summarize(rows: list[dict]) -> dict:
    """Headline figures of a run from its metric rows (first/last tenth of entropy, final accuracy)."""
    ent = [r["entropy"] for r in rows if r.get("entropy") is not None]
    out: dict = {}
    if ent:
        tenth = max(1, len(ent) // 10)
        out.update(
            {
                "entropy/first_tenth": float(np.mean(ent[:tenth])),
                "entropy/last_tenth": float(np.mean(ent[-tenth:])),
                "entropy/min": float(np.min(ent)),
            }
        )
    # the task's held-out accuracy, each validation benchmark's avg@n, training accuracy and reward
    bench = sorted({k for r in rows for k in r if k.startswith("val/") and k.rsplit("/", 1)[-1].startswith("avg@")})
    for key in ("val/acc", *bench, "acc/mean", "reward/mean"):
        vals = [r[key] for r in rows if r.get(key) is not None]
        if vals:
            out[f"final/{key}"] = float(vals[-1])
    # responses that got reward.fallback, per reward function and reason, over the whole run
    fallbacks: dict = {}
    for r in rows:
        for key, value in r.items():
            parts = key.split("/")
            if len(parts) == 4 and parts[0] == "reward" and parts[2] == "fallback" and value:
                per = fallbacks.setdefault(parts[1], {})
                per[parts[3]] = per.get(parts[3], 0) + int(value)
    if fallbacks:
        out["reward_fallbacks"] = fallbacks
    return out


def entropy_target(algo_cfg: dict) -> tuple[str, float] | None:
    """``(parameter name, nats)`` of the first configured intervention with an entropy set point
    (``target_param``: STARE's ``h_tgt``, adaptive entropy's ``target``); None when none has one. Pure."""
    names = algo_cfg.get("interventions") or []
    for name in [names] if isinstance(names, str) else names:
        cls = INTERVENTIONS.get(name)
        key = getattr(cls, "target_param", None)
        value = (algo_cfg.get(name) or {}).get(key) if key else None
        if isinstance(value, (int, float)):
            return key, float(value)
    return None


def validation_text(summary: dict) -> str:
    """What was validated, by its own name, for a one-line run ending: ``val acc 0.512`` (the task's
    held-out prompts), ``val math500 avg@4 0.250`` per benchmark, or ``no validation``; never an
    accuracy of something that was not validated."""
    parts = []
    for key, value in summary.items():
        if not key.startswith("final/val/") or not isinstance(value, (int, float)):
            continue
        name = key[len("final/val/") :]
        parts.append(f"val acc {value:.3f}" if name == "acc" else f"val {name.replace('/', ' ')} {value:.3f}")
    return ", ".join(parts) or "no validation"


def async_summary(rows: list[dict], staleness: int) -> dict:
    """What an asynchronous run (``trainer.staleness=k >= 1``) did, from the ``async/*`` metrics its
    steps logged (docs/async.md), for ``summary.json``'s ``async`` block:

    - ``staleness_limit``: ``k``, the most versions a trained batch may lag the trainer;
    - ``staleness_mean`` / ``staleness_max``: the realised lag over the trained steps, the mean of
      ``async/staleness/mean`` and the largest ``async/staleness/max`` (None when no step trained);
    - ``dropped_samples``: ``async/dropped`` summed, the samples thrown away as more than ``k``
      versions old; ``skipped_steps``: the steps that trained nothing because their batch was dropped;
    - ``trainer_idle_frac``: the share of the trainer's step time spent waiting for the rollout queue,
      ``sum(time/generate) / sum(time/step)`` (``time/generate`` is that wait under staleness);
    - ``worker_idle_frac``: the mean of ``async/worker_idle_frac``, the share of the worker's time it
      sat blocked (a full queue, or waiting for recent enough weights) instead of generating;
    - ``overlap``: the share of rollout time hidden behind training, ``1 - wait / rollout``. No metric
      times the worker's generation itself, so a step's rollout time is estimated as its busy share,
      ``1 - async/worker_idle_frac``, of one trainer step (the worker makes one batch per step, so its
      cycle is a step long); ``wait`` is ``time/generate``. Step 1 is left out: it holds
      the worker's start-up (building its model), which nothing can overlap. Clipped to [0, 1]; None
      with no step to measure.

    Only the rows that carry the keys count, so a skipped step or one logged before a key existed
    changes nothing. Pure."""
    trained = [r for r in rows if r.get("async/staleness/mean") is not None]
    lags = [float(r["async/staleness/mean"]) for r in trained]
    maxima = [float(r["async/staleness/max"]) for r in trained if r.get("async/staleness/max") is not None]
    timed = [r for r in trained if r.get("time/generate") is not None and r.get("time/step") is not None]
    step_s = sum(float(r["time/step"]) for r in timed)
    idle = [float(r["async/worker_idle_frac"]) for r in trained if r.get("async/worker_idle_frac") is not None]
    later = [r for r in timed if r.get("step") != 1 and r.get("async/worker_idle_frac") is not None]
    rollout_s = sum((1.0 - float(r["async/worker_idle_frac"])) * float(r["time/step"]) for r in later)
    wait_s = sum(float(r["time/generate"]) for r in later)
    overlap = min(max(1.0 - wait_s / rollout_s, 0.0), 1.0) if rollout_s > 0 else None
    return {
        "staleness_limit": int(staleness),
        "staleness_mean": float(np.mean(lags)) if lags else None,
        "staleness_max": float(max(maxima)) if maxima else None,
        "dropped_samples": int(sum(float(r.get("async/dropped") or 0.0) for r in rows)),
        "skipped_steps": sum(1 for r in rows if r.get("skipped") and r.get("async/dropped")),
        "trainer_idle_frac": sum(float(r["time/generate"]) for r in timed) / step_s if step_s > 0 else None,
        "worker_idle_frac": float(np.mean(idle)) if idle else None,
        "overlap": overlap,
    }


def async_text(block: dict) -> str:
    """The end line of an asynchronous run from its ``async_summary`` block: ``async: k=2, 85% of
    rollout time overlapped training, staleness mean 1.4 max 2, 0 samples dropped``."""
    overlap = (
        "overlap not measured" if block.get("overlap") is None else f"{block['overlap']:.0%} of rollout time overlapped training"
    )
    mean, most = block.get("staleness_mean"), block.get("staleness_max")
    lag = (
        "no step trained"
        if mean is None
        else f"staleness mean {mean:.1f} max {most:g}"
        if most is not None
        else f"staleness mean {mean:.1f}"
    )
    skipped = block.get("skipped_steps") or 0
    dropped = f"{block.get('dropped_samples', 0)} samples dropped" + (f" ({skipped} steps skipped)" if skipped else "")
    return f"async: k={block['staleness_limit']}, {overlap}, {lag}, {dropped}"


def write_run_report(
    rows: list[dict], cfg, output_dir: Path, tracker, status: str, run_facts: dict, log: Callable = print
) -> dict:
    """Rank 0 at the end of a run: ``summary.json`` (``summarize``, ``report_regime``'s warnings, flags
    and fits, then ``run_facts``), ``curves.png`` (with the intervention's target, its gate and the
    collapse flag drawn in), ``quadrants.png``, ``why_entropy_moved.png``, ``reflection.png`` and (with
    tools) ``tools.png``, each
    logged to MLflow with ``metrics.jsonl``; the MLflow run is finished with ``status`` whatever
    happens to the files. Returns the summary."""
    summary = summarize(rows)
    summary.update(report_regime(rows, cfg, tracker, log=log))  # warnings, flags, r
    summary.update(run_facts)
    staleness = bind(Trainer, cfg.trainer).staleness  # a config from before the key: the schema's default, synchronous
    if staleness > 0:  # an asynchronous run says what its overlap and staleness were (async_summary)
        summary["async"] = async_summary(rows, staleness)
        log(async_text(summary["async"]))
    figures: list[Path | None] = []
    if rows:
        try:  # written beside and renamed: a full disk leaves the old figure, never 0 bytes
            title = f"{cfg.algo.name} on {cfg.data.name} (seed {cfg.trainer.seed})"
            collapse = next((f.get("first_step") for f in summary.get("flags", []) if f.get("id") == "collapse"), None)
            figures = [
                plot_training_curves(
                    rows,
                    output_dir / FIGURES["curves"],
                    title=title,
                    target=entropy_target(to_plain(cfg.algo)),
                    collapse_step=collapse,
                ),
                plot_quadrants(rows, output_dir / FIGURES["quadrants"], title=f"four quadrants: {title}"),
                plot_attribution(rows, output_dir / FIGURES["attribution"], title=f"why entropy moved: {title}"),
                plot_reflection(rows, output_dir / FIGURES["reflection"], title=f"reflection and length: {title}"),
                plot_tool_use(rows, output_dir / FIGURES["tools"], title=f"tool use: {title}"),
            ]
        except OSError:
            figures = []
    try:
        atomic_write_text(output_dir / "summary.json", json.dumps(summary, indent=2))
        for path in (*figures, output_dir / "summary.json", output_dir / "metrics.jsonl"):
            if path is not None:
                tracker.log_artifact(path)
    finally:  # a full disk loses the summary file, never the run's final state
        tracker.finish(status)
    return summary


#: Seconds between the training loop's heartbeat lines when stderr is not a terminal (a log file,
#: a SLURM job's output), where the bar does not draw until the run ends; the first step's line comes at once.
HEARTBEAT_S = 60.0


class TrainingProgress:
    """A rich progress bar showing step, entropy and reward live (silent when disabled); into a log
    (stderr not a terminal) a line at the first step and then every ``heartbeat_s`` seconds, with
    the seconds per step and the time left."""

    def __init__(self, enabled: bool, total: int, start: int, heartbeat_s: float = HEARTBEAT_S):
        self.enabled, self.total, self.start, self.heartbeat_s = enabled, total, start, heartbeat_s

    def __enter__(self):
        if not self.enabled:
            return lambda step, metrics: None
        import time

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self.progress.__enter__()
        self.task = self.progress.add_task("train", total=self.total, completed=self.start, info="")
        began, last = time.perf_counter(), [None]

        def update(step, m):
            info = f"entropy {m.get('entropy', float('nan')):.3f}  reward {m.get('reward/mean', float('nan')):.3f}" + (
                f"  val {m['val/acc']:.3f}" if "val/acc" in m else ""
            )
            self.progress.update(self.task, completed=step, info=info)
            now, console = time.perf_counter(), self.progress.console
            if console.is_terminal or (last[0] is not None and now - last[0] < self.heartbeat_s):
                return
            last[0], per_step = now, (now - began) / max(step - self.start, 1)
            console.print(
                f"train {step}/{self.total}: {info}, {per_step:.1f} s/step, ETA {per_step * (self.total - step):.0f} s",
                markup=False,
                highlight=False,
            )

        return update

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)
        return False
