"""``rollout.weights=int8 | bfloat16``: the hf engine samples from a lower-precision copy of the policy
(``rollout/sampler_copy.py``), made again after each weight sync, and reports that copy's log-probs
of the tokens it drew, so the trainer sees how far its sampler is from the policy it trains."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.models.loading import load_policy
from entropyrl.rollout.hf_engine import HFRollout
from entropyrl.rollout.sampler_copy import PackedLinear, bf16_copy, check_copy_model, int8_copy, packed_copy, sampled_logp

PROMPTS = ["12+7=", "3+4=", "8+15=", "1+1="]  # different lengths: the batch is left-padded
COPIES = pytest.mark.parametrize("weights", ["int8", "bfloat16"])  # another precision: another policy
EVERY_COPY = pytest.mark.parametrize("weights", ["float32_packed", "int8", "bfloat16"])


@pytest.fixture()
def tiny():
    cfg = compose("train")
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    return cfg, model, tok


def _engine(tiny, weights: str) -> HFRollout:
    cfg, model, tok = tiny
    return HFRollout(OmegaConf.merge(cfg.rollout, {"weights": weights}), model, tok)


@torch.no_grad()
def _policy_logp(model, roll, temperature: float) -> torch.Tensor:
    """``[B, R]`` log-probs of the rollout's response tokens under ``model`` at ``temperature``."""
    ids = torch.cat([roll.prompt_ids, roll.response_ids], dim=1)
    mask = torch.cat([roll.prompt_mask, roll.response_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    width = roll.prompt_ids.shape[1]
    step = logits[:, width - 1 : -1] / temperature
    return torch.log_softmax(step, -1).gather(-1, roll.response_ids.unsqueeze(-1)).squeeze(-1) * roll.response_mask


def test_the_float32_engine_reports_no_sampler_log_probs(tiny):
    roll = _engine(tiny, "float32").generate(PROMPTS, n=4, seed=3, temperature=1.0, max_new_tokens=6)
    assert roll.sampling_logp is None  # the trained model sampled: nothing to compare


def test_sampled_logp_is_the_models_own_log_prob_of_each_drawn_token(tiny):
    """On the float32 model the log-probs taken from ``generate``'s logits equal a forward's, at the
    sampling temperature; at another temperature they differ (the null)."""
    _, model, tok = tiny
    engine = _engine(tiny, "float32")
    roll = engine.generate(PROMPTS, n=2, seed=1, temperature=0.7, max_new_tokens=6)
    model.eval()
    ids, mask = roll.prompt_ids, roll.prompt_mask
    config = engine.settings  # the same sampling as the engine's, on the same prompts and seed
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=0.7,
        top_p=1.0,
        top_k=config.top_k,
        max_new_tokens=6,
        pad_token_id=tok.pad_token_id,
        return_dict_in_generate=True,
        output_logits=True,
    )
    new = out.sequences[:, ids.shape[1] :]
    width = min(new.shape[1], roll.response_ids.shape[1])
    from entropyrl.rollout.base import Rollout, response_mask_from_eos, stop_token_ids

    resp_mask, _ = response_mask_from_eos(new, stop_token_ids(model, tok))
    got = sampled_logp(out.logits, new, 0.7) * resp_mask
    again = Rollout(ids, mask, new, resp_mask, [""] * len(new), torch.zeros(len(new), dtype=torch.bool))
    want = _policy_logp(model, again, 0.7)
    assert width > 0 and resp_mask.sum() > 0
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert not torch.allclose(sampled_logp(out.logits, new, 1.0) * resp_mask, want, atol=1e-3)


@COPIES
def test_a_sampler_copy_is_near_the_policy_and_reports_its_own_log_probs(tiny, weights):
    _, model, _ = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    roll = _engine(tiny, weights).generate(PROMPTS, n=4, seed=3, temperature=1.0, max_new_tokens=6)
    assert roll.sampling_logp is not None and roll.sampling_logp.shape == roll.response_ids.shape
    assert torch.all(roll.sampling_logp[roll.response_mask == 0] == 0)
    diff = (roll.sampling_logp - _policy_logp(model, roll, 1.0)).abs()[roll.response_mask.bool()]
    assert 0 < diff.mean() < 0.1, diff.mean()  # near the policy, and not the policy itself
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the copy is made aside: the policy is untouched
    assert all(p.requires_grad for p in model.parameters())


@EVERY_COPY
def test_a_sampler_copy_follows_the_weights_at_each_sync(tiny, weights):
    _, model, _ = tiny
    engine = _engine(tiny, weights)
    engine.generate(PROMPTS, n=2, seed=3, temperature=1.0, max_new_tokens=6)  # the copy of the weights as they are
    with torch.no_grad():  # an update: every weight moves
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3 * p.std().clamp(min=1e-3))

    def gap() -> float:
        roll = engine.generate(PROMPTS, n=4, seed=3, temperature=1.0, max_new_tokens=6)
        return float((roll.sampling_logp - _policy_logp(model, roll, 1.0)).abs()[roll.response_mask.bool()].mean())

    stale = gap()  # null: no sync, the copy still holds the old weights
    engine.sync_weights()
    fresh = gap()
    assert fresh < 0.1 and fresh < 0.5 * stale, (fresh, stale)  # int8: about 0.03 against 0.27


