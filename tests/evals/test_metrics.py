"""Metrics of docs/algorithms.md §7: avg@n, unbiased pass@k (golden vectors), maj@n."""

from __future__ import annotations

import json
from fractions import Fraction
from math import comb

import pytest

from entropyrl.core.mlflow_store import mlflow_key
from entropyrl.evals.metrics import avg_at_n, ks_for, maj_at_n, mean_metrics, pass_at_k, problem_metrics


def test_pass_at_k_matches_golden_vectors(golden_dir):
    cases = json.loads((golden_dir / "pass_at_k.json").read_text())
    assert cases
    for case in cases:
        got = pass_at_k(case["n"], case["c"], case["k"])
        assert got == pytest.approx(case["value"], rel=1e-6, abs=1e-6), case


@pytest.mark.parametrize("n", [1, 2, 4, 5, 16, 32, 64, 200, 1000])
def test_pass_at_k_equals_exact_binomial_formula(n):
    for c in sorted({0, 1, n // 3, n // 2, n - 1, n} & set(range(n + 1))):
        for k in ks_for(n):
            exact = 1 - Fraction(comb(n - c, k), comb(n, k))
            assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-12), (n, c, k)


def test_pass_at_1_is_avg_and_pass_at_k_grows_with_k():
    n, c = 32, 5
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    values = [pass_at_k(n, c, k) for k in ks_for(n)]
    assert values == sorted(values) and values[-1] == 1.0


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_ks_are_powers_of_two_up_to_n():
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(5) == [1, 2, 4]
    assert ks_for(32) == [1, 2, 4, 8, 16, 32]


def test_avg_at_n():
    assert avg_at_n([True, False, False, True]) == 0.5
    with pytest.raises(ValueError):
        avg_at_n([])


def test_maj_at_n_votes_on_normalised_answers():
    # "073" and "73" are one vote: the majority is right even though the strings differ.
    assert maj_at_n(["073", "73", "5"], [True, True, False]) == 1.0
    assert maj_at_n(["5", "5", "7"], [False, False, True]) == 0.0
    # no answer does not vote; no answer at all is wrong
    assert maj_at_n([None, None, "7"], [False, False, True]) == 1.0
    assert maj_at_n([None, None], [False, False]) == 0.0
    # ties go to the answer seen first
    assert maj_at_n(["1", "2", "2", "1"], [True, False, False, True]) == 1.0
    assert maj_at_n(["2", "1", "2", "1"], [False, True, False, True]) == 0.0


def test_problem_and_mean_metrics():
    m = problem_metrics(["1", "1", "2", None], [True, True, False, False])
    assert list(m) == ["avg@4", "pass@1", "pass@2", "pass@4", "maj@4"]
    assert m["avg@4"] == 0.5 and m["pass@4"] == 1.0 and m["maj@4"] == 1.0
    assert m["pass@2"] == pytest.approx(1 - comb(2, 2) / comb(4, 2))
    mean = mean_metrics([m, problem_metrics(["3"] * 4, [False] * 4)])
    assert mean["avg@4"] == 0.25 and mean["maj@4"] == 0.5


def test_mlflow_key_has_no_at_sign():
    assert mlflow_key("eval/aime24/avg@32") == "eval/aime24/avg_at_32"
