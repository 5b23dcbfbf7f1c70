"""Token statistics: the chunked path equals the naive one in values and gradients (docs/algorithms.md §1)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.trainers.stats.token_stats import chunked_token_stats, logits_token_stats

TOLS = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def make(n, d, v, dtype, seed, bias=True, scale=0.5):
    gen = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, d, generator=gen, dtype=torch.float64) * scale).to(dtype).requires_grad_(True)
    w = (torch.randn(v, d, generator=gen, dtype=torch.float64) * scale).to(dtype).requires_grad_(True)
    b = (torch.randn(v, generator=gen, dtype=torch.float64) * scale).to(dtype).requires_grad_(True) if bias else None
    t = torch.randint(0, v, (n,), generator=gen)
    g_logp = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    g_ent = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    return h, w, b, t, g_logp, g_ent


def naive(h, w, b, t, temperature):
    logits = h @ w.t() + (b if b is not None else 0)
    return logits_token_stats(logits, t, temperature)


def check_against_naive(n, d, v, dtype, chunk, vchunk, temperature, bias, entropy_grad, seed):
    h, w, b, t, g_logp, g_ent = make(n, d, v, dtype, seed, bias)
    params = [x for x in (h, w, b) if x is not None]
    logp, ent = chunked_token_stats(
        h, w, t, bias=b, temperature=temperature, chunk_size=chunk, vocab_chunk_size=vchunk, entropy_grad=entropy_grad
    )
    logp_n, ent_n = naive(h, w, b, t, temperature)
    tol = TOLS[dtype]
    torch.testing.assert_close(logp, logp_n, **tol)
    torch.testing.assert_close(ent, ent_n.detach(), **tol)
    assert ent.requires_grad == entropy_grad
    loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if entropy_grad else 0.0)
    loss_n = (logp_n * g_logp).sum() + ((ent_n * g_ent).sum() if entropy_grad else 0.0)
    grads = torch.autograd.grad(loss, params)
    grads_n = torch.autograd.grad(loss_n, params)
    for gr, gn in zip(grads, grads_n):
        torch.testing.assert_close(gr, gn, **tol)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    d=st.integers(1, 12),
    v=st.integers(2, 70),
    chunk=st.integers(1, 17),
    vchunk=st.integers(1, 80),
    temperature=st.sampled_from([1.0, 0.7, 1.3]),
    bias=st.booleans(),
    entropy_grad=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_chunked_matches_naive_float64(n, d, v, chunk, vchunk, temperature, bias, entropy_grad, seed):
    check_against_naive(n, d, v, torch.float64, chunk, vchunk, temperature, bias, entropy_grad, seed)


@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_matches_naive_float32(entropy_grad, temperature):
    check_against_naive(300, 32, 1000, torch.float32, 64, 256, temperature, True, entropy_grad, seed=3)


def test_gradcheck_float64():
    """Analytic backward of the custom Function against finite differences (logp and entropy)."""
    h, w, b, t, _, _ = make(5, 3, 7, torch.float64, seed=1)

    def f(h, w, b):
        return chunked_token_stats(h, w, t, bias=b, temperature=0.8, chunk_size=2, vocab_chunk_size=3, entropy_grad=True)

    assert torch.autograd.gradcheck(f, (h, w, b), eps=1e-6, atol=1e-7)


def test_temperature_is_applied():
    h, w, b, t, _, _ = make(6, 4, 9, torch.float64, seed=2)
    lp1, e1 = chunked_token_stats(h, w, t, bias=b, temperature=1.0)
    lp2, e2 = chunked_token_stats(h, w, t, bias=b, temperature=0.5)
    lp3, e3 = chunked_token_stats(h * 2, w, t, bias=b * 2, temperature=1.0)  # z/0.5 == 2z
    assert not torch.allclose(lp1, lp2)
    torch.testing.assert_close(lp2, lp3, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(e2, e3, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError):
        chunked_token_stats(h, w, t, temperature=0.0)


def test_entropy_detached_by_default_and_logp_has_grad():
    h, w, b, t, _, _ = make(4, 3, 5, torch.float32, seed=0)
    logp, ent = chunked_token_stats(h, w, t)
    assert logp.requires_grad and not ent.requires_grad


def test_logits_stats_stable_at_extremes():
    logits = torch.tensor([[1e4, -1e4, 0.0, -1e4], [0.0, 0.0, 0.0, 0.0], [-1e30, 5.0, 5.0, -1e30]])
    t = torch.tensor([1, 2, 3])
    logp, ent = logits_token_stats(logits, t)
    assert torch.isfinite(ent).all()
    assert ent[0].item() == pytest.approx(0.0, abs=1e-6)
    assert ent[1].item() == pytest.approx(math.log(4), abs=1e-6)
    assert ent[2].item() == pytest.approx(math.log(2), abs=1e-5)
    assert logp[1].item() == pytest.approx(-math.log(4), abs=1e-6)
    h = logits  # identity projection: same numbers through the chunked path
    lp_c, ent_c = chunked_token_stats(h, torch.eye(4), t, vocab_chunk_size=3)
    assert torch.isfinite(ent_c).all()
    torch.testing.assert_close(ent_c, ent, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_give_float32_stats():
    h, w, b, t, _, _ = make(20, 8, 50, torch.float32, seed=4)
    logp, ent = chunked_token_stats(h.detach().bfloat16().requires_grad_(True), w.detach().bfloat16(), t, chunk_size=7)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    ref_lp, ref_ent = naive(h.detach().bfloat16().float(), w.detach().bfloat16().float(), None, t, 1.0)
    torch.testing.assert_close(logp, ref_lp, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-2, atol=1e-2)
    logp.sum().backward()


def test_empty_batch_and_frozen_weight():
    _, w, _, _, _, _ = make(1, 3, 5, torch.float64, seed=0)
    h = torch.zeros(0, 3, dtype=torch.float64, requires_grad=True)
    logp, ent = chunked_token_stats(h, w, torch.zeros(0, dtype=torch.long))
    assert logp.shape == (0,) and ent.shape == (0,)
    logp.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    # weight without grad: only hidden gets one, and it matches the naive path
    h2, w2, _, t2, g, _ = make(6, 3, 5, torch.float64, seed=5, bias=False)
    w2 = w2.detach()
    (chunked_token_stats(h2, w2, t2, chunk_size=4)[0] * g).sum().backward()
    gh = h2.grad.clone()
    h2.grad = None
    (naive(h2, w2, None, t2, 1.0)[0] * g).sum().backward()
    torch.testing.assert_close(gh, h2.grad, rtol=1e-10, atol=1e-10)


def test_bad_shapes_raise():
    h, w, _, t, _, _ = make(4, 3, 5, torch.float32, seed=0, bias=False)
    with pytest.raises(ValueError):
        chunked_token_stats(h, w[:, :2], t)
    with pytest.raises(ValueError):
        chunked_token_stats(h, w, t[:3])
    with pytest.raises(ValueError):
        chunked_token_stats(h, w, t, chunk_size=0)
