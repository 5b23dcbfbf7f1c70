"""Entropy interventions (docs/algorithms.md §5): properties that must hold for any batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.errors import UserError
from entropyrl.trainers.algos import core_algos as ca
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.interventions import INTERVENTIONS, Intervention, TokenBatch, register_intervention
from entropyrl.trainers.interventions.steer import steer_weights
from entropyrl.trainers.stats.diagnostics import entropy_change_estimate

DAPO_CLIP = {"low": 0.2, "high": 0.28, "dual_c": 10.0}


def make_batch(seed: int, B: int = 8, T: int = 9, dtype=torch.float64, spread: float = 0.4, grpo: bool = True) -> dict:
    """A random batch: two-sided advantages, ragged masks, ratios both inside and outside the clip.

    ``grpo=False``: continuous random advantages, so no valid token has A == 0 (a zero gradient
    then always means the token was masked, clipped or detached).
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(dtype)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 4
    logp = old + torch.randn(B, T, generator=g, dtype=dtype) * spread
    entropy = torch.rand(B, T, generator=g, dtype=dtype) * 2
    rewards = torch.randint(0, 2, (B,), generator=g).to(dtype)
    ids = torch.arange(B) // 4
    adv = ca.compute_advantages("grpo", rewards, ids, mask)
    if not grpo:
        adv = (torch.randn(B, 1, generator=g, dtype=dtype) + 0.1) * mask
    return dict(logp=logp, old_logp=old, entropy=entropy, advantages=adv, mask=mask)


def loss_and_grad(algo: Algorithm, b: dict, extras=None, entropy_grad=False):
    logp = b["logp"].clone().requires_grad_(True)
    ent = b["entropy"].clone().requires_grad_(entropy_grad)
    out = algo.loss(logp=logp, old_logp=b["old_logp"], entropy=ent, advantages=b["advantages"], mask=b["mask"], extras=extras)
    out.loss.backward()
    algo.after_loss()  # as the loop does after each micro-batch loss (Clip-Cov's next draw)
    return out, logp.grad


def plain_grpo_loss_and_grad(b: dict, clip=(0.2, 0.2, 3.0)):
    logp = b["logp"].clone().requires_grad_(True)
    surr = ca.clipped_surrogate(logp, b["old_logp"], b["advantages"], eps_low=clip[0], eps_high=clip[1], dual_c=clip[2])
    loss = ca.agg_loss(surr.loss, b["mask"], "token-mean")
    loss.backward()
    return loss, logp.grad


def build(cfg: dict, seed: int = 0, T: int = 9) -> Algorithm:
    return Algorithm.from_config(cfg, max_response_length=T, seed=seed)


seeds = st.integers(0, 10_000)


# ------------------------------------------------------------------------------------------
# identity: none and a closed STARE gate are plain GRPO, bit for bit
# ------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    seed=seeds,
    dtype=st.sampled_from([torch.float32, torch.float64]),
    variant=st.sampled_from(["O1", "C2"]),
    scope=st.sampled_from(["micro", "batch"]),
)
def test_none_and_closed_gate_reproduce_grpo_bitwise(seed, dtype, variant, scope):
    b = make_batch(seed, dtype=dtype)
    ref_loss, ref_grad = plain_grpo_loss_and_grad(b)
    for cfg in ({}, {"interventions": ["none"]}, {"interventions": ["stare"], "stare": {"variant": variant, "scope": scope}}):
        algo = build(cfg)
        algo.begin_step(0.9)  # above h_tgt = 0.3: gate closed
        extras = algo.prepare("batch", **b)
        out, grad = loss_and_grad(algo, b, extras)
        assert torch.equal(out.loss, ref_loss), cfg
        assert torch.equal(grad, ref_grad), cfg
    assert build({"interventions": ["stare"]}).step_metrics()["stare/gate_on"] == 0.0  # closed before any step


