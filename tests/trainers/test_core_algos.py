"""Core RL math (docs/algorithms.md §2-4) against brute-force references, and the Algorithm facade."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.core.errors import UserError
from entropyrl.trainers.algos import core_algos as ca
from entropyrl.trainers.algos.algorithm import Algorithm

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------
# strategies
# ------------------------------------------------------------------------------------------


@st.composite
def grouped_rewards(draw, max_groups=4, max_size=5):
    sizes = draw(st.lists(st.integers(1, max_size), min_size=1, max_size=max_groups))
    ids = [g * 7 + 3 for g, s in enumerate(sizes) for _ in range(s)]  # arbitrary, non-contiguous ids
    perm = draw(st.permutations(range(len(ids))))
    ids = [ids[i] for i in perm]
    rewards = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0]), min_size=len(ids), max_size=len(ids)))
    T = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(1, T), min_size=len(ids), max_size=len(ids)))
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths], dtype=torch.float64)
    return torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids), mask


def groups_of(ids):
    out = {}
    for i, g in enumerate(ids.tolist()):
        out.setdefault(g, []).append(i)
    return out


# ------------------------------------------------------------------------------------------
# advantages vs a per-group Python reference
# ------------------------------------------------------------------------------------------


def reference_adv(name, r, ids, mask):
    r = r.tolist()
    lengths = mask.sum(-1).tolist()
    out = [0.0] * len(r)
    for members in groups_of(ids).values():
        rs = [r[i] for i in members]
        for i in members:
            if name == "grpo":
                mean, std = (statistics.mean(rs), statistics.stdev(rs)) if len(rs) > 1 else (0.0, 1.0)
                out[i] = (r[i] - mean) / (std + 1e-6)
            elif name in ("drgrpo", "reinforce_pp_baseline"):
                out[i] = r[i] - (statistics.mean(rs) if len(rs) > 1 else 0.0)
            elif name == "rloo":
                out[i] = r[i] - (sum(rs) - r[i]) / (len(rs) - 1) if len(rs) > 1 else r[i]
            elif name == "opo":
                ls = [lengths[j] for j in members]
                b = sum(l * x for l, x in zip(ls, rs)) / sum(ls) if len(rs) > 1 else 0.0
                out[i] = r[i] - b
    tok = torch.tensor(out, dtype=torch.float64).unsqueeze(-1) * mask
    if name == "reinforce_pp_baseline":
        vals = [tok[i, j].item() for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j] > 0]
        mean = statistics.mean(vals)
        var = statistics.variance(vals) if len(vals) > 1 else 0.0
        tok = (tok - mean) / math.sqrt(var + 1e-8) * mask
    return tok


@settings(max_examples=40, deadline=None)
@given(data=grouped_rewards(), name=st.sampled_from(sorted(ca.ADVANTAGE_ESTIMATORS)))
def test_advantages_match_reference(data, name):
    r, ids, mask = data
    got = ca.compute_advantages(name, r, ids, mask)
    assert got.shape == mask.shape
    assert torch.all(got[mask == 0] == 0)
    torch.testing.assert_close(got, reference_adv(name, r, ids, mask), rtol=1e-9, atol=1e-9)


def test_grpo_group_of_one_and_permutation():
    r = torch.tensor([1.0, 0.0, 1.0, 3.0])
    ids = torch.tensor([5, 9, 9, 2])
    mask = torch.ones(4, 2)
    adv = ca.compute_advantages("grpo", r, ids, mask)[:, 0]
    assert adv[0].item() == pytest.approx(1.0 / (1 + 1e-6))  # group of one: mean 0, std 1
    assert adv[3].item() == pytest.approx(3.0 / (1 + 1e-6))
    perm = torch.tensor([2, 0, 3, 1])
    torch.testing.assert_close(ca.compute_advantages("grpo", r[perm], ids[perm], mask)[:, 0], adv[perm])


def test_unknown_advantage_is_user_error():
    with pytest.raises(UserError, match="unknown algo.advantage=.*; valid: .*grpo"):
        ca.compute_advantages("gpro", torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 3))


# ------------------------------------------------------------------------------------------
# clipped surrogate
# ------------------------------------------------------------------------------------------


def reference_surrogate(lp, old, a, lo, hi, c):
    lr = max(-20.0, min(20.0, lp - old))
    rho = math.exp(lr)
    l1, l2 = -a * rho, -a * min(max(rho, 1 - lo), 1 + hi)
    loss = max(l1, l2)
    if c is not None and a < 0:
        loss = min(loss, -a * c)
    return loss


finite = st.floats(-3.0, 3.0, allow_nan=False, allow_subnormal=False)  # a subnormal A has a gradient that flushes to 0


@settings(max_examples=40, deadline=None)
@given(
    vals=st.lists(st.tuples(st.floats(-6, 0), st.floats(-6, 0), finite), min_size=1, max_size=12),
    lo=st.sampled_from([0.2, 0.1, 1.0]),
    hi=st.sampled_from([0.2, 0.28]),
    c=st.sampled_from([3.0, 10.0, None]),
)
def test_clipped_surrogate_matches_reference(vals, lo, hi, c):
    lp = torch.tensor([[v[0] for v in vals]], dtype=torch.float64)
    old = torch.tensor([[v[1] for v in vals]], dtype=torch.float64)
    a = torch.tensor([[v[2] for v in vals]], dtype=torch.float64)
    out = ca.clipped_surrogate(lp, old, a, eps_low=lo, eps_high=hi, dual_c=c)
    want = torch.tensor([[reference_surrogate(*v, lo, hi, c) for v in vals]], dtype=torch.float64)
    torch.testing.assert_close(out.loss, want, rtol=1e-12, atol=1e-12)
    # "clipped" means the token's gradient w.r.t. logp is cut
    lp_ = lp.clone().requires_grad_(True)
    ca.clipped_surrogate(lp_, old, a, eps_low=lo, eps_high=hi, dual_c=c).loss.sum().backward()
    assert torch.equal(lp_.grad[out.clipped], torch.zeros_like(lp_.grad[out.clipped]))
    nz = (~out.clipped) & (a != 0)
    assert torch.all(lp_.grad[nz] != 0)


def test_dual_clip_caps_negative_advantage_loss():
    lp, old = torch.tensor([[3.0]]), torch.tensor([[0.0]])  # rho = e^3 ~ 20
    out = ca.clipped_surrogate(lp, old, torch.tensor([[-1.0]]), eps_low=0.2, eps_high=0.2, dual_c=3.0)
    assert out.loss.item() == pytest.approx(3.0) and bool(out.dual_clipped.item())
    out = ca.clipped_surrogate(lp, old, torch.tensor([[-1.0]]), eps_low=0.2, eps_high=0.2, dual_c=None)
    assert out.loss.item() == pytest.approx(math.exp(3.0), rel=1e-6)


# ------------------------------------------------------------------------------------------
# aggregation, KL, entropy bonus
# ------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.lists(st.tuples(finite, st.booleans()), min_size=4, max_size=4), min_size=1, max_size=5))
def test_aggregations_match_reference(rows):
    loss = torch.tensor([[x for x, _ in r] for r in rows], dtype=torch.float64)
    mask = torch.tensor([[float(m) for _, m in r] for r in rows], dtype=torch.float64)
    valid = [(x, m) for r in rows for x, m in r if m]
    tm = sum(x for x, _ in valid) / len(valid) if valid else 0.0
    seqs = [sum(x for x, m in r if m) / sum(m for _, m in r) for r in rows if any(m for _, m in r)]
    smtm = sum(seqs) / len(seqs) if seqs else 0.0
    assert ca.agg_loss(loss, mask, "token-mean").item() == pytest.approx(tm, abs=1e-12)
    assert ca.agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(smtm, abs=1e-12)
    assert ca.agg_loss(loss, mask, "seq-mean-token-sum-norm", norm=9).item() == pytest.approx(
        sum(x for x, _ in valid) / 9, abs=1e-12
    )


def test_unknown_aggregation_is_user_error():
    with pytest.raises(UserError, match="token-mean"):
        ca.agg_loss(torch.ones(1, 2), torch.ones(1, 2), "mean")


def test_low_var_kl():
    lp = torch.tensor([-1.0, -2.0, -0.5, -30.0, 0.0], requires_grad=True)
    ref = torch.tensor([-1.0, -1.0, -2.0, 0.0, -30.0])
    kl = ca.low_var_kl(lp, ref)
    d = (ref - lp).detach()
    want = torch.clamp(torch.exp(d) - d - 1, -10, 10)
    torch.testing.assert_close(kl, want)
    assert kl[0].item() == 0.0 and torch.all(kl >= 0) and kl.max().item() <= 10.0
    kl.sum().backward()
    assert torch.isfinite(lp.grad).all()


def test_entropy_bonus_term():
    h = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert ca.entropy_bonus_term(h, mask, 0.5).item() == pytest.approx(-1.0)


# ------------------------------------------------------------------------------------------
# DAPO pieces, selection count
# ------------------------------------------------------------------------------------------


def test_filter_all_equal_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert ca.filter_all_equal_groups(r, ids).tolist() == [False, False, False, False, True, True, False]


def test_overlong_penalty_edges():
    pen = ca.overlong_penalty(torch.tensor([0, 6, 7, 8, 9, 10, 11]), 10, 4)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0])
    with pytest.raises(UserError):
        ca.overlong_penalty(torch.tensor([1]), 10, 0)


@pytest.mark.parametrize(
    "n,frac,k",
    [
        (0, 0.1, 0),
        (10, 0.0, 0),
        (10, 0.3, 3),
        (12, 0.3, 4),
        (18, 0.3, 6),
        (10, 0.7, 7),
        (100, 0.07, 7),  # 100 * 0.07 = 7.000000000000001
        (3, 0.1, 1),
        (5, 1.0, 5),
        (5, 2.0, 5),
    ],
)
def test_selection_count(n, frac, k):
    assert ca.selection_count(n, frac) == k


# ------------------------------------------------------------------------------------------
# the Algorithm facade
# ------------------------------------------------------------------------------------------


def batch(seed=0, B=6, T=5):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) > 0.2).double()
    mask[:, 0] = 1
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3).requires_grad_(True)
    ent = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    r = (torch.rand(B, generator=g) > 0.5).double()
    ids = torch.arange(B) // 3
    adv = ca.compute_advantages("grpo", r, ids, mask)
    return dict(logp=lp, old_logp=old, entropy=ent, advantages=adv, mask=mask)


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"advantage": "gpro"}, "unknown algo.advantage=gpro; valid: "),
        ({"loss_agg": "mean"}, "unknown algo.loss_agg=mean; valid: "),
        ({"interventions": ["stare", "nope"]}, "unknown algo.interventions entry=nope; valid: .*stare"),
        ({"interventions": ["stare", "stare"]}, "more than once"),
        ({"interventions": ["stare"], "stare": {"pp": 0.2}}, "algo.stare.pp.*valid keys"),
        ({"interventions": ["stare"], "stare": {"p": "x"}}, "must be a number"),
        ({"interventions": ["stare"], "stare": {"scope": "everywhere"}}, "scope"),
        ({"interventions": ["steer"], "steer": {"mapping": "cubic"}}, "exp, linear"),
        ({"clip": {"dual_c": 0.5}}, "dual_c"),
        ({"overlong": {"enabled": True, "buffer": 50}}, "buffer"),
    ],
)
def test_bad_config_is_one_line_user_error(cfg, match):
    with pytest.raises(UserError, match=match) as exc:
        Algorithm.from_config(cfg, max_response_length=8)
    assert "\n" not in str(exc.value)


def test_shape_rewards_and_keep_groups_follow_config():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0])
    ids = torch.tensor([0, 0, 1, 1])
    lengths = torch.tensor([3, 7, 8, 9])
    off = Algorithm.from_config({}, max_response_length=8)
    assert torch.equal(off.shape_rewards(r, lengths), r)
    assert off.keep_groups(r, ids).all()
    on = Algorithm.from_config(
        {"dynamic_sampling": {"enabled": True, "max_num_gen_batches": 3}, "overlong": {"enabled": True, "buffer": 2}},
        max_response_length=8,
    )
    assert on.max_num_gen_batches == 3
    assert on.shape_rewards(r, lengths).tolist() == pytest.approx([1.0, 0.5, -1.0, 0.0])
    assert on.keep_groups(r, ids).tolist() == [False, False, True, True]


def test_kl_term_and_needs_ref():
    b = batch()
    assert not Algorithm.from_config({}, max_response_length=5).needs_ref
    a = Algorithm.from_config({"kl_coef": 0.1}, max_response_length=5)
    assert a.needs_ref
    with pytest.raises(ValueError, match="ref_logp"):
        a.loss(**b)
    ref = b["old_logp"] - 0.2
    out = a.loss(**b, ref_logp=ref)
    plain = Algorithm.from_config({}, max_response_length=5).loss(**b).loss
    kl = ca.masked_mean(ca.low_var_kl(b["logp"], ref), b["mask"])
    torch.testing.assert_close(out.loss, plain + 0.1 * kl)
    assert out.metrics["loss/kl"] == pytest.approx(kl.item())


def test_loss_metrics_and_prepare_levels():
    b = batch()
    a = Algorithm.from_config({"interventions": ["stare"]}, max_response_length=5)
    out = a.loss(**b)
    for key in ("loss/policy", "clip/frac", "stare/l_plus_frac", "stare/l_minus_frac"):
        assert isinstance(out.metrics[key], float)
    with pytest.raises(ValueError):
        a.prepare("micro", **{k: v for k, v in b.items()})


def test_state_dict_roundtrip_is_json():
    cfg = {"interventions": ["stare", "adaptive_entropy", "clip_cov"], "stare": {"adaptive": True}}
    a = Algorithm.from_config(cfg, max_response_length=5, seed=3)
    for h in (0.1, 0.2, 0.5):
        a.begin_step(h)
    b0 = batch()
    a.loss(**{**b0, "entropy": b0["entropy"].requires_grad_(True)})
    state = json.loads(json.dumps(a.state_dict()))
    b = Algorithm.from_config(cfg, max_response_length=5, seed=3)
    assert b.step_metrics() != a.step_metrics()
    b.load_state_dict(state)
    assert b.step_metrics() == a.step_metrics()
    assert b.state_dict() == a.state_dict()


def test_every_algo_option_composes_and_builds():
    from entropyrl.conf import compose

    names = sorted(p.stem for p in (REPO / "conf" / "algo").glob("*.yaml"))
    assert {
        "grpo",
        "dapo",
        "drgrpo",
        "rloo",
        "opo",
        "stare",
        "stare_c2",
        "stare_adaptive",
        "steer",
        "steer_linear",
        "clip_cov",
        "kl_cov",
        "entropy_bonus",
        "adaptive_entropy",
        "high_entropy_mask",
    } <= set(names)
    b = batch()
    for name in names:
        text = (REPO / "conf" / "algo" / f"{name}.yaml").read_text()
        assert text.startswith("#") and f"entropyrl train algo={name}" in text, name
        cfg = compose("train", [f"algo={name}"])
        a = Algorithm.from_config(cfg.algo, max_response_length=int(cfg.rollout.max_new_tokens))
        assert a.name == name
        a.begin_step(0.1)
        ent = b["entropy"].clone().requires_grad_(a.needs_entropy_grad)
        # full-distribution statistics (AEnt, SIREN, Lp-Reg) come from the loop as extras
        extras = {k: b["entropy"].detach().clone().requires_grad_(True) for k in a.vocab_stats()}
        out = a.loss(**{**b, "entropy": ent}, ref_logp=b["old_logp"] if a.needs_ref else None, extras=extras)
        assert torch.isfinite(out.loss)
    over = compose("train", ["algo=stare", "algo.stare.p=0.2", "algo.interventions=[stare,entropy_bonus]"])
    a = Algorithm.from_config(over.algo, max_response_length=8)
    assert a.intervention_names == ["stare", "entropy_bonus"] and a.interventions[0].params.p == 0.2
    assert a.needs_entropy_grad