@EVERY_COPY
def test_generate_ids_reports_the_copys_log_probs_of_each_continuation(tiny, weights):
    _, model, tok = tiny
    engine = _engine(tiny, weights)
    seqs = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    rows = engine.generate_ids(seqs, seed=2, temperature=1.0, top_p=1.0, max_new_tokens=5)
    assert all(logp is not None and len(logp) == len(ids) for ids, logp in rows)
    assert all(v <= 0 for _, logp in rows for v in logp)
    plain = _engine(tiny, "float32").generate_ids(seqs, seed=2, temperature=1.0, top_p=1.0, max_new_tokens=5)
    assert all(logp is None for _, logp in plain)


def test_the_int8_copy_of_a_model_off_the_cpu_is_refused_with_one_line(tiny):
    _, model, _ = tiny
    with pytest.raises(UserError, match="rollout.weights=int8 samples on CPU only"):
        check_copy_model(model.to("meta"), "int8")


def test_the_packed_copy_is_the_float32_policy_laid_out_for_the_product(tiny):
    """``float32_packed`` changes how each weight is laid out, not the policy: every linear layer is
    packed, its log-probs are the policy's up to float32 rounding (int8's differ by about 0.03), and
    at the same seed it draws the float32 engine's tokens."""
    _, model, _ = tiny
    sampler = packed_copy(model)
    assert not [m for m in sampler.modules() if type(m) is torch.nn.Linear]
    assert sum(isinstance(m, PackedLinear) for m in sampler.modules()) == sum(type(m) is torch.nn.Linear for m in model.modules())
    roll = _engine(tiny, "float32_packed").generate(PROMPTS, n=4, seed=3, temperature=1.0, max_new_tokens=6)
    diff = (roll.sampling_logp - _policy_logp(model, roll, 1.0)).abs()[roll.response_mask.bool()]
    assert diff.max() < 1e-4, diff.max()
    plain = _engine(tiny, "float32").generate(PROMPTS, n=4, seed=3, temperature=1.0, max_new_tokens=6)
    assert torch.equal(plain.response_ids, roll.response_ids)
    with pytest.raises(UserError, match="rollout.weights=float32_packed samples on CPU only"):
        check_copy_model(model.to("meta"), "float32_packed")