# ------------------------------------------------------------------------------------------
# STARE
# ------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    seed=seeds,
    p=st.sampled_from([0.05, 0.1, 0.3, 0.7, 1.0]),
    variant=st.sampled_from(["O1", "C2"]),
    w=st.floats(1.0, 2.0),
    m=st.floats(0.05, 1.0),
)
def test_stare_never_flips_gradient_sign(seed, p, variant, w, m):
    b = make_batch(seed)
    _, ref_grad = plain_grpo_loss_and_grad(b, clip=(0.2, 0.28, 10.0))
    algo = build({"clip": DAPO_CLIP, "interventions": ["stare"], "stare": {"p": p, "w": w, "m": m, "variant": variant}})
    algo.begin_step(0.1)  # gate open
    out, grad = loss_and_grad(algo, b)
    assert torch.equal(torch.sign(grad), torch.sign(ref_grad))
    # the weights are exactly 1, W or M
    ratio = grad[ref_grad != 0] / ref_grad[ref_grad != 0]
    allowed = torch.tensor([1.0, w, m], dtype=ratio.dtype)
    assert torch.all((ratio.unsqueeze(-1) - allowed).abs().min(-1).values < 1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, p=st.sampled_from([0.01, 0.1, 0.25, 0.5, 1.0]))
def test_stare_selects_top_surprisal_per_pool(seed, p):
    b = make_batch(seed)
    algo = build({"interventions": ["stare"], "stare": {"p": p, "variant": "C2"}})
    sel = algo.interventions[0].select(TokenBatch(b["logp"], b["old_logp"], b["entropy"], b["advantages"], b["mask"]))
    s = -b["logp"]
    valid = b["mask"].bool()
    pools = {"stare/l_plus": valid & (b["advantages"] > 0), "stare/l_minus": valid & (b["advantages"] < 0)}
    for key, pool in pools.items():
        chosen = sel[key]
        assert not torch.any(chosen & ~pool)
        assert int(chosen.sum()) == ca.selection_count(int(pool.sum()), p)
        rest = pool & ~chosen
        if chosen.any() and rest.any():
            assert s[chosen].min() >= s[rest].max()


@settings(max_examples=30, deadline=None)
@given(
    entropies=st.lists(st.one_of(st.floats(0.0, 3.0), st.just(float("nan")), st.just(float("inf"))), min_size=1, max_size=60),
    alpha=st.floats(0.001, 0.5),
    w=st.floats(1.0, 1.5),
    m=st.floats(0.5, 1.0),
)
def test_stare_adaptive_weights_stay_in_bounds(entropies, alpha, w, m):
    algo = build(
        {
            "interventions": ["stare"],
            "stare": {"adaptive": True, "alpha": alpha, "w": w, "m": m, "w_max": 1.5, "m_min": 0.5, "variant": "C2"},
        }
    )
    prev = algo.step_metrics()
    for h in entropies:
        algo.begin_step(h)
        cur = algo.step_metrics()
        assert 1.0 <= cur["stare/w"] <= 1.5 and 0.5 <= cur["stare/m"] <= 1.0
        if not math.isfinite(h):
            assert cur == prev  # a broken reading moves nothing
        else:
            assert cur["stare/gate_on"] == float(h < 0.3)
        prev = cur


def test_stare_scopes_agree_when_batch_is_one_micro_batch():
    b = make_batch(7, B=12)
    losses = {}
    for scope in ("micro", "mini", "batch"):
        algo = build({"interventions": ["stare"], "stare": {"scope": scope, "variant": "C2", "p": 0.3}})
        algo.begin_step(0.1)
        extras = algo.prepare("batch", **b)
        extras.update(algo.prepare("mini", **b))
        assert (len(extras) > 0) == (scope != "micro")
        losses[scope] = loss_and_grad(algo, b, extras)[0].loss
    assert torch.equal(losses["micro"], losses["mini"]) and torch.equal(losses["micro"], losses["batch"])


def test_stare_batch_scope_differs_from_micro_on_a_slice_and_needs_extras():
    b = make_batch(3, B=16)
    algo = build({"interventions": ["stare"], "stare": {"scope": "batch", "p": 0.1}})
    algo.begin_step(0.1)
    extras = algo.prepare("batch", **b)
    rows = torch.arange(4)
    part = {k: v[rows] for k, v in b.items()}
    sliced = {k: v[rows] for k, v in extras.items()}
    out_b = algo.loss(**part, extras=sliced)
    micro = build({"interventions": ["stare"], "stare": {"scope": "micro", "p": 0.1}})
    micro.begin_step(0.1)
    out_m = micro.loss(**part)
    # batch-level top-10% is a stricter selection on a slice than the slice's own top-10%
    assert out_b.metrics["stare/l_plus_frac"] <= out_m.metrics["stare/l_plus_frac"]
    with pytest.raises(RuntimeError, match="prepare"):
        algo.loss(**part)


