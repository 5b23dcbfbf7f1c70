"""The ``tis`` corrections over their declared unit (``algo.tis.scope``) and M2PO as its paper
defines it (trainers/interventions/tis.py): the mask at scope batch or mini is the same whatever
the micro-batch partition, the default objective is the paper's clip-free one (the clipped loss
behind ``m2po_clip``), only trust-region tokens are masked, and a unit whose every token would be
masked keeps one and says so."""

from __future__ import annotations

import pytest
import torch

from entropyrl.core.errors import UserError
from entropyrl.rollout.base import Rollout
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.algos.step_batch import StepBatch
from entropyrl.trainers.interventions.tis import m2po_mask

ROWS, WIDTH = 4, 6


def _batch(seed: int = 0, spread=(1.2, 0.05, 0.05, 0.05)) -> StepBatch:
    """A scored step batch: row ``i``'s behaviour log-probs ``spread[i]``-wide noise away from the
    proximal ones (row 0 far, the others near), advantages +1 / -1 by row, every token valid."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(ROWS, WIDTH, dtype=torch.float64)
    old = -torch.rand(ROWS, WIDTH, generator=g, dtype=torch.float64) - 0.5
    noise = torch.randn(ROWS, WIDTH, generator=g, dtype=torch.float64) * torch.tensor(spread, dtype=torch.float64)[:, None]
    roll = Rollout(
        prompt_ids=torch.zeros(ROWS, 2, dtype=torch.long),
        prompt_mask=torch.ones(ROWS, 2, dtype=torch.long),
        response_ids=torch.zeros(ROWS, WIDTH, dtype=torch.long),
        response_mask=mask.long(),
        texts=[f"r{i}" for i in range(ROWS)],
        truncated=torch.zeros(ROWS, dtype=torch.bool),
    )
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)[:, None].expand(ROWS, WIDTH).clone()
    return StepBatch(
        roll,
        torch.zeros(ROWS),
        torch.zeros(ROWS),
        torch.arange(ROWS) // 2,
        mask=mask,
        old_logp=old,
        entropy=torch.rand(ROWS, WIDTH, generator=g, dtype=torch.float64),
        sampler_logp=old - noise,
        advantages=adv,
    )


def _algo(**tis) -> Algorithm:
    return Algorithm.from_config({"interventions": ["tis"], "tis": {"mode": "m2po", **tis}}, max_response_length=WIDTH)


def _masked(algo: Algorithm, batch: StepBatch, parts: list[list[int]]) -> torch.Tensor:
    """The tokens masked by the loop's path (select at batch and mini level, then one loss per
    micro-batch of ``parts``), put back in place: ``[ROWS, WIDTH]`` bool."""
    step = algo.select(batch, "batch")
    mini = algo.select(step[torch.arange(ROWS)], "mini")
    out = torch.zeros(ROWS, WIDTH, dtype=torch.bool)
    for rows in parts:
        idx = torch.tensor(rows)
        micro = mini[idx]
        loss = algo.micro_loss(micro, logp=micro.old_logp.clone().requires_grad_(True), entropy=micro.entropy)
        out[idx] = loss.tokens.token_masks["rollout/tis_clip_frac"]
    return out


WHOLE, SINGLE_ROWS = [[0, 1, 2, 3]], [[0], [1], [2], [3]]


@pytest.mark.parametrize("scope", ["batch", "mini"])
def test_the_m2po_mask_at_scope_batch_or_mini_does_not_depend_on_the_micro_batches(scope):
    batch = _batch()
    algo = _algo(scope=scope)
    whole, single = _masked(algo, batch, WHOLE), _masked(algo, batch, SINGLE_ROWS)
    assert whole.any() and torch.equal(whole, single)
    # the unit is the batch: the same mask as the batch's own
    behaviour = m2po_mask(batch.old_logp - batch.sampler_logp, batch.mask, 0.04, batch.advantages)
    assert torch.equal(whole, ~behaviour.keep)


def test_at_scope_micro_the_m2po_mask_follows_the_micro_batches():
    batch = _batch()
    algo = _algo(scope="micro")
    assert not torch.equal(_masked(algo, batch, WHOLE), _masked(algo, batch, SINGLE_ROWS))


def test_the_other_modes_weigh_the_same_at_every_scope():
    batch = _batch()
    for mode in ("token", "icepop", "seq_mask", "decoupled"):
        weights = []
        for scope in ("micro", "mini", "batch"):
            algo = Algorithm.from_config(
                {"interventions": ["tis"], "tis": {"mode": mode, "scope": scope}}, max_response_length=WIDTH
            )
            step = algo.select(algo.select(batch, "batch"), "mini")
            out = [
                algo.micro_loss(step[torch.tensor([i])], logp=step.old_logp[i : i + 1], entropy=step.entropy[i : i + 1])
                for i in range(ROWS)
            ]
            weights.append(torch.cat([o.tokens.weights for o in out]))
        torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=1e-12)
        torch.testing.assert_close(weights[0], weights[2], rtol=0, atol=1e-12)


def test_scope_global_is_refused_for_tis():
    with pytest.raises(UserError, match=r"algo.tis.scope=global is not supported.*micro, mini, batch"):
        _algo(scope="global")


def _loss(algo: Algorithm, batch: StepBatch, logp: torch.Tensor):
    logp = logp.clone().requires_grad_(True)
    step = algo.select(algo.select(batch, "batch"), "mini")
    out = algo.micro_loss(step, logp=logp, entropy=step.entropy)
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out, grad


def test_m2po_defaults_to_the_papers_clip_free_objective():
    batch = _batch(spread=(0.3, 0.3, 0.3, 0.3))
    logp = batch.old_logp + 0.5 * torch.sign(batch.advantages)  # far outside the clip range, on the improving side
    out, grad = _loss(_algo(), batch, logp)
    keep = m2po_mask(batch.old_logp - batch.sampler_logp, batch.mask, 0.04, batch.advantages).keep
    assert (~keep).any() and keep.any()
    # eq. 5: -1/N sum M A pi_theta / pi_behav over every valid token (masked ones in the normaliser)
    n = batch.mask.sum()
    per_token = keep * batch.advantages * torch.exp(logp - batch.sampler_logp)
    torch.testing.assert_close(out.loss.detach(), -per_token.sum() / n)
    torch.testing.assert_close(grad, -per_token / n)
    assert out.metrics["clip/frac"] == 0.0  # no trust-region clip
    assert out.metrics["rollout/m2po_masked_frac"] == pytest.approx(float((~keep).sum() / n))
    # the switch: the clipped surrogate against pi_prox under the same mask; the clip cuts here
    clipped, clipped_grad = _loss(_algo(m2po_clip=True), batch, logp)
    assert clipped.metrics["clip/frac"] > 0.5 and not torch.allclose(clipped_grad, grad)
    assert clipped.metrics["rollout/tis_clip_frac"] == out.metrics["rollout/tis_clip_frac"]


def test_m2po_masks_only_trust_region_tokens():
    d = torch.tensor([[0.9, -0.9, 0.05, 0.5]], dtype=torch.float64)  # log r
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]], dtype=torch.float64)
    got = m2po_mask(d, torch.ones_like(d), 0.04, adv)
    # A > 0 with r > 1: tokens 0 and 2; token 1 (A > 0, r < 1) and 3 (A < 0, r > 1) cannot be clipped by PPO
    assert got.candidates.tolist() == [[True, False, True, False]]
    assert got.keep.tolist() == [[False, True, True, True]] and not got.forced.any()
    # without advantages every valid token is a candidate (AReaL's rule): the largest squares go first
    assert m2po_mask(d, torch.ones_like(d), 0.04).keep.tolist() == [[False, False, True, False]]


def test_a_unit_whose_every_token_would_be_masked_keeps_the_smallest_and_says_so():
    d = torch.tensor([[0.9, 0.5, -0.7], [0.6, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    got = m2po_mask(d, mask, 0.04)
    assert got.keep.tolist() == [[False, True, False], [False, False, False]] and torch.equal(got.keep, got.forced)
    # through the loss: the forced token is counted and the loss is not zero
    batch = _batch(spread=(0.0, 0.0, 0.0, 0.0))
    batch = batch.with_(
        sampler_logp=batch.old_logp - 0.5 * torch.sign(batch.advantages)
    )  # every token a candidate, (log r)^2 = 0.25
    out, grad = _loss(_algo(), batch, batch.old_logp)
    assert out.metrics["rollout/m2po_forced_frac"] == pytest.approx(1 / 24) and out.metrics[
        "rollout/m2po_masked_frac"
    ] == pytest.approx(23 / 24)
    assert int((grad != 0).sum()) == 1


def test_the_clip_free_objective_refuses_to_overwrite_an_earlier_interventions_loss():
    algo = Algorithm.from_config({"interventions": ["kl_cov", "tis"], "tis": {"mode": "m2po"}}, max_response_length=WIDTH)
    with pytest.raises(UserError, match="list tis first in algo.interventions, or set algo.tis.m2po_clip=true"):
        _loss(algo, _batch(), _batch().old_logp)
    ok = Algorithm.from_config(
        {"interventions": ["kl_cov", "tis"], "tis": {"mode": "m2po", "m2po_clip": True}}, max_response_length=WIDTH
    )
    assert torch.isfinite(_loss(ok, _batch(), _batch().old_logp)[0].loss)
