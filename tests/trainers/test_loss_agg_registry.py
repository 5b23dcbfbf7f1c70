"""A loss aggregation registered from outside the package declares its normaliser, and gradient
accumulation over micro-batches and data-parallel scaling use it (no hard-coded names)."""

from __future__ import annotations

import pytest
import torch

from entropyrl.core.errors import UserError
from entropyrl.trainers.algos import core_algos
from entropyrl.trainers.trainer import accumulation_weight


def _seq_mean_token_sum(loss_mat, mask, norm):
    """Per-response sum of token losses, averaged over responses with any valid token."""
    m = mask.to(loss_mat.dtype)
    has = (m.sum(-1) > 0).to(loss_mat.dtype)
    return ((loss_mat * m).sum(-1) * has).sum() / has.sum().clamp(min=1.0)


@pytest.fixture()
def seq_sum():
    core_algos.register_loss_agg("test-seq-mean-token-sum", denominator=lambda mask: (mask.sum(-1) > 0).sum())(
        _seq_mean_token_sum
    )
    yield "test-seq-mean-token-sum"
    core_algos.LOSS_AGGREGATIONS.pop("test-seq-mean-token-sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "new"])
def test_micro_batch_accumulation_equals_one_pass(mode, seq_sum):
    mode = seq_sum if mode == "new" else mode
    g = torch.Generator().manual_seed(0)
    B, T = 12, 9
    x = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(B, T, generator=g) > 0.3).long()
    mask[3] = 0  # a response with no valid token
    full = core_algos.agg_loss(x**2, mask, mode, norm=T)
    (want,) = torch.autograd.grad(full, x)
    acc = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(B).split(5):  # uneven micro-batches: 5, 5, 2
        part = core_algos.agg_loss(x[rows] ** 2, mask[rows], mode, norm=T)
        acc = acc + part * accumulation_weight(mode, mask[rows], mask)
    (got,) = torch.autograd.grad(acc, x)
    assert torch.allclose(got, want, atol=1e-12), (got - want).abs().max()


def test_registration_requires_a_normaliser_and_unknown_names_are_one_line_errors():
    with pytest.raises(TypeError):
        core_algos.register_loss_agg("no-normaliser")  # denominator is a required keyword
    with pytest.raises(UserError, match="unknown algo.loss_agg=nope; valid: .*token-mean"):
        accumulation_weight("nope", torch.ones(2, 2), torch.ones(4, 2))
