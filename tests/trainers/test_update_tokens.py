"""The metrics computed beside the loss (trainers/stats/update_tokens.py): clipped and corrected
token shares by the step's entropy quartile, and the log-prob gaps between the behaviour,
proximal and current policies; on tensors small enough to check by hand."""

from __future__ import annotations

import math

import pytest
import torch

from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.stats.update_tokens import (
    UpdateTokenStats,
    entropy_quartile,
    entropy_quartile_edges,
    masked_abs_gap,
    quartile_counts,
    quartile_shares,
    stale_clip_metrics,
)

# 8 tokens, the last one padding: the valid entropies are 0.1 .. 0.7
ENTROPY = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float64)


def test_quartile_edges_and_quarters_of_the_valid_tokens():
    edges = entropy_quartile_edges(ENTROPY, MASK)
    # 7 values: positions 1.5, 3 and 4.5 of the sorted list, interpolated
    torch.testing.assert_close(edges, torch.tensor([0.25, 0.4, 0.55], dtype=torch.float64))
    valid = MASK.bool()
    torch.testing.assert_close(edges, torch.quantile(ENTROPY[valid], torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)))
    # an entropy on an edge belongs to the quarter below it (0.4 -> q2)
    assert entropy_quartile(ENTROPY, edges).tolist() == [[0, 0, 1, 1], [2, 3, 3, 3]]
    assert math.isnan(float(entropy_quartile_edges(ENTROPY, torch.zeros_like(MASK))[0]))


def test_quartile_counts_and_shares():
    flags = torch.tensor([[0, 0, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)  # the padding token's flag is not counted
    counts = quartile_counts(flags, entropy_quartile(ENTROPY, entropy_quartile_edges(ENTROPY, MASK)), MASK)
    assert counts.tolist() == [[0.0, 1.0, 0.0, 2.0], [2.0, 2.0, 1.0, 2.0]]
    assert quartile_shares("clip/frac", counts) == {
        "clip/frac/entropy_q1": 0.0,
        "clip/frac/entropy_q2": 0.5,
        "clip/frac/entropy_q3": 0.0,
        "clip/frac/entropy_q4": 1.0,
    }
    empty = quartile_shares("x", torch.tensor([[0.0, 0, 0, 0], [1.0, 0, 1, 1]]))
    assert empty["x/entropy_q1"] == 0.0 and math.isnan(empty["x/entropy_q2"])


def test_masked_abs_gap():
    a = torch.tensor([[0.0, -1.0], [-2.0, 5.0]])
    b = torch.tensor([[0.5, -0.5], [-1.0, 0.0]])
    assert masked_abs_gap(a, b, torch.tensor([[1, 1], [1, 0]])) == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert math.isnan(masked_abs_gap(a, b, torch.zeros(2, 2)))


STALE_KEYS = ["async/stale_clip_frac", *(f"async/stale_clip_frac/entropy_q{i}" for i in range(1, 5))]


def test_the_stale_ratio_outside_the_clip_range_by_entropy_quarter():
    # quarters of the valid tokens: [[q1, q1, q2, q2], [q3, q4, q4, pad]]; clip range [0.8, 1.28]
    prox = torch.zeros(2, 4, dtype=torch.float64)
    ratio = torch.tensor([[1.0, 1.0, 1.5, 1.1], [0.7, 1.3, 0.85, 100.0]], dtype=torch.float64)  # the pad's is not counted
    behav = prox - torch.log(ratio)
    edges = entropy_quartile_edges(ENTROPY, MASK)
    got = stale_clip_metrics(prox, behav, ENTROPY, MASK, edges, eps_low=0.2, eps_high=0.28)
    assert [got[k] for k in STALE_KEYS] == pytest.approx([3 / 7, 0.0, 0.5, 1.0, 0.5])
    # a wider clip range keeps 1.3 and 1.5 inside: only 0.7 is out
    wide = stale_clip_metrics(prox, behav, ENTROPY, MASK, edges, eps_low=0.2, eps_high=0.6)
    assert [wide[k] for k in STALE_KEYS] == pytest.approx([1 / 7, 0.0, 0.0, 1.0, 0.0])


def test_the_stale_ratio_is_never_outside_when_behaviour_is_the_proximal_policy():
    prox = -torch.rand(2, 4, dtype=torch.float64)
    edges = entropy_quartile_edges(ENTROPY, MASK)
    for behav in (prox.clone(), None):  # k = 0: the same weights, or the trained model sampled itself
        got = stale_clip_metrics(prox, behav, ENTROPY, MASK, edges, eps_low=0.2, eps_high=0.28)
        assert [got[k] for k in STALE_KEYS] == [0.0] * 5
    assert math.isnan(
        stale_clip_metrics(prox, None, ENTROPY, torch.zeros_like(MASK), edges, eps_low=0.2, eps_high=0.28)[STALE_KEYS[0]]
    )


def _loss_context(algo: Algorithm, rows: slice):
    """One micro-batch loss (rows of the 2-row batch above) with known clips and corrections:
    advantages 1; the current policy 1.5x the proximal one on the tokens ``CLIPPED`` marks (ratio
    clip at 1.2), equal elsewhere; the behaviour policy 10x below the proximal one on the tokens
    ``FAR`` marks (outside IcePop's [0.5, 5]), equal elsewhere."""
    old = torch.full((2, 4), -1.0, dtype=torch.float64)
    logp = old + CLIPPED * math.log(1.5)
    behaviour = old - FAR * math.log(10.0)
    out = algo.loss(
        logp=logp[rows],
        old_logp=old[rows],
        entropy=torch.zeros_like(old[rows]),
        advantages=torch.ones_like(old[rows]),
        mask=MASK[rows],
        sampling_entropy=ENTROPY[rows],
        sampler_logp=behaviour[rows],
    )
    return out


CLIPPED = torch.tensor([[0, 0, 1, 0], [0, 1, 1, 1]], dtype=torch.float64)  # q2, q4, q4 and the padding token
FAR = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 1]], dtype=torch.float64)  # q1 and the padding token


