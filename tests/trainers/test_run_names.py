"""Runs that differ are named apart in MLflow: a real model, the user's own data and an asynchronous
rollout worker each show in the run's name; the default run keeps its short name."""

from __future__ import annotations

import pytest

from entropyrl.conf import compose
from entropyrl.trainers.run.names import default_run_name


@pytest.mark.parametrize(
    "overrides, name",
    [
        ([], "grpo-s0"),
        (["algo=stare", "trainer.seed=3"], "stare-s3"),
        (["model=smollm2-135m", "data=word_problems"], "grpo-smollm2-135m-word_problems-s0"),
        (["data=dapo_math_17k", "data.path=/data/my_problems.jsonl"], "grpo-my_problems-s0"),
        (["trainer.staleness=2"], "grpo-async2-s0"),
        (["model.path=/models/Qwen2.5-Math-1.5B/"], "grpo-Qwen2.5-Math-1.5B-s0"),
    ],
)
def test_the_default_run_name_carries_what_differs(overrides, name):
    assert default_run_name(compose("train", overrides)) == name


def test_three_runs_of_one_algorithm_and_seed_are_told_apart():
    names = {
        default_run_name(compose("train", ov))
        for ov in (["data=dapo_math_17k", "data.path=mine.jsonl"], ["model=smollm2-135m"], ["trainer.staleness=1"])
    }
    assert len(names) == 3 and "grpo-s0" not in names