def test_the_int8_copy_quantizes_every_linear_layer(tiny):
    _, model, _ = tiny
    sampler = int8_copy(model)
    linear = [m for m in sampler.modules() if type(m) is torch.nn.Linear]
    quantized = [m for m in sampler.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert linear == [] and len(quantized) == sum(type(m) is torch.nn.Linear for m in model.modules())


def test_the_bf16_copy_holds_every_weight_in_bfloat16_and_leaves_the_policy_in_float32(tiny):
    _, model, _ = tiny
    sampler = bf16_copy(model)
    assert {p.dtype for p in sampler.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not any(p.requires_grad for p in sampler.parameters()) and not sampler.training


def test_a_bf16_copy_of_a_sharded_model_is_refused_with_one_line(tiny, monkeypatch):
    _, model, _ = tiny
    DTensor = type("DTensor", (torch.nn.Parameter,), {})  # what FSDP's parameters are called
    monkeypatch.setattr(model, "parameters", lambda: iter([DTensor(torch.zeros(1))]))
    with pytest.raises(UserError, match="rollout.weights=bfloat16 needs the whole model in one process"):
        check_copy_model(model, "bfloat16")
    check_copy_model(torch.nn.Linear(2, 2), "bfloat16")  # an unsharded model: no error
    check_copy_model(torch.nn.Linear(2, 2, device="meta"), "bfloat16")  # off the CPU: only int8 needs the CPU


@pytest.mark.slow
def test_a_run_with_the_int8_sampler_logs_how_far_it_is_from_the_policy(tmp_path, child_env):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "entropyrl.cli.main",
            "train",
            "data=toy",
            "trainer.total_steps=2",
            "trainer.val_every=0",
            "rollout.weights=int8",
            "tracking.enabled=false",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["rollout/logp_diff_mean"] for r in rows if "rollout/logp_diff_mean" in r]
    assert len(gaps) == 2 and all(0 < g < 0.2 for g in gaps), gaps


@EVERY_COPY
def test_a_sampler_copy_samples_the_lora_policy_with_its_adapters_merged(tiny, weights):
    """LoRA's adapters (injected in place) are merged into the copy: its log-probs follow the adapted
    policy, not the base model's (the null: the base model's log-probs of the same tokens)."""
    from entropyrl.models.lora import apply_lora

    cfg, model, tok = tiny
    base = {k: v.clone() for k, v in model.state_dict().items()}
    apply_lora(model, OmegaConf.merge(cfg.model, {"lora": {"rank": 4}}))
    with torch.no_grad():  # a trained adapter: lora_B starts at zero, which would merge nothing
        gen = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    roll = _engine(tiny, weights).generate(PROMPTS, n=4, seed=3, temperature=1.0, max_new_tokens=6)
    valid = roll.response_mask.bool()
    adapted = (roll.sampling_logp - _policy_logp(model, roll, 1.0)).abs()[valid].mean()
    plain, _ = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in base.items())
    unadapted = (roll.sampling_logp - _policy_logp(plain, roll, 1.0)).abs()[valid].mean()
    assert adapted < 0.1 and adapted < 0.5 * unadapted, (adapted, unadapted)


def test_an_evaluation_samples_from_the_copy_eval_hf_weights_asks_for():
    """``eval.hf.weights`` reaches the eval's hf engine (a fixed model: the copy is made once for the
    whole eval); an unknown value is one line, not the float32 model in silence."""
    from entropyrl.evals.runner import make_engine

    engine, _, _ = make_engine(compose("eval", ["tracking.enabled=false", "eval.hf.weights=float32_packed"]), log=lambda *_: None)
    assert engine.settings.weights == "float32_packed" and engine.copies
    roll = engine.generate(PROMPTS, n=1, seed=0, max_new_tokens=4)
    assert roll.sampling_logp is not None  # sampled by the copy
    plain, _, _ = make_engine(compose("eval", ["tracking.enabled=false"]), log=lambda *_: None)
    assert not plain.copies  # the default: the model as loaded
    with pytest.raises(UserError, match=r"weights=packed is not allowed \(rollout.weights, eval.hf.weights\)"):
        make_engine(compose("eval", ["tracking.enabled=false", "eval.hf.weights=packed"]), log=lambda *_: None)
