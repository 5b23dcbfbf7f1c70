"""An asynchronous run (``trainer.staleness=k >= 1``) says what it did in ``summary.json``'s ``async``
block and in one end line: the overlap of rollout and training, the staleness limit and the realised
lag, the samples dropped. The block is a pure function of the metric rows (``async_summary``)."""

from __future__ import annotations

import json

import pytest

from entropyrl.conf import compose
from entropyrl.trainers.run.run_report import async_summary, async_text


def _row(step, *, lag, wait, step_s, worker_idle, dropped=0.0, skipped=False):
    if skipped:  # the step's batch was too stale: nothing trained, only the drop is logged
        return {"step": step, "async/dropped": dropped, "skipped": 1.0, "time/step": step_s}
    return {
        "step": step,
        "async/staleness/mean": lag,
        "async/staleness/max": lag,
        "async/dropped": dropped,
        "async/worker_idle_frac": worker_idle,
        "time/generate": wait,
        "time/step": step_s,
    }


def test_the_block_reads_overlap_staleness_and_drops_from_the_rows():
    rows = [
        _row(1, lag=0.0, wait=9.0, step_s=10.0, worker_idle=0.0),  # the worker's start-up: left out of the overlap
        _row(2, lag=1.0, wait=0.5, step_s=4.0, worker_idle=0.5),  # rollout 2 s, 0.5 s of it waited for
        _row(3, lag=2.0, wait=0.0, step_s=4.0, worker_idle=0.75),  # rollout 1 s, all hidden
        _row(4, lag=0.0, wait=0.0, step_s=0.1, worker_idle=0.0, dropped=8.0, skipped=True),
        _row(5, lag=2.0, wait=1.0, step_s=2.0, worker_idle=0.0, dropped=4.0),  # rollout 2 s, 1 s waited
    ]
    block = async_summary(rows, staleness=2)
    assert block["staleness_limit"] == 2
    assert block["staleness_mean"] == pytest.approx((0 + 1 + 2 + 2) / 4)  # the skipped step trained nothing
    assert block["staleness_max"] == 2.0
    assert block["dropped_samples"] == 12 and block["skipped_steps"] == 1
    assert block["overlap"] == pytest.approx(1 - (0.5 + 0.0 + 1.0) / (2.0 + 1.0 + 2.0))
    assert block["trainer_idle_frac"] == pytest.approx((9.0 + 0.5 + 0.0 + 1.0) / (10.0 + 4.0 + 4.0 + 2.0))
    assert block["worker_idle_frac"] == pytest.approx((0.0 + 0.5 + 0.75 + 0.0) / 4)
    line = async_text(block)
    assert (
        line
        == "async: k=2, 70% of rollout time overlapped training, staleness mean 1.2 max 2, 12 samples dropped (1 steps skipped)"
    )


def test_a_run_with_nothing_to_measure_says_so():
    block = async_summary([_row(1, lag=0.0, wait=3.0, step_s=3.0, worker_idle=0.0)], staleness=1)
    assert block["overlap"] is None and block["staleness_max"] == 0.0 and block["dropped_samples"] == 0
    assert async_text(block) == "async: k=1, overlap not measured, staleness mean 0.0 max 0, 0 samples dropped"
    empty = async_summary([], staleness=3)
    assert empty["staleness_mean"] is None and async_text(empty).startswith("async: k=3, overlap not measured, no step trained")


def test_a_waiting_trainer_overlaps_nothing():
    """Every step waited as long as the worker generated: nothing hidden (clipped at 0, never negative)."""
    rows = [_row(s, lag=0.0, wait=2.0, step_s=2.5, worker_idle=0.2) for s in range(1, 5)]
    rows[2]["time/generate"] = 3.0  # a wait longer than the estimate of the rollout: still 0
    assert async_summary(rows, staleness=1)["overlap"] == 0.0


@pytest.mark.slow
def test_a_short_async_run_writes_the_block_and_prints_the_line(fast_train, in_tmp):
    from entropyrl.trainers.trainer import train

    overrides = [
        *fast_train,
        "output_dir=run",
        "trainer.threads=1",
        "trainer.val_every=0",
        "val.prompts=0",
        "trainer.save_every=0",
        "tracking.enabled=false",
        "trainer.staleness=1",
        "trainer.total_steps=3",
    ]
    lines: list[str] = []
    summary = train(compose("train", overrides), log=lines.append)
    assert summary["status"] == "FINISHED"
    block = json.loads((in_tmp / "run" / "summary.json").read_text())["async"]
    assert block == summary["async"]
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert block == async_summary(rows, staleness=1)
    assert block["staleness_limit"] == 1 and block["staleness_max"] <= 1 and block["dropped_samples"] == 0
    assert block["staleness_mean"] == pytest.approx(sum(r["async/staleness/mean"] for r in rows) / len(rows))
    assert block["overlap"] is not None and 0.0 <= block["overlap"] <= 1.0
    assert [line for line in lines if line.startswith("async: ")] == [async_text(block)]
    assert async_text(block).startswith("async: k=1, ") and "samples dropped" in async_text(block)


@pytest.mark.slow
def test_a_synchronous_run_has_no_async_block(fast_train, in_tmp):
    from entropyrl.trainers.trainer import train

    overrides = [*fast_train, "output_dir=run", "trainer.threads=1", "trainer.val_every=0", "val.prompts=0"]
    lines: list[str] = []
    train(
        compose("train", [*overrides, "trainer.save_every=0", "tracking.enabled=false", "trainer.total_steps=1"]),
        log=lines.append,
    )
    assert "async" not in json.loads((in_tmp / "run" / "summary.json").read_text())
    assert not any(line.startswith("async: ") for line in lines)
