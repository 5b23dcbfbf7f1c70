"""The ``async/*`` metrics of a step trained from the rollout worker's batches: how many versions
behind its samples were generated (``staleness_counts``, ``staleness_histogram``), and the
trainer's side of the step (``async_step_metrics``: its idle share, throughput and the entropy gap
between the behaviour and the current policy)."""

from __future__ import annotations

from .channel import StaleBatch

__all__ = ["async_step_metrics", "staleness_counts", "staleness_histogram"]


def _rows_of(item: StaleBatch) -> int:
    """The samples of a worker's batch (0 when its step kept none)."""
    batch = item.collected[0]
    return 0 if batch is None else len(batch)


def staleness_counts(lag: int, rows: int, staleness: int) -> list[float]:
    """``[k + 1]``: ``rows`` trained samples at index ``lag`` (versions behind the trainer,
    ``0 <= lag <= staleness``), 0 elsewhere: one batch per step and rank, so one version."""
    if not 0 <= lag <= staleness:
        raise ValueError(f"a trained batch {lag} versions behind is outside the staleness bound {staleness}")
    counts = [0.0] * (int(staleness) + 1)
    counts[int(lag)] = float(rows)
    return counts


def staleness_histogram(counts) -> dict[str, float]:
    """``async/staleness/frac_<j>`` for ``j = 0..k``: the share of the step's trained samples
    generated ``j`` versions behind, from ``counts [k + 1]`` (samples at each lag, every rank's
    summed); empty when no sample was trained."""
    values = [float(c) for c in counts]
    total = sum(values)
    if total <= 0:
        return {}
    return {f"async/staleness/frac_{j}": c / total for j, c in enumerate(values)}


def async_step_metrics(metrics: dict, rows: int) -> dict[str, float]:
    """The trainer's side of a step under staleness, from its metrics (``time/generate``: the wait
    for the queue, ``time/step``, ``entropy``: the current policy's, recomputed by ``_score``):
    ``async/trainer_idle_frac``, ``async/samples_per_s`` and ``async/entropy_gap`` (behaviour
    minus current)."""
    step_s = max(float(metrics["time/step"]), 1e-9)
    out = {"async/trainer_idle_frac": float(metrics["time/generate"]) / step_s, "async/samples_per_s": rows / step_s}
    if "async/entropy_behaviour" in metrics and "entropy" in metrics:
        out["async/entropy_gap"] = float(metrics["async/entropy_behaviour"]) - float(metrics["entropy"])
    return out