def test_the_step_accumulator_over_two_micro_batches_of_a_real_loss():
    algo = Algorithm.from_config({"interventions": ["tis"], "tis": {"mode": "icepop"}}, max_response_length=4)
    stats = UpdateTokenStats(entropy_quartile_edges(ENTROPY, MASK), logp_gaps=True)
    outs = [_loss_context(algo, slice(0, 1)), _loss_context(algo, slice(1, 2))]
    for out in outs:
        assert out.tokens.token_masks["rollout/tis_clip_frac"].dtype == torch.bool
        stats.add(out.tokens)
    m = stats.metrics()
    # the clipped tokens (q2: 1 of 2, q4: 2 of 2) and IcePop's masked one (q1: 1 of 2), summed over the two
    assert [m[f"clip/frac/entropy_q{i}"] for i in range(1, 5)] == [0.0, 0.5, 0.0, 1.0]
    assert [m[f"rollout/tis_clip_frac/entropy_q{i}"] for i in range(1, 5)] == [0.5, 0.0, 0.0, 0.0]
    # the shares agree with what the loss itself logs, token-weighted over the step
    assert outs[1].metrics["clip/frac"] == pytest.approx(2 / 3)
    # proximal-current: log 1.5 on 1 of 4 tokens, then on 2 of 3; behaviour-current adds log 10 where FAR
    lg15, lg10 = math.log(1.5), math.log(10.0)
    assert m["async/logp_gap/proximal_current"] == pytest.approx((lg15 / 4 + 2 * lg15 / 3) / 2)
    assert m["async/logp_gap/behaviour_current"] == pytest.approx(((lg15 + lg10) / 4 + 2 * lg15 / 3) / 2)


def test_without_staleness_no_gaps_and_without_a_correction_no_tis_shares():
    stats = UpdateTokenStats(entropy_quartile_edges(ENTROPY, MASK))
    stats.add(_loss_context(Algorithm.from_config({}, max_response_length=4), slice(0, 2)).tokens)
    assert set(stats.metrics()) == {f"clip/frac/entropy_q{i}" for i in range(1, 5)}
