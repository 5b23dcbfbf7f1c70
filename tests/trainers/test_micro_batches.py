"""Token-budget micro-batches (trainers/data/micro_batches.py, ``trainer.micro_batch_tokens``):
the packing, and one training step whose gradients equal the padded path's."""

from __future__ import annotations

import torch

from entropyrl.trainers.data import micro_batches
from entropyrl.trainers.data.micro_batches import balance, by_count, by_tokens, padded_tokens, trim


def test_longest_first_packing_within_the_budget():
    prompts = torch.tensor([3, 3, 3, 3, 3, 3])
    responses = torch.tensor([1, 17, 2, 5, 30, 1])
    passes = by_tokens(prompts, responses, budget=40)
    assert sorted(int(i) for p in passes for i in p) == list(range(6))  # every row once
    assert [p.tolist() for p in passes] == [[4], [1, 3], [0, 2, 5]]  # longest first, greedy
    for p in passes:
        cost = len(p) * (int(prompts[p].max()) + int(responses[p].max()))
        assert cost <= 40 or len(p) == 1
    balanced = balance(passes, 5)
    assert len(balanced) == 5 and sorted(int(i) for p in balanced for i in p) == list(range(6))
    assert [len(p) for p in balance([torch.tensor([0])], 2)] == [1, 0]  # a pairing-only pass
    assert [p.tolist() for p in by_count(5, 2)] == [[0, 1], [2, 3], [4]]


def _trainer(extra: list[str]):
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import GRPOTrainer

    cfg = compose(
        "train",
        [
            "trainer.prompts_per_step=8",
            "trainer.mini_batch_prompts=8",
            "rollout.n=4",
            "trainer.micro_batch_responses=8",
            "rollout.max_new_tokens=12",
            "trainer.grad_clip=1e9",
            "tracking.enabled=false",
            "trainer.progress=false",
            "val.prompts=0",
            "trainer.seed=3",
            "output_dir=unused",
            *extra,
        ],
    )
    trainer = GRPOTrainer(cfg, log=lambda *_: None)
    # plain SGD at lr 1: the step moves every weight by exactly minus its gradient
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    return trainer


def test_token_budget_step_has_the_padded_paths_gradients(in_tmp):
    padded = _trainer([])
    before = {k: v.detach().clone() for k, v in padded.model.state_dict().items()}
    collected = padded.collect()
    roll = collected[0].responses
    lengths = roll.prompt_mask.sum(1) + roll.response_mask.sum(1)
    assert int(lengths.max()) > int(lengths.min())  # lengths spread: packing matters
    m_pad = padded.train_step(collected)
    budget = _trainer(["trainer.micro_batch_tokens=60"])
    m_tok = budget.train_step(collected)
    moved = {k: before[k] - v for k, v in padded.model.state_dict().items()}
    for key, value in budget.model.state_dict().items():
        grad_tok, grad_pad = before[key] - value, moved[key]
        assert torch.allclose(grad_tok, grad_pad, atol=1e-6, rtol=1e-5), (key, float((grad_tok - grad_pad).abs().max()))
    assert max(float(g.abs().max()) for g in moved.values()) > 1e-3  # the step did move the weights
    assert abs(m_pad["loss/objective"] - m_tok["loss/objective"]) <= 1e-6 * max(1.0, abs(m_pad["loss/objective"]))
    # fewer positions through the model than the padded passes
    passes = micro_batches.passes(roll, budget.cfg.trainer, budget.dist)
    assert len(passes) > 1
    assert padded_tokens(roll, passes, trimmed=True) < padded_tokens(roll, by_count(len(roll.texts), 8), trimmed=False)


def test_trim_drops_only_unused_columns():
    from entropyrl.rollout.base import Rollout

    pm = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]])
    rm = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    roll = Rollout(pm * 5, pm, rm * 7, rm, ["a", "b"], torch.tensor([False, False]), None)
    cut, width = trim(roll)
    assert width == 2 and cut.prompt_ids.shape == (2, 2) and cut.response_ids.shape == (2, 2)
    assert torch.equal(cut.prompt_mask, pm[:, 2:]) and torch.equal(cut.response_mask, rm[:, :2])