# ------------------------------------------------------------------------------------------
# STEER
# ------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(seed=seeds, lmin=st.floats(0.05, 1.0), lmax_extra=st.floats(0.0, 1.0), spread=st.sampled_from([0.0, 0.01, 0.5, 3.0]))
def test_steer_weights_in_range(seed, lmin, lmax_extra, spread):
    b = make_batch(seed, spread=spread)
    omega = entropy_change_estimate(b["logp"], b["old_logp"], b["entropy"], b["advantages"], b["mask"])
    valid = b["mask"].bool()
    w = steer_weights(omega, b["mask"], mapping="exp", lambda_min=lmin)
    assert torch.all(w[~valid] == 0)
    assert torch.all((w[valid] >= lmin - 1e-12) & (w[valid] <= 1.0))
    m = omega.abs()
    if m[valid].max() >= 0.02:  # the largest |Omega| gets exactly lambda_min
        assert w[valid][m[valid].argmax()].item() == pytest.approx(lmin, rel=1e-9)
    lmax = lmin + lmax_extra
    wl = steer_weights(omega, b["mask"], mapping="linear", lambda_min=lmin, lambda_max=lmax)
    assert torch.all(wl[~valid] == 0)
    assert torch.all((wl[valid] >= lmin - 1e-12) & (wl[valid] <= lmax + 1e-12))
    # monotone: a larger |Omega| never gets a larger weight
    order = torch.argsort(m[valid])
    assert torch.all(torch.diff(w[valid][order]) <= 1e-12)
    assert torch.all(torch.diff(wl[valid][order]) <= 1e-12)


def test_steer_linear_constant_omega_gives_midpoint():
    omega = torch.full((2, 3), 0.7)
    w = steer_weights(omega, torch.ones(2, 3), mapping="linear", lambda_min=0.8, lambda_max=1.2)
    assert torch.allclose(w, torch.full((2, 3), 1.0))


def test_steer_metrics():
    b = make_batch(2)
    out, _ = loss_and_grad(build({"interventions": ["steer"]}), b)
    assert 0.8 <= out.metrics["steer/weight_min"] <= out.metrics["steer/weight_mean"] <= 1.0


# ------------------------------------------------------------------------------------------
# Clip-Cov / KL-Cov
# ------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    seed=seeds,
    ratio=st.sampled_from([2e-4, 0.05, 0.2, 0.5]),
    lb=st.sampled_from([-1.0, 0.0, 0.05]),
    ub=st.sampled_from([0.5, 5.0]),
)
def test_clip_cov_zeros_exactly_the_chosen_count(seed, ratio, lb, ub):
    b = make_batch(seed, B=10, T=12, grpo=False)
    algo = build(
        {
            "clip": {"low": 0.2, "high": 0.28, "dual_c": 10.0},
            "interventions": ["clip_cov"],
            "clip_cov": {"ratio": ratio, "lb": lb, "ub": ub},
        },
        seed=seed,
    )
    out, grad = loss_and_grad(algo, b)
    valid = b["mask"].bool()
    surr = ca.clipped_surrogate(b["logp"], b["old_logp"], b["advantages"], eps_low=0.2, eps_high=0.28, dual_c=10.0)
    cov = ca.token_covariance(b["advantages"], b["logp"], b["mask"])
    cand = valid & ~surr.ratio_clipped & (cov > lb) & (cov < ub)
    n_valid = int(valid.sum())
    k = min(max(1, int(ratio * n_valid)), int(cand.sum()))
    # tokens that would have had a gradient but lost it
    killed = cand & (grad == 0)
    assert int(killed.sum()) == k
    # every other token's gradient is the unclipped max(L1, L2) one (no dual clip), scaled by 1/n_valid
    lp = b["logp"].clone().requires_grad_(True)
    ca.agg_loss(
        ca.clipped_surrogate(lp, b["old_logp"], b["advantages"], eps_low=0.2, eps_high=0.28, dual_c=None).loss, b["mask"]
    ).backward()
    keep = valid & ~killed
    torch.testing.assert_close(grad[keep], lp.grad[keep], rtol=1e-12, atol=1e-15)
    assert out.metrics["clip_cov/frac"] == pytest.approx(k / n_valid)


