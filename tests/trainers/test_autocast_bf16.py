"""``trainer.dtype=bfloat16 trainer.fsdp=false`` on one process: the transformer body runs under
``torch.autocast`` in bfloat16 (``stats/policy_stats.response_token_stats``'s ``body_dtype``), the output
head, the token statistics, the gradients and the parameters stay float32. What it must keep: the
float32 run's statistics and gradient direction up to bfloat16 rounding, and float32 everywhere the
optimizer looks; and it must be on only where asked (float32, and FSDP's own mixed precision, run no
autocast)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from entropyrl.conf import compose
from entropyrl.rollout.base import Rollout
from entropyrl.trainers.components import stats_kwargs
from entropyrl.trainers.parallel.process_group import setup
from entropyrl.trainers.stats.policy_stats import response_token_stats

VOCAB, PAD = 53, 0


def _model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
    )
    return Qwen2ForCausalLM(config).train()


def _rollout(rows: int = 6, width: int = 6, r_len: int = 7) -> Rollout:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (rows, width), generator=g)
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[::2, :2] = 0  # some rows left-padded
    ids = ids * mask
    r_ids = torch.randint(1, VOCAB, (rows, r_len), generator=g)
    r_mask = torch.ones(rows, r_len, dtype=torch.long)
    r_mask[1::3, -3:] = 0
    return Rollout(ids, mask, r_ids * r_mask, r_mask, [""] * rows, torch.zeros(rows, dtype=torch.bool))


def _stats(model, roll, body_dtype):
    model.zero_grad()
    body_out = []
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: body_out.append(o.dtype))
    logp, entropy = response_token_stats(model, roll, temperature=1.0, chunk_size=8, entropy_grad=True, body_dtype=body_dtype)
    hook.remove()
    ((logp * roll.response_mask).sum() + entropy.sum()).backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logp.detach(), entropy.detach(), grad, body_out


def test_the_body_runs_in_bfloat16_and_everything_the_loss_and_optimizer_see_stays_float32():
    model, roll = _model(), _rollout()
    logp32, ent32, grad32, body32 = _stats(model, roll, None)
    logp16, ent16, grad16, body16 = _stats(model, roll, torch.bfloat16)
    assert set(body32) == {torch.float32} and set(body16) == {torch.bfloat16}  # the body's products, as asked
    assert logp16.dtype == ent16.dtype == grad16.dtype == torch.float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    valid = roll.response_mask.bool()
    gap = (logp16 - logp32).abs()[valid]
    assert 0 < gap.max() < 0.05, gap.max()  # bfloat16 rounding: not the float32 numbers, and near them
    cosine = torch.nn.functional.cosine_similarity(grad16, grad32, dim=0)
    assert cosine > 0.99, cosine


@pytest.mark.parametrize(
    "overrides, autocast",
    [
        (["trainer.dtype=bfloat16", "trainer.fsdp=false"], True),
        (["trainer.dtype=bfloat16"], False),  # fsdp auto: FSDP's mixed-precision policy casts, not autocast
        (["trainer.dtype=float32", "trainer.fsdp=false"], False),
        ([], False),
    ],
)
def test_autocast_is_on_only_for_bfloat16_without_fsdp(overrides, autocast):
    assert stats_kwargs(compose("train", overrides))["body_dtype"] == (torch.bfloat16 if autocast else None)


def test_bfloat16_without_fsdp_on_one_process_is_accepted_and_starts_no_process_group():
    info = setup(compose("train", ["trainer.dtype=bfloat16", "trainer.fsdp=false"]).trainer)
    assert info.fsdp is False and info.owns_group is False and info.backend is None


def test_a_bfloat16_run_without_fsdp_trains_and_saves_float32_weights(fast_train, in_tmp):
    from entropyrl.trainers.trainer import train

    over = [*fast_train, "trainer.total_steps=2", "trainer.val_every=0", "val.prompts=0", "tracking.enabled=false"]
    cfg = compose("train", [*over, "trainer.dtype=bfloat16", "trainer.fsdp=false", "trainer.save_every=2", "output_dir=run"])
    train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "entropy" in r] == [1, 2]
    weights = list((in_tmp / "run").rglob("*.safetensors")) or list((in_tmp / "run").rglob("*.pt"))
    assert weights, sorted(p.name for p in (in_tmp / "run").rglob("*"))
    from safetensors.torch import load_file

    tensors = load_file(str(next(w for w in weights if w.suffix == ".safetensors")))
    assert {t.dtype for t in tensors.values()} == {torch.float32}
