"""What ``diagnostics.attribution`` costs per training step, against the same step without it.

Setting: the lab configuration (``experiment=lab_grpo``: the warm-started tiny model on countdown,
32 prompts x 4 responses per step, two mini-batches, the probe batch re-scored every step), one
torch thread, CPU. Three trainers of the same seed, built in this process:

- ``off``: ``diagnostics.attribution=false`` (the lab's default);
- ``every_10``: ``diagnostics.attribution=true diagnostics.attribution_every=10``;
- ``every_step``: ``diagnostics.attribution_every=1``, for scale (fewer steps).

Their steps run round-robin (one step of each in turn), so the machine's load falls on all three
alike. The first step of each (it samples the probe batch and warms up) is not timed; ``off`` and
``every_10`` then time ``STEPS`` steps, two of them measured (steps 10 and 20), the share a long
run has. Reported: seconds per step (mean: the measured steps' cost spread over the run, as in a
run's wall time; and median), ``every_10_vs_off`` (ratio of the means, target <= 1.25),
``every_10_vs_off_medians`` (the same run composed from medians: ``every_10``'s plain steps and
``every_step``'s measured ones, each at its median, in ``every_10``'s proportions; insensitive to a
load spike landing on one of the two measured steps),
``every_step_vs_off`` and ``measured_step_vs_off_medians``; ``meets_target`` holds both. ``calls`` counts, per trainer, the probe-gradient computations (``g_H``) and
the micro-batches split into parts: ``off`` must show none (``off_pays_nothing``).
Validation and checkpoints are not run (they are the same in all three): the ratio is of the
training step alone, an upper bound on the share of a lab run's wall time.

    .venv/bin/python perf/attribution.py
"""

from __future__ import annotations

import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

STEPS, SCALE_STEPS, EVERY = 20, 6, 10
TARGET = 1.25
VARIANTS = {
    "off": (["diagnostics.attribution=false"], STEPS),
    "every_10": (["diagnostics.attribution=true", f"diagnostics.attribution_every={EVERY}"], STEPS),
    "every_step": (["diagnostics.attribution=true", "diagnostics.attribution_every=1"], SCALE_STEPS),
}


def _counting(owner, name: str, counts: dict):
    """Replace ``owner.name`` by a wrapper that counts its calls in ``counts[name]``; returns a
    function that puts the original back (``perf/run.py`` runs every suite in one process)."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def counted(*args, **kwargs):
        counts[name] += 1
        return inner(*args, **kwargs)

    setattr(owner, name, counted)
    return lambda: setattr(owner, name, inner)


def run() -> dict:
    from entropyrl.trainers.stats import attribution, update_split

    counts = {"probe_entropy_gradient": 0, "sharded_probe_entropy_gradient": 0, "add_micro": 0}
    restore = [
        _counting(attribution, "probe_entropy_gradient", counts),
        _counting(attribution, "sharded_probe_entropy_gradient", counts),
        _counting(update_split.UpdateSplit, "add_micro", counts),
    ]
    try:
        return _measure(counts)
    finally:
        for undo in restore:
            undo()


def _measure(counts: dict) -> dict:
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import GRPOTrainer

    with tempfile.TemporaryDirectory(prefix="entropyrl-bench-attr-") as tmp:
        trainers, built = {}, {}
        for name, (overrides, _) in VARIANTS.items():
            cfg = compose(
                "train",
                [
                    "experiment=lab_grpo",
                    "trainer.threads=1",
                    "tracking.enabled=false",
                    "trainer.progress=false",
                    f"output_dir={Path(tmp) / name}",
                    *overrides,
                ],
            )
            started = time.perf_counter()
            trainers[name] = GRPOTrainer(cfg, log=lambda *_: None)
            built[name] = time.perf_counter() - started
        times = {name: [] for name in VARIANTS}
        calls = {name: {"g_H": 0, "split_micro_batches": 0} for name in VARIANTS}
        measured = {name: 0 for name in VARIANTS}
        kinds = {name: {"measured": [], "plain": []} for name in VARIANTS}
        try:
            for step in range(STEPS + 1):
                for name, (_, steps) in VARIANTS.items():
                    if step > steps:
                        continue
                    trainer = trainers[name]
                    before = dict(counts)
                    started = time.perf_counter()
                    metrics = trainer.train_step()
                    seconds = time.perf_counter() - started
                    trainer.step += 1
                    calls[name]["g_H"] += (
                        counts["probe_entropy_gradient"]
                        - before["probe_entropy_gradient"]
                        + counts["sharded_probe_entropy_gradient"]
                        - before["sharded_probe_entropy_gradient"]
                    )
                    calls[name]["split_micro_batches"] += counts["add_micro"] - before["add_micro"]
                    if step > 0:  # the first step samples the probe and warms up
                        times[name].append(seconds)
                        kinds[name]["measured" if "entropy_change/predicted_net" in metrics else "plain"].append(seconds)
                        measured[name] += int("entropy_change/predicted_net" in metrics)
        finally:
            for trainer in trainers.values():
                trainer.close()
    mean = {name: statistics.fmean(v) for name, v in times.items()}
    median = {name: {k: statistics.median(v) for k, v in split.items() if v} for name, split in kinds.items()}
    # robust to the load spikes of a shared machine: each kind of step at its median, in the run's proportions
    share = len(kinds["every_10"]["measured"]) / len(times["every_10"])
    composed = ((1 - share) * median["every_10"]["plain"] + share * median["every_step"]["measured"]) / median["off"]["plain"]
    off_nothing = calls["off"] == {"g_H": 0, "split_micro_batches": 0} and trainers["off"].attribution is None
    return {
        "setting": "experiment=lab_grpo trainer.threads=1, CPU; steps run round-robin, first step untimed",
        "timed_steps": {name: len(v) for name, v in times.items()},
        "measured_steps": measured,
        "step_seconds_mean": {name: round(v, 4) for name, v in mean.items()},
        "step_seconds_median": {name: round(statistics.median(v), 4) for name, v in times.items()},
        "build_seconds": {name: round(v, 2) for name, v in built.items()},
        "calls": calls,
        "step_seconds_median_by_kind": {name: {k: round(v, 4) for k, v in m.items()} for name, m in median.items()},
        "every_10_vs_off": round(mean["every_10"] / mean["off"], 3),
        "every_10_vs_off_medians": round(composed, 3),
        "every_step_vs_off": round(mean["every_step"] / mean["off"], 3),
        "measured_step_vs_off_medians": round(median["every_step"]["measured"] / median["off"]["plain"], 3),
        "target_every_10_vs_off": TARGET,
        "meets_target": max(composed, mean["every_10"] / mean["off"]) <= TARGET,
        "off_pays_nothing": off_nothing,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
