"""Diagnostics that see the interventions: the effective-coefficient entropy prediction
against a finite-difference entropy change on a small softmax model, the regime warnings and
flags on synthetic metric rows, and the predicted-vs-realised fit."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.run.regime import entropy_flags, prediction_fit, regime_warnings, rolling_mean
from entropyrl.trainers.stats.prediction import micro_batch_prediction


# ------------------------------------------------------------------------------------------
# effective-coefficient prediction vs finite differences
# ------------------------------------------------------------------------------------------
def softmax_policy(seed: int, B: int = 8, T: int = 6):
    """Independent 2-way softmax per position, ``z [B, T, 2]``: a token's update moves only its own
    position's entropy, so the per-position change is exact to first order.

    For a 2-way softmax an SGD step of size eta on ``g * logp_t`` changes ``H_t`` by
    ``2 eta q_t * (-g (1-q_t)(log q_t + H_t))`` = ``2 eta q_t * effective_entropy_change``.
    """
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(B, T, 2, generator=g, dtype=torch.float64) * 1.5).requires_grad_(True)
    tokens = torch.randint(0, 2, (B, T), generator=g)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    adv = (torch.randn(B, 1, generator=g, dtype=torch.float64)) * mask
    old_shift = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3  # stale sampler: some clipping
    return z, tokens, mask, adv, old_shift


def stats(z, tokens):
    logp_all = torch.log_softmax(z, -1)
    logp = logp_all.gather(-1, tokens[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


CASES = {
    "grpo": {},
    "steer": {"interventions": ["steer"], "steer": {"lambda_min": 0.3, "entropy_source": "current"}},
    "clip_cov": {"interventions": ["clip_cov"], "clip_cov": {"ratio": 0.3, "lb": -10.0, "ub": 10.0}},
    "kl_cov": {"interventions": ["kl_cov"], "kl_cov": {"ratio": 0.3}},
    "tight_clip": {"clip": {"low": 0.05, "high": 0.05, "dual_c": 1.5}},
    "stare_c2": {"interventions": ["stare"], "stare": {"variant": "C2", "w": 3.0, "m": 0.2, "p": 0.5, "gate": False}},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_effective_prediction_matches_finite_difference(case, seed):
    z, tokens, mask, adv, old_shift = softmax_policy(seed)
    algo = Algorithm.from_config(CASES[case], max_response_length=6, seed=seed)
    logp, entropy = stats(z, tokens)
    old_logp = (logp.detach() + old_shift) * mask
    out = algo.loss(logp=logp, old_logp=old_logp, entropy=entropy.detach(), advantages=adv, mask=mask)
    pred = micro_batch_prediction(out.tokens, out.token_loss)  # reads the graph before the backward
    out.loss.backward()
    n_tokens = float(mask.sum())  # token-mean: the summed coefficient is divided by N
    eta = 1e-4
    with torch.no_grad():
        _, h_before = stats(z, tokens)
        _, h_after = stats(z - eta * z.grad, tokens)
        q = logp.detach().exp()
        fd = (h_after - h_before) / (2 * (eta / n_tokens) * q) * mask  # in the prediction's units
    # per quadrant and in total, the prediction is the finite-difference change
    from entropyrl.trainers.stats.diagnostics import quadrant_ids

    ids = quadrant_ids(logp.detach(), entropy.detach(), adv, mask)
    for i in range(1, 5):
        want = float(fd[ids == i].sum())
        assert math.isclose(pred[f"quadrant/q{i}/pred_dH"], want, rel_tol=2e-3, abs_tol=1e-6), (case, i)
    assert math.isclose(pred["entropy_change/predicted"], float(fd.sum()), rel_tol=2e-3, abs_tol=1e-6)
    base_gap = abs(pred["entropy_change/predicted_base"] - float(fd.sum()))
    if case in ("grpo", "tight_clip"):
        # no intervention: base == effective (the base carries the configured clip mask too)
        assert base_gap < 1e-3 * max(1.0, abs(float(fd.sum())))
        assert case == "grpo" or out.metrics["clip/frac"] > 0.1
    elif case not in ("kl_cov",):
        assert base_gap > 1e-2 * abs(float(fd.sum())), case  # the intervention moved the prediction


# ------------------------------------------------------------------------------------------
# regime warnings and flags on synthetic rows
# ------------------------------------------------------------------------------------------
def rows_of(n: int, **series) -> list[dict]:
    return [{"step": i + 1, **{k: (v(i) if callable(v) else v) for k, v in series.items()}} for i in range(n)]


def ids(found: list[dict]) -> list[str]:
    return [f["id"] for f in found]


def test_kl_cov_warnings_name_kl_cov():
    rows = rows_of(10, **{"kl_cov/count": 1.0, "kl_cov/penalty_zero": 0.5, "entropy": 1.0})
    found = regime_warnings(rows, {"name": "kl_cov", "interventions": ["kl_cov"], "kl_cov": {"ratio": 2e-4}})
    assert ids(found) == ["kl_cov_one_token", "kl_cov_on_policy"]
    assert all("kl_cov" in f["message"] and f["first_step"] == 1 for f in found)
    # enough tokens and off-policy updates: no warning
    ok = rows_of(10, **{"kl_cov/count": 12.0, "kl_cov/penalty_zero": 0.0})
    assert regime_warnings(ok, {"interventions": ["kl_cov"]}) == []
    # the same metrics without kl_cov configured do not warn about it
    assert regime_warnings(rows, {"interventions": []}) == []


def test_clip_cov_one_token_first_step():
    rows = rows_of(6, **{"clip_cov/count": lambda i: 5.0 if i < 2 else 1.0})
    (w,) = regime_warnings(rows, {"interventions": ["clip_cov"], "clip_cov": {"ratio": 2e-4}})
    assert w["id"] == "clip_cov_one_token" and w["first_step"] == 3


def test_steer_uniform_weights():
    flat = rows_of(8, **{"steer/weight_mean": lambda i: 0.995 + 0.0001 * i})
    assert ids(regime_warnings(flat, {"interventions": ["steer"]})) == ["steer_uniform"]
    acting = rows_of(8, **{"steer/weight_mean": lambda i: 0.995 if i else 0.95})
    assert regime_warnings(acting, {"interventions": ["steer"]}) == []


@pytest.mark.parametrize(
    "gate,want",
    [(lambda i: 0.0, ["stare_gate_never_opens"]), (lambda i: 1.0, ["stare_gate_never_closes"]), (lambda i: float(i > 3), [])],
)
def test_stare_gate(gate, want):
    rows = rows_of(8, **{"stare/gate_on": gate})
    assert ids(regime_warnings(rows, {"interventions": ["stare"], "stare": {"h_tgt": 0.3, "gate": True}})) == want
    # an open-loop STARE (gate: false) is always on by design: no warning
    assert regime_warnings(rows, {"interventions": ["stare"], "stare": {"gate": False}}) == []


def test_all_equal_groups():
    rows = rows_of(10, **{"groups/all_equal_frac": lambda i: 0.2 if i < 4 else 0.9})
    (w,) = regime_warnings(rows, {"name": "grpo", "interventions": []})
    assert w["id"] == "all_equal_groups" and w["first_step"] == 5
    assert regime_warnings(rows_of(10, **{"groups/all_equal_frac": 0.3}), {"interventions": []}) == []


def test_collapse_and_explosion_flags():
    falling = rows_of(100, entropy=lambda i: 1.0 * math.exp(-i / 30))
    (f,) = entropy_flags(falling)
    first_tenth = np.mean([math.exp(-i / 30) for i in range(10)])
    want = next(i + 1 for i in range(100) if math.exp(-i / 30) < 0.2 * first_tenth)
    assert f["id"] == "collapse" and f["first_step"] == want
    rising = rows_of(50, entropy=lambda i: 0.5 + 0.05 * i)
    assert ids(entropy_flags(rising)) == ["explosion"]
    assert entropy_flags(rows_of(50, entropy=lambda i: 1.0 + 0.1 * math.sin(i))) == []
    assert ids(entropy_flags(rows_of(20, entropy=lambda i: 1.9 + 0.02 * i))) == ["explosion"]  # > 2 nats


def test_no_explosion_flag_for_a_rise_from_a_near_zero_start():
    """3x a near-zero start (0.019 -> 0.057 nats) is noise, not an explosion: the ratio needs a floor."""
    tiny = rows_of(40, entropy=lambda i: 0.019 if i < 10 else 0.057)
    assert entropy_flags(tiny) == []
    (f,) = entropy_flags(rows_of(40, entropy=lambda i: 0.1 if i < 10 else 0.6))  # 6x and above the floor
    assert f["id"] == "explosion" and f["first_step"] == 11 and "0.5 nats" in f["message"]


def test_prediction_fit_raw_and_detrended():
    rng = np.random.default_rng(0)
    n = 200
    trend = np.linspace(-1, 0, n)
    x = trend + rng.normal(0, 0.1, n)
    y = 0.5 * x + rng.normal(0, 0.01, n)
    rows = [{"step": i + 1, "entropy_change/predicted": float(x[i]), "entropy_change/realized": float(y[i])} for i in range(n)]
    fit = prediction_fit(rows)
    assert fit["n"] == n and fit["pearson_r"] > 0.95 and abs(fit["slope"] - 0.5) < 0.02
    assert fit["pearson_r_detrended"] > 0.9 and abs(fit["slope_detrended"] - 0.5) < 0.05
    # a shared trend alone: correlated raw, uncorrelated once the rolling mean is removed
    y2 = trend + rng.normal(0, 0.05, n)
    rows2 = [{"entropy_change/predicted": float(x[i]), "entropy_change/realized": float(y2[i])} for i in range(n)]
    fit2 = prediction_fit(rows2)
    assert fit2["pearson_r"] > 0.5 and abs(fit2["pearson_r_detrended"]) < 0.3
    assert prediction_fit(rows[:2]) == {}
    assert np.allclose(rolling_mean(np.arange(5.0), 3), [0.5, 1, 2, 3, 3.5])


@pytest.mark.slow
def test_kl_cov_run_lists_a_warning_naming_kl_cov(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "entropyrl.cli.main",
            "train",
            "algo=kl_cov",
            "trainer.total_steps=3",
            "trainer.threads=1",
            "trainer.progress=false",
            "tracking.enabled=false",
            "val.prompts=16",
            f"output_dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert any("kl_cov" in w["id"] and "kl_cov" in w["message"] for w in summary["warnings"])
    assert "kl_cov_" in proc.stdout + proc.stderr


def test_stare_target_not_held_when_the_open_gate_does_not_bring_entropy_back():
    # the gate open from step 3 on while entropy sinks to 0.1 against h_tgt 0.3
    sinking = rows_of(20, **{"stare/gate_on": lambda i: float(i > 2), "entropy": lambda i: max(0.1, 0.6 - 0.05 * i)})
    (w,) = regime_warnings(sinking, {"interventions": ["stare"], "stare": {"h_tgt": 0.3, "gate": True}})
    assert w["id"] == "stare_target_not_held" and w["first_step"] == 11 and "0.100" in w["message"]
    # held near the target (the gate opening and closing around it): no warning
    held = rows_of(20, **{"stare/gate_on": lambda i: float(i % 2), "entropy": lambda i: 0.29 + 0.02 * (i % 2)})
    assert regime_warnings(held, {"interventions": ["stare"], "stare": {"h_tgt": 0.3, "gate": True}}) == []
    # open most of the time but ending within 20 % of the target: held, no warning
    near = rows_of(20, **{"stare/gate_on": 1.0, "entropy": 0.27})
    assert ids(regime_warnings(near, {"interventions": ["stare"], "stare": {"h_tgt": 0.3, "gate": True}})) == [
        "stare_gate_never_closes"
    ]


@pytest.mark.parametrize(
    ("data", "algo", "advice"),
    [
        ({"name": "toy", "kind": "builtin"}, {}, "a harder task (data=countdown), or dynamic sampling"),
        ({"name": "dapo_math_17k", "kind": "math", "path": "/x/mine.jsonl"}, {}, "harder prompts in your data"),
        ({"name": "word_problems", "kind": "word_problems", "difficulty": 1}, {}, "data.difficulty, now 1"),
        (
            {"name": "countdown", "kind": "builtin"},
            {"dynamic_sampling": {"enabled": True, "max_num_gen_batches": 10}},
            "max_num_gen_batches, now 10",
        ),
    ],
)
def test_all_equal_groups_advice_fits_the_runs_data(data, algo, advice):
    rows = rows_of(10, **{"groups/all_equal_frac": 0.9})
    (w,) = regime_warnings(rows, {"name": "grpo", "interventions": [], **algo}, data)
    assert advice in w["message"], w["message"]
    assert ("a harder task (data=countdown)" in w["message"]) == (data["name"] == "toy")
