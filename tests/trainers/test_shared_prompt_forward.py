"""``trainer.share_prompt_forward``: the rows of a forward that share a prompt run it once
(``stats/policy_stats.shared_prompt_hidden``). What it must keep: every row's log-probs, entropies
and the gradient they carry are the plain forward's (up to float rounding), whatever the order of the
rows, the padding of the prompts and the architecture; and it steps aside where it cannot apply."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from entropyrl.rollout.base import Rollout
from entropyrl.trainers.stats.policy_stats import response_token_stats, shared_prompt_hidden

VOCAB, PAD = 23, 0


def _model(kind: str):
    torch.manual_seed(0)
    shape = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
    )
    config = Qwen2Config(**shape) if kind == "qwen2" else LlamaConfig(**shape)
    model = (Qwen2ForCausalLM if kind == "qwen2" else LlamaForCausalLM)(config)
    return model.train()


def _rollout(groups: int = 4, n: int = 3, width: int = 7, r_len: int = 5, seed: int = 1) -> Rollout:
    """``groups`` prompts of different lengths (left-padded), ``n`` responses each of different lengths
    (right-padded), the rows shuffled so a group's rows are not next to each other."""
    g = torch.Generator().manual_seed(seed)
    ids, mask = torch.full((groups, width), PAD), torch.zeros(groups, width, dtype=torch.long)
    for i in range(groups):
        length = 2 + i % (width - 1)
        ids[i, width - length :] = torch.randint(1, VOCAB, (length,), generator=g)
        mask[i, width - length :] = 1
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    rows = groups * n
    lengths = torch.randint(1, r_len + 1, (rows,), generator=g)
    r_mask = (torch.arange(r_len)[None] < lengths[:, None]).long()
    r_ids = torch.randint(1, VOCAB, (rows, r_len), generator=g) * r_mask
    order = torch.randperm(rows, generator=g)
    return Rollout(ids[order], mask[order], r_ids[order], r_mask[order], [""] * rows, lengths[order] == r_len)


def _stats_and_grads(model, roll: Rollout, share: bool):
    model.zero_grad()
    logp, entropy = response_token_stats(model, roll, temperature=0.9, chunk_size=16, entropy_grad=True, share_prompts=share)
    ((logp * roll.response_mask).sum() + entropy.sum()).backward()
    return logp.detach(), entropy.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_shared_prompts_give_the_plain_forwards_statistics_and_gradient(kind):
    model, roll = _model(kind), _rollout()
    plain, shared = _stats_and_grads(model, roll, False), _stats_and_grads(model, roll, True)
    torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=1e-5)
    assert shared[2].keys() == plain[2].keys() and len(plain[2]) == len(list(model.parameters()))
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # the null: a gather that gave rows another group's prompt would not pass the comparison above
    wrong = _rollout()
    wrong.prompt_ids = wrong.prompt_ids.roll(1, dims=0)
    wrong.prompt_mask = wrong.prompt_mask.roll(1, dims=0)
    other = _stats_and_grads(model, wrong, True)
    assert (other[0] - plain[0]).abs().max() > 1e-2


def test_it_runs_each_distinct_prompt_once():
    model, roll = _model("qwen2"), _rollout(groups=4, n=3)
    seen: list[int] = []
    hook = model.model.register_forward_hook(
        lambda m, args, kwargs, out: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    with torch.no_grad():
        hidden = shared_prompt_hidden(model.model, roll, torch.device("cpu"))
    hook.remove()
    assert seen == [4, 12] and hidden.shape == (12, 5, 32)  # 4 prompts once, then the 12 responses on their caches


def test_it_steps_aside_where_it_cannot_apply():
    model = _model("qwen2")
    distinct = _rollout(groups=6, n=1)
    assert shared_prompt_hidden(model.model, distinct, torch.device("cpu")) is None  # no two rows share a prompt
    model.gradient_checkpointing_enable()
    assert shared_prompt_hidden(model.model, _rollout(), torch.device("cpu")) is None  # no cache under checkpointing
    model.eval()  # checkpointing acts in training mode only: shared again
    with torch.no_grad():
        assert shared_prompt_hidden(model.model, _rollout(), torch.device("cpu")) is not None


@pytest.mark.slow
def test_a_training_run_with_shared_prompts_follows_the_plain_one(fast_train, in_tmp):
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import train

    def first_step(share: bool, out: str) -> dict:
        over = [*fast_train, "trainer.total_steps=1", "trainer.val_every=0", "val.prompts=0", "tracking.enabled=false"]
        cfg = compose("train", [*over, f"trainer.share_prompt_forward={str(share).lower()}", f"output_dir={out}"])
        train(cfg, log=lambda *_: None)
        rows = [json.loads(line) for line in (in_tmp / out / "metrics.jsonl").read_text().splitlines()]
        return next(r for r in rows if "entropy" in r)

    plain, shared = first_step(False, "plain"), first_step(True, "shared")
    # the same samples (generation does not read the key) scored by the same weights: equal statistics
    for key in ("entropy", "reward/mean", "response_length/mean", "loss", "grad_norm"):
        if key in plain:
            assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
