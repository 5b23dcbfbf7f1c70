"""A long generation shows a sign of life: responses done, tokens, tokens/s and an ETA that is an
upper bound (every batch still to run taking all of max_new_tokens steps at the rate seen so far)."""

from __future__ import annotations

import pytest

from entropyrl.evals.generation import GenerationMeter


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_meter_counts_tokens_rate_and_an_upper_bound_eta():
    clock = Clock()
    meter = GenerationMeter(total=32, max_new_tokens=100, batch_size=16, every_s=30, clock=clock)
    assert meter.eta() is None and meter.line() == "0/32 responses, 0m00s in, no estimate yet"
    clock.now += 10
    for _ in range(50):  # 50 decoding steps of the first batch, 16 rows each
        meter.tokens(16)
    # 800 tokens in 10 s; 50 of the 200 steps (2 batches x 100) done: at most 150 more at 0.2 s each
    assert meter.rate() == pytest.approx(80.0) and meter.eta() == pytest.approx(30.0)
    assert meter.line() == "0/32 responses, 800 tokens, 80.0 tokens/s, ETA <= 0m30s"
    meter.sequences(16)  # the first batch ended early, after 50 of its 100 steps (every row hit its stop token)
    assert meter.eta() == pytest.approx(100 * 0.2)  # the second batch's 100 steps at most, at the 0.2 s a step measured
    meter.sequences(16)
    assert meter.eta() == 0.0 and meter.line().startswith("32/32 responses")


def test_an_engine_running_fewer_rows_at_once_than_the_batch_size_is_counted_by_what_it_ran():
    clock = Clock()
    meter = GenerationMeter(total=30, max_new_tokens=10, batch_size=16, clock=clock)
    for _ in range(10):  # a first call of 15 rows (5 prompts x n=3: whole groups per call)
        meter.tokens(15)
    clock.now += 10
    meter.sequences(15)
    assert meter.eta() == pytest.approx(10 * 1.0)  # one more call of 15 rows, not a partial batch of 16


def test_without_decoding_steps_the_eta_comes_from_responses_and_heartbeats_are_spaced():
    clock = Clock()
    meter = GenerationMeter(total=10, max_new_tokens=100, batch_size=4, every_s=30, clock=clock)
    clock.now += 20
    meter.sequences(4)  # an engine that reports only whole responses (vLLM)
    assert meter.eta() == pytest.approx(30.0) and "tokens/s" not in meter.line()
    assert not meter.due()  # 20 s since the start: not yet
    clock.now += 10
    assert meter.due() and not meter.due()  # one line, then the next one 30 s later
    clock.now += 30
    assert meter.due()


def test_a_log_gets_heartbeats_while_an_engine_reports_nothing_until_it_ends():
    """vLLM generates a benchmark in one call and reports once, at its end: into a log file the run
    said what started, then nothing for the whole benchmark. Now the heartbeat comes on time from
    a thread; once generation is over (grading) it stops (the null)."""
    import io
    import time

    from rich.console import Console

    from entropyrl.evals.progress_display import beating, progress_bar, progress_display
    from entropyrl.evals.settings import EvalSettings

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    under_way: dict = {}
    with progress_bar(console) as bar:
        progress = progress_display(bar, console, EvalSettings(max_new_tokens=64), 16, 0.1, under_way)
        with beating(progress.beat, 0.1):
            progress("aime24", "generate", 0, 32)  # starts; then the engine is silent
            time.sleep(0.55)
            progress("aime24", "generate", 32, 32)
            progress("aime24", "grade", 0, 32)
            during = out.getvalue().count("generate aime24: 0/32 responses")
            time.sleep(0.4)
    assert during >= 3, out.getvalue()
    assert out.getvalue().count("generate aime24: 0/32 responses") == during  # grading: no generate heartbeat