def test_clip_cov_is_reproducible_and_resumable():
    b = make_batch(11, B=10, T=12)
    cfg = {"interventions": ["clip_cov"], "clip_cov": {"ratio": 0.2, "lb": -10.0, "ub": 10.0}}
    a1, a2 = build(cfg, seed=5), build(cfg, seed=5)
    g1 = [loss_and_grad(a1, b)[1] for _ in range(3)]
    g2 = [loss_and_grad(a2, b)[1] for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(g1, g2))
    assert not torch.equal(g1[0], g1[1])  # a fresh draw per call
    resumed = build(cfg, seed=5)
    resumed.load_state_dict(build(cfg, seed=5).state_dict() | {"interventions": {"clip_cov": {"calls": 2}}})
    assert torch.equal(loss_and_grad(resumed, b)[1], g1[2])


@settings(max_examples=25, deadline=None)
@given(seed=seeds, ratio=st.sampled_from([2e-4, 0.1, 0.3]), kappa=st.sampled_from([0.0, 1.0, 2.5]))
def test_kl_cov_penalises_top_covariance_tokens(seed, ratio, kappa):
    b = make_batch(seed)
    out, grad = loss_and_grad(build({"interventions": ["kl_cov"], "kl_cov": {"ratio": ratio, "kappa": kappa}}), b)
    valid = b["mask"].bool()
    n_valid = int(valid.sum())
    k = min(max(1, int(ratio * n_valid)), n_valid)
    assert out.metrics["kl_cov/frac"] == pytest.approx(k / n_valid)
    assert out.metrics["clip/frac"] == 0.0
    cov = ca.token_covariance(b["advantages"], b["logp"], b["mask"])
    top = torch.zeros_like(valid)
    idx = torch.nonzero(valid.reshape(-1)).squeeze(-1)
    top.view(-1)[idx[torch.topk(cov.reshape(-1)[idx], k).indices]] = True
    d = b["logp"] - b["old_logp"]
    rho = torch.exp(d)
    want = (-b["advantages"] * rho + top * kappa * torch.sign(d)) * b["mask"] / n_valid
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------------------------
# high-entropy mask, sample reweighting, entropy bonus
# ------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(seed=seeds, rho=st.sampled_from([0.1, 0.2, 0.5, 1.0]))
def test_high_entropy_mask_keeps_top_entropy_gradients(seed, rho):
    b = make_batch(seed, grpo=False)
    b["old_logp"] = b["logp"].clone()  # ratio 1: nothing clipped, every valid token has a gradient
    _, ref = plain_grpo_loss_and_grad(b)
    out, grad = loss_and_grad(build({"interventions": ["high_entropy_mask"], "high_entropy_mask": {"rho": rho}}), b)
    valid = b["mask"].bool()
    kept = valid & (grad != 0)
    assert int(kept.sum()) == ca.selection_count(int(valid.sum()), rho)
    assert torch.equal(grad[kept], ref[kept])  # same denominator: kept tokens unchanged
    rest = valid & ~kept
    if rest.any():
        assert b["entropy"][kept].min() >= b["entropy"][rest].max()


def test_sample_reweight_scales_by_advantage_sign():
    b = make_batch(4)
    _, ref = plain_grpo_loss_and_grad(b)
    _, grad = loss_and_grad(
        build({"interventions": ["sample_reweight"], "sample_reweight": {"pos_weight": 0.1, "neg_weight": 2.0}}), b
    )
    pos, neg = b["advantages"] > 0, b["advantages"] < 0
    torch.testing.assert_close(grad[pos], 0.1 * ref[pos])
    torch.testing.assert_close(grad[neg], 2.0 * ref[neg])


def test_entropy_bonus_adds_term_with_gradient():
    b = make_batch(5)
    algo = build({"interventions": ["entropy_bonus"], "entropy_bonus": {"coef": 0.01}})
    assert algo.needs_entropy_grad and algo.step_metrics() == {"entropy_bonus/coef": 0.01}
    ent = b["entropy"].clone().requires_grad_(True)
    logp = b["logp"].clone().requires_grad_(True)
    out = algo.loss(logp=logp, old_logp=b["old_logp"], entropy=ent, advantages=b["advantages"], mask=b["mask"])
    plain = build({}).loss(**b).loss
    torch.testing.assert_close(out.loss, plain - 0.01 * ca.masked_mean(b["entropy"], b["mask"]))
    out.loss.backward()
    torch.testing.assert_close(ent.grad, -0.01 * b["mask"] / b["mask"].sum())
    with pytest.raises(RuntimeError, match="entropy_grad"):
        algo.loss(
            logp=b["logp"].clone().requires_grad_(True),
            old_logp=b["old_logp"],
            entropy=b["entropy"],
            advantages=b["advantages"],
            mask=b["mask"],
        )


