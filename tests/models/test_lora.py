"""LoRA (model.lora, through PEFT) on the embedded model: only the adapter trains, the KL
reference is the policy with its adapter disabled (one model in memory), a run resumes from its
adapter checkpoint, and the merged export evaluates with `entropyrl eval`."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest
import torch

from ..rewards.test_rewards import TINY_RUN

LORA_RUN = [*TINY_RUN, "model.lora.rank=4", "algo.kl_coef=0.1", "trainer.save_every=1", "optim.lr=1e-2"]


def _trainer(overrides):
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import GRPOTrainer

    return GRPOTrainer(compose("train", overrides), log=lambda *_: None)


def lora_section(**keys):
    """A ``model`` section whose ``lora`` is the default config's with ``keys`` set."""
    from omegaconf import OmegaConf

    from entropyrl.conf import compose

    return OmegaConf.create({"lora": {**OmegaConf.to_container(compose("train", []).model.lora), **keys}})


def _causal_lms() -> int:
    """Whole language models alive in this process (not their inner decoder stacks)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.nn.Module) and "lm_head" in o._modules)


@pytest.mark.slow
def test_lora_trains_only_the_adapter_against_the_disabled_adapter_and_resumes(in_tmp):
    from entropyrl.models.loading import load_policy
    from entropyrl.trainers.stats.policy_stats import batch_token_stats

    alive = _causal_lms()  # what earlier tests of this process still hold
    trainer = _trainer([*LORA_RUN, "output_dir=run", "model.lora.save_merged=true"])
    try:
        assert trainer.ref_model is None and _causal_lms() - alive == 1  # no second copy for the KL term
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n for n in trainable)
        summary = trainer.fit()
        assert summary["status"] == "FINISHED" and summary["steps"] == 2
        after = dict(trainer.model.named_parameters())
        changed = {n for n in before if not torch.equal(before[n], after[n].detach())}
        assert changed and changed <= trainable  # only adapter weights moved
        assert any("lora_B" in n for n in changed)
        # the KL reference is the base model: the adapter disabled gives the untouched weights' log-probs
        roll = trainer.collect()[0].responses
        kw = dict(trainer.settings.stats)
        ref = trainer._reference_logp(roll, 64, kw)
        base, _ = load_policy(trainer.cfg.model, trainer.cfg.data, log=lambda *_: None)
        with torch.no_grad():
            expected, _ = batch_token_stats(base, roll, 64, **kw)
            policy, _ = batch_token_stats(trainer.model, roll, 64, **kw)
        mask = roll.response_mask.bool()
        assert torch.allclose(ref[mask], expected[mask], atol=1e-5)
        assert not torch.allclose(policy[mask], expected[mask], atol=1e-3)
        adapter = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
        del base
    finally:
        trainer.close()
    step2 = in_tmp / "run" / "checkpoints" / "step_000002"
    assert (step2 / "model" / "adapter_config.json").exists()
    assert not (step2 / "model" / "model.safetensors").exists()  # the adapter only
    assert (step2 / "merged" / "model.safetensors").exists()
    # plan's checkpoint size is this one's: the adapter with its moments and the merged model (it
    # counted the whole model's weights and moments, three times the merged model)
    from entropyrl.models.cost import plan_figures

    planned = plan_figures([*LORA_RUN, "model.lora.save_merged=true"], ranks=1, mfu=0.4, peak_tflops=1.0, prompt_len=None)
    files = [step2 / "model" / "adapter_model.safetensors", step2 / "trainer_state.pt", step2 / "merged" / "model.safetensors"]
    written = sum(f.stat().st_size for f in files)
    assert 0.8 < written / (planned["checkpoint"]["gb"] * 1e9) < 1.25, (written, planned["checkpoint"])

    resumed = _trainer([*LORA_RUN, "output_dir=run", "model.lora.save_merged=true", "trainer.total_steps=3"])
    try:
        assert resumed.maybe_resume() == 2
        now = {n: p.detach() for n, p in resumed.model.named_parameters() if "lora_" in n}
        assert now.keys() == adapter.keys() and all(torch.equal(now[n], adapter[n]) for n in now)
        resumed.step = 2
        resumed.train_step()  # the restored optimizer steps on
    finally:
        resumed.close()

    # the merged export is a plain Hugging Face folder: it equals the adapted policy, and evaluates
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(step2 / "merged")
    with torch.no_grad():
        got, _ = batch_token_stats(merged, roll, 64, **kw)
    assert torch.allclose(got[mask], policy[mask], atol=1e-5)


@pytest.mark.slow
def test_merged_export_evaluates_with_entropyrl_eval(in_tmp, data_dir):
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import train

    train(
        compose("train", [*LORA_RUN, "output_dir=run", "model.lora.save_merged=true", "trainer.total_steps=1"]),
        log=lambda *_: None,
    )
    merged = in_tmp / "run" / "checkpoints" / "step_000001" / "merged"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "entropyrl.cli.main",
            "eval",
            "aime24",
            f"model.path={merged}",
            "model=tiny",
            "eval.n_samples=1",
            "eval.limit=2",
            "eval.max_new_tokens=4",
            "output_dir=ev",
            "tracking.enabled=false",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=in_tmp,
        env={**__import__("os").environ, "ENTROPYRL_DATA": str(data_dir)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((in_tmp / "ev" / "summary.json").read_text())
    assert summary["benchmarks"]["aime24"]["problems"] == 2


def test_merged_parameters_use_the_base_names_and_equal_peft_merge():
    import copy

    from transformers import AutoModelForCausalLM, Qwen2Config

    from entropyrl.models.lora import apply_lora, is_lora, merged_named_parameters

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        Qwen2Config(
            vocab_size=40,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=False,
        )
    )
    base_names = [n for n, _ in model.named_parameters()]
    policy = apply_lora(model, lora_section(rank=2, target_modules=["q_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    assert is_lora(model)
    merged = dict(merged_named_parameters(model))
    assert list(merged) == base_names
    reference = dict(copy.deepcopy(policy.peft).merge_and_unload().named_parameters())
    assert all(torch.allclose(merged[n], reference[n], atol=1e-6) for n in base_names)
    assert not torch.allclose(
        merged["model.layers.0.self_attn.q_proj.weight"], model.model.layers[0].self_attn.q_proj.base_layer.weight
    )


def test_bad_lora_settings_are_one_line_errors():
    from entropyrl.core.errors import UserError
    from entropyrl.models.lora import lora_settings

    with pytest.raises(UserError, match="model.lora.dropout=1 is not allowed"):
        lora_settings(lora_section(rank=2, dropout=1.0))
    assert lora_settings(lora_section(rank=None)) is None
    assert lora_settings(lora_section(rank=8))["lora_alpha"] == 16


def test_a_target_module_the_model_lacks_is_an_error_even_beside_one_it_has():
    """PEFT refuses a list of which no name matches; one typo beside a real name would train the real
    one alone. Null: the list without the typo applies."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from entropyrl.core.errors import UserError
    from entropyrl.models.lora import apply_lora

    config = Qwen2Config(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )
    with pytest.raises(UserError, match=r"names v_prj, which this model does not have: its linear layers are .*q_proj.*v_proj"):
        apply_lora(AutoModelForCausalLM.from_config(config), lora_section(rank=2, target_modules=["q_proj", "v_prj"]))
    policy = apply_lora(
        AutoModelForCausalLM.from_config(config), lora_section(rank=2, target_modules=["q_proj", "self_attn.v_proj"])
    )
    assert sum("lora_A" in n for n, _ in policy.peft.named_parameters()) == 2


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["stare", "steer", "clip_cov", "kl_cov", "entropy_bonus", "archer", "siren", "gspo"])
def test_interventions_work_unchanged_with_lora(algo, in_tmp):
    import math

    from entropyrl.conf import compose
    from entropyrl.trainers.interventions import INTERVENTIONS
    from entropyrl.trainers.trainer import train

    from ..e2e.test_algos_e2e import rows

    cfg = compose("train", [f"algo={algo}", *TINY_RUN, "trainer.total_steps=1", "model.lora.rank=4", "output_dir=run"])
    assert train(cfg, log=lambda *_: None)["status"] == "FINISHED"
    (row,) = rows(in_tmp / "run")
    for name in cfg.algo.interventions:
        for key in ["loss/policy", "entropy", *INTERVENTIONS[name].logged_metrics]:
            assert row.get(key) is not None and math.isfinite(row[key]), (algo, key, row)


def test_lora_keys_without_a_rank_are_refused_before_anything_runs():
    """``model.lora.alpha`` or ``target_modules`` set with ``rank`` null were read by nothing: the run
    fine-tuned every weight and ``plan`` planned that, without a word. Nulls: the keys at their
    defaults without a rank, and the same keys with one."""
    from entropyrl.conf import compose
    from entropyrl.core.errors import UserError
    from entropyrl.models.cost import plan_figures
    from entropyrl.trainers.preflight import check_training

    def plan(overrides):
        return plan_figures(overrides, ranks=1, mfu=0.4, peak_tflops=100.0, prompt_len=None)

    off = ["model.lora.alpha=32", "model.lora.target_modules=[q_proj,v_proj]"]
    for check in (lambda o: check_training(compose("train", o)), plan):
        with pytest.raises(
            UserError, match=r"model.lora.alpha=32, model.lora.target_modules=.* set but model.lora.rank is null"
        ) as err:
            check(off)
        assert "model.lora.rank=N" in str(err.value) and "\n" not in str(err.value)
    check_training(compose("train", ["model.lora.dropout=0.0", "model.lora.save_merged=false"]))
    assert plan([*off, "model.lora.rank=4"])