@settings(max_examples=30, deadline=None)
@given(
    entropies=st.lists(st.one_of(st.floats(0.0, 2.0), st.just(float("nan"))), min_size=1, max_size=80),
    delta=st.floats(0.0, 0.05),
    cmax=st.floats(0.0, 0.1),
)
def test_adaptive_entropy_coef_stays_in_bounds_and_moves_toward_target(entropies, delta, cmax):
    algo = build({"interventions": ["adaptive_entropy"], "adaptive_entropy": {"delta": delta, "coef_max": cmax, "target": 0.3}})
    coef = algo.step_metrics()["entropy_bonus/coef"]
    for h in entropies:
        algo.begin_step(h)
        new = algo.step_metrics()["entropy_bonus/coef"]
        assert 0.0 <= new <= cmax
        if math.isnan(h):
            assert new == coef
        elif h < 0.3:
            assert new >= coef
        elif h > 0.3:
            assert new <= coef
        coef = new


# ------------------------------------------------------------------------------------------
# composition and the registry
# ------------------------------------------------------------------------------------------


@pytest.fixture()
def test_interventions():
    """Two toy interventions that replace the per-token loss: add 1, double. Order matters."""

    @register_intervention("_test_add_one")
    class AddOne(Intervention):
        @dataclass
        class Params:
            pass

        def apply(self, ctx):
            ctx.pg_loss = ctx.pg_loss + 1.0
            ctx.metrics.setdefault("_order", "")
            ctx.metrics["_order"] += "a"

    @register_intervention("_test_double")
    class Double(Intervention):
        @dataclass
        class Params:
            pass

        def apply(self, ctx):
            ctx.pg_loss = ctx.pg_loss * 2.0
            ctx.metrics.setdefault("_order", "")
            ctx.metrics["_order"] += "d"

    yield
    INTERVENTIONS.pop("_test_add_one")
    INTERVENTIONS.pop("_test_double")


def test_composition_order_is_applied(test_interventions):
    b = make_batch(9)
    base = build({}).loss(**b).loss
    ad = build({"interventions": ["_test_add_one", "_test_double"]}).loss(**b)
    da = build({"interventions": ["_test_double", "_test_add_one"]}).loss(**b)
    assert ad.metrics["_order"] == "ad" and da.metrics["_order"] == "da"
    torch.testing.assert_close(ad.loss, (base + 1) * 2)
    torch.testing.assert_close(da.loss, base * 2 + 1)


def test_real_interventions_compose_in_list_order():
    b = make_batch(10, B=10, T=12)
    cfg = lambda order: {
        "interventions": order,
        "clip_cov": {"ratio": 0.1, "lb": -10.0, "ub": 10.0},  # noqa: E731
        "kl_cov": {"ratio": 0.3, "kappa": 5.0},
    }
    l1 = build(cfg(["clip_cov", "kl_cov"])).loss(**b)
    l2 = build(cfg(["kl_cov", "clip_cov"])).loss(**b)
    assert not torch.allclose(l1.loss, l2.loss)  # the later one's per-token loss wins
    # STARE then STEER multiply their weights: the same as either order
    s1 = build({"interventions": ["stare", "steer"]})
    s2 = build({"interventions": ["steer", "stare"]})
    s1.begin_step(0.1)
    s2.begin_step(0.1)
    torch.testing.assert_close(s1.loss(**b).loss, s2.loss(**b).loss)


def test_registry_rejects_duplicates_and_lists_choices():
    with pytest.raises(ValueError, match="already registered"):
        register_intervention("stare")(type("Other", (Intervention,), {}))
    with pytest.raises(UserError, match="unknown algo.interventions entry=starre; valid: .*clip_cov.*stare.*steer"):
        build({"interventions": ["starre"]})
    assert {
        "none",
        "stare",
        "steer",
        "clip_cov",
        "kl_cov",
        "high_entropy_mask",
        "sample_reweight",
        "entropy_bonus",
        "adaptive_entropy",
    } <= set(INTERVENTIONS)
