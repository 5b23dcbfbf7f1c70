"""`entropyrl plan` (models/cost.py): parameter counts of the real architectures, the memory split
over ranks, config.json read offline, and the memory figure against a measured CPU peak.

This file is also the measuring worker (`python tests/models/test_plan.py measure`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
CLI = [sys.executable, "-m", "entropyrl.cli.main"]
# the small shape measured on CPU: a random-init Qwen2, one micro-batch of ROWS x (P + R) tokens, float32
ARCH = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
    tie_word_embeddings=False,
)
ROWS, P, R = 8, 32, 224


def _plan(*args: str) -> dict:
    """``entropyrl plan <overrides> [--ranks N] --json``, in this process."""
    from entropyrl.models.cost import plan_figures

    overrides = [a for a in args if "=" in a]
    ranks = int(args[args.index("--ranks") + 1]) if "--ranks" in args else 1
    return json.loads(json.dumps(plan_figures(overrides, ranks=ranks, mfu=0.4, peak_tflops=989.0, prompt_len=None)))


def test_parameters_of_the_published_architectures_and_the_memory_split():
    # the published sizes: Qwen2.5-Math-1.5B 1.54B, Qwen2.5-Math-7B 7.62B, Qwen2.5-32B 32.8B
    for model, published in (("qwen2.5-math-1.5b", 1.54e9), ("qwen2.5-math-7b", 7.62e9), ("qwen2.5-32b", 32.8e9)):
        # the statistics forward recomputed on both (one process would otherwise reuse its first pass's)
        one = _plan("experiment=dapo_7b", f"model={model}", "trainer.reuse_stats_forward=false", "--ranks", "1")
        eight = _plan("experiment=dapo_7b", f"model={model}", "trainer.reuse_stats_forward=false", "--ranks", "8")
        assert abs(one["parameters"] - published) / published < 0.01, (model, one["parameters"])
        assert eight["fsdp"] and eight["gradient_checkpointing"]
        m1, m8 = one["memory_gb"], eight["memory_gb"]
        assert m8["optimizer"] == pytest.approx(m1["optimizer"] / 8, rel=1e-3)  # sharded over the ranks
        assert m8["optimizer"] == pytest.approx(8 * one["parameters"] / 8 / 1e9, rel=1e-3)  # AdamW: 8 bytes a parameter
        assert m8["activations_checkpointed"] < m8["activations"]
        assert eight["step_seconds"] == pytest.approx(one["step_seconds"] / 8, rel=1e-6)
        assert eight["tokens"] == 512 * 16 * (2048 + 8192)  # the DAPO step
    table = subprocess.run([*CLI, "plan", "experiment=dapo_7b", "--ranks", "8"], capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "memory per rank (8 ranks, FSDP on)" in table.stdout and "step time at MFU 40%" in table.stdout
    bad = subprocess.run([*CLI, "plan", "--mfu", "2"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: entropyrl plan: need --ranks >= 1")


def test_a_model_folders_config_json_is_read_offline(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**ARCH, "model_type": "qwen2"}))
    figures = _plan(f"model.path={tmp_path}", "model.embedded=false", "model=qwen2.5-7b")
    assert figures["architecture"] == str(tmp_path / "config.json")
    h, i, L, V = 256, 704, 4, 1024
    kvd = 2 * 64
    expected = 2 * V * h + L * ((h * h + h) + 2 * (h * kvd + kvd) + h * h + 3 * h * i + 2 * h) + h
    assert figures["parameters"] == expected


def test_a_model_path_the_plan_cannot_read_is_named_not_replaced_by_the_presets_model(tmp_path):
    """model.path to a missing folder, or to a hub id not in the cache beside the embedded preset,
    planned the embedded 0.0003B model without a word."""
    from entropyrl.conf import compose
    from entropyrl.core.errors import UserError
    from entropyrl.models.cost import architecture

    with pytest.raises(UserError, match=r"model.path=/models/Qwen2.5-Math-7B: no such folder"):
        architecture(compose("train", ["model.path=/models/Qwen2.5-Math-7B"]).model)
    with pytest.raises(UserError, match=r"model.path=nobody/not-cached: not in the Hugging Face cache, so its architecture"):
        architecture(compose("train", ["model.path=nobody/not-cached"]).model)
    # a preset that declares its arch still plans offline, and says the path was not read
    arch = architecture(compose("train", ["model=qwen2.5-7b", "model.path=nobody/not-cached"]).model)
    assert (
        arch.source == "the preset's model.arch (model=qwen2.5-7b; model.path=nobody/not-cached: not in the Hugging Face cache)"
    )
    # the null: a folder with its config.json is read
    (tmp_path / "config.json").write_text(json.dumps({**ARCH, "model_type": "qwen2"}))
    assert architecture(compose("train", [f"model.path={tmp_path}"]).model).source == str(tmp_path / "config.json")


def _measure() -> None:
    """Peak extra RSS of one training micro-batch + AdamW step (every buffer its own mmap, so RSS
    follows live tensors: MALLOC_MMAP_THRESHOLD_ is set by the test)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from entropyrl.rollout.base import Rollout
    from entropyrl.trainers.algos.algorithm import Algorithm
    from entropyrl.trainers.stats.policy_stats import response_token_stats

    def kb(field: str) -> int:
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

    torch.set_num_threads(1)
    prompt, resp = torch.randint(1, 1024, (ROWS, P)), torch.randint(1, 1024, (ROWS, R))
    roll = Rollout(
        prompt, torch.ones_like(prompt), resp, torch.ones_like(resp), [""] * ROWS, torch.zeros(ROWS, dtype=torch.bool), None
    )
    old, mask = -torch.rand(ROWS, R), torch.ones(ROWS, R)
    adv = torch.randn(ROWS, 1).expand(ROWS, R).contiguous()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = kb("VmRSS")
    model = Qwen2ForCausalLM(Qwen2Config(max_position_embeddings=1024, **ARCH)).float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    logp, ent = response_token_stats(model, roll, temperature=1.0, chunk_size=1024)
    Algorithm(max_response_length=R).loss(logp=logp, old_logp=old, entropy=ent, advantages=adv, mask=mask).loss.backward()
    optimizer.step()
    print(json.dumps({"peak_bytes": (kb("VmHWM") - base) * 1024}))


def test_memory_figure_matches_the_measured_cpu_peak_of_a_small_shape():
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs /proc/self/clear_refs to reset the peak-RSS mark")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(HERE), "measure"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"] / 1e9

    from entropyrl.models.cost import Architecture, step_cost

    arch = Architecture(**{k: v for k, v in ARCH.items() if k != "tie_word_embeddings"}, tie_word_embeddings=False)
    cost = step_cost(
        arch,
        prompts=ROWS,
        n=1,
        prompt_len=P,
        response_len=R,
        ranks=1,
        micro_rows=ROWS,
        micro_tokens=None,
        epochs=1,
        checkpointing=False,
        compute_bytes=4,
        chunk=1024,
        fsdp=False,
        ref_model=False,
    )
    predicted = cost.memory_gb["total"]
    assert abs(predicted - measured) / measured <= 0.25, (predicted, measured)


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        _measure()


def test_verdict_per_rank_counts_the_vllm_engines_share():
    from entropyrl.models.cost import Architecture, parameters, vllm_share

    a = Architecture(**ARCH)
    e = vllm_share(a, share=0.5, gpu_gb=10.0, weight_bytes=2, tensor_parallel=1, seq_len=256)
    assert e["gb"] == 5.0 and e["weights_gb"] == pytest.approx(2 * parameters(a)["total"] / 1e9, abs=1e-3)
    kv_per_token = 2 * 4 * 2 * 64 * 2  # k and v, layers, kv heads, head width, bf16
    assert e["kv_cache_tokens"] == int((5.0 - 2 * parameters(a)["total"] / 1e9) * 1e9 / kv_per_token)
    assert e["fits"] and not vllm_share(a, share=1e-4, gpu_gb=10.0, weight_bytes=2, tensor_parallel=1, seq_len=256)["fits"]

    from entropyrl.models.cost import plan_figures

    def plan(*overrides, ranks=8, gpu_gb=80.0):
        return plan_figures(
            ["experiment=stare_7b_short_cot", *overrides],
            ranks=ranks,
            mfu=0.4,
            peak_tflops=989.0,
            prompt_len=None,
            gpu_gb=gpu_gb,
            decode_mfu=0.05,
        )

    eight = plan()
    assert eight["vllm"]["share"] == 0.6 and eight["vllm"]["gb"] == pytest.approx(48.0)  # the preset's share
    v = eight["verdict"]
    assert v["trainer_budget_gb"] == pytest.approx(32.0) and v["trainer_gb"] == pytest.approx(
        eight["memory_gb"]["total"], abs=1e-3
    )
    assert v["fits"] is (eight["memory_gb"]["total"] <= 32.0) is True
    assert not plan(ranks=1)["verdict"]["fits"]  # 12 bytes a parameter on one GPU
    assert not plan("rollout.gpu_memory_utilization=0.9")["verdict"]["trainer_fits"]  # the engine leaves 8 GB
    assert plan(gpu_gb=141.0)["verdict"]["trainer_budget_gb"] == pytest.approx(141.0 * 0.4)
    # decoding at its own MFU; the checkpoint at 12 bytes a parameter, as often and as many as the preset says
    assert eight["generation_seconds"] == pytest.approx(eight["generation_flops"] / (0.05 * 989e12 * 8))
    assert eight["checkpoint"]["gb"] == pytest.approx(12 * eight["parameters"] / 1e9, rel=1e-3)
    assert any("decoding is memory-bound" in a for a in eight["assumptions"])
    assert plan("rollout=hf")["vllm"] is None


def test_plan_prints_the_verdict_the_engine_and_the_assumptions():
    out = subprocess.run(
        [*CLI, "plan", "experiment=stare_7b_short_cot", "--ranks", "1"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    verdict = next(line for line in out.stdout.splitlines() if line.startswith("verdict per rank (1 x 80 GB GPU)"))
    assert "DOES NOT FIT: trainer" in verdict and "of the 32.0 GB left beside the vLLM engine" in verdict
    assert "vLLM engine, beside the trainer" in out.stdout and "60% of 80 GB = 48.0 GB" in out.stdout
    assert "to fit: more ranks" in out.stdout and "assumptions:" in out.stdout and "--decode-mfu" in out.stdout


@pytest.mark.parametrize("preset", ["stare_7b_short_cot", "dapo_7b", "steer_7b", "kl_cov_7b", "stare_7b_tool_use"])
def test_plan_gives_the_async_step_time_of_the_7b_presets(preset):
    """With generation overlapping training the step takes the longer of the two; the ideal speed-up
    over taking turns is their sum over that (docs/async.md)."""
    f = _plan(f"experiment={preset}", "trainer.staleness=2", "--ranks", "16")
    a, train, gen = f["async"], f["train_seconds"], f["generation_seconds"]
    assert a["staleness"] == 2 and a["step_seconds"] == pytest.approx(max(train, gen), rel=1e-3)
    assert a["ideal_speedup"] == pytest.approx((train + gen) / max(train, gen), rel=1e-3)
    assert 1 < a["ideal_speedup"] <= 2
    assert any("trainer.staleness >= 1" in line for line in f["assumptions"])


def test_plan_prints_the_async_step_time():
    out = subprocess.run([*CLI, "plan", "experiment=dapo_7b", "--ranks", "8"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("step time with trainer.staleness >= 1"))
    assert "ideal speed-up" in line and "fully async 2.66x" in line


def test_plan_with_a_worker_on_its_own_gpu_gives_the_trainer_the_whole_gpu():
    """trainer.rollout_gpus moves the vLLM engine to the rollout worker's GPUs: the trainer's budget is
    the whole GPU, the engine keeps its share of its own, and the job needs ranks + rollout_gpus GPUs."""
    shared = _plan("experiment=dapo_7b", "trainer.staleness=1", "--ranks", "1")
    own = _plan("experiment=dapo_7b", "trainer.staleness=1", "trainer.rollout_gpus=1", "--ranks", "1")
    assert shared["vllm"]["placement"] == "beside the trainer" and shared["async"]["rollout_gpus"] == 0
    assert own["vllm"]["placement"] == "the rollout worker's own 1 GPU(s)" and own["async"]["rollout_gpus"] == 1
    assert own["verdict"]["trainer_budget_gb"] == own["verdict"]["gpu_gb"]
    assert shared["verdict"]["trainer_budget_gb"] == pytest.approx(shared["verdict"]["gpu_gb"] - shared["vllm"]["gb"], abs=1e-3)
    assert own["vllm"]["gb"] == shared["vllm"]["gb"] and own["memory_gb"] == shared["memory_gb"]
    assert any("1 GPU(s) of its own (trainer.rollout_gpus), 2 GPUs in all" in line for line in own["assumptions"])
    # without a worker (staleness 0) rollout_gpus places nothing: the plan is the synchronous one
    assert _plan("experiment=dapo_7b", "--ranks", "1")["vllm"]["placement"] == "beside the trainer"


def test_the_plan_counts_the_statistics_rows_the_first_update_reuses():
    """``reused_stats_share``: the first update pass's rows over the step's, where the trainer shares the
    forward (one process, the switch on, no LoRA dropout), 0 elsewhere; the step's FLOPs drop by that
    share of one forward."""
    from entropyrl.conf import compose
    from entropyrl.models.cost import reused_stats_share

    def share(*overrides: str, ranks: int = 1) -> float:
        return reused_stats_share(compose("train", ["data=toy", *overrides]), ranks)

    assert share() == pytest.approx(128 / 256)  # 32 prompts x 8; a mini-batch of 16 x 8, one pass each
    assert share("trainer.micro_batch_responses=16") == pytest.approx(16 / 256)
    assert share("trainer.mini_batch_prompts=32") == 1.0  # one pass a step: the whole statistics forward
    assert share(ranks=2) == 0.0
    assert share("trainer.reuse_stats_forward=false") == 0.0
    assert share("model.lora.rank=4", "model.lora.dropout=0.1") == 0.0
    assert share("model.lora.rank=4") == pytest.approx(128 / 256)
    on, off = _plan("data=toy"), _plan("data=toy", "trainer.reuse_stats_forward=false")
    assert on["train_flops"] < off["train_flops"]


def test_shared_prompts_run_a_passs_distinct_prompts_once_in_the_plan():
    """``trainer.share_prompt_forward``: a pass runs each distinct prompt once, so the executed training
    FLOPs (``plan --cpu``) count a pass's prompt positions at its distinct prompts over its rows; the
    model FLOPs of the MFU figure are the usual count either way."""
    from entropyrl.conf import compose
    from entropyrl.models.cost import shared_prompt_share

    def share(*overrides: str, ranks: int = 1, fsdp: bool = False) -> float:
        cfg = compose("train", ["trainer.share_prompt_forward=true", *overrides])
        return shared_prompt_share(cfg, ranks, fsdp)

    assert share("experiment=smollm2_word_problems") == pytest.approx(4 / 16)  # one pass of 4 groups x 4
    # data=toy: a pass of 128 rows drawn from 32 groups of 8 holds nearly every group, 4 rows each
    assert share("data=toy") == pytest.approx(32 * (1 - math.comb(248, 128) / math.comb(256, 128)) / 128)
    assert share("data=toy", "trainer.micro_batch_responses=1") == 1.0  # a row a pass shares nothing
    assert share("data=toy", "trainer.share_prompt_forward=false") == 1.0
    assert share("data=toy", "trainer.gradient_checkpointing=true") == 1.0
    assert share("data=toy", ranks=2, fsdp=True) == 1.0
    from entropyrl.models.cost import plan_figures

    def cpu_plan(*overrides: str) -> dict:
        return plan_figures(
            ["experiment=smollm2_word_problems", *overrides], ranks=1, mfu=0.4, peak_tflops=989.0, prompt_len=70, cpu={}
        )

    on, off = cpu_plan("trainer.share_prompt_forward=true"), cpu_plan("trainer.share_prompt_forward=false")
    assert on["cpu"]["train_flops"] < 0.75 * off["cpu"]["train_flops"]  # the prompt is half of each row
    assert on["cpu"]["prefill_seconds"] == off["cpu"]["prefill_seconds"]  # generation is not the forward it shares
    assert (
        _plan("experiment=smollm2_word_problems", "trainer.share_prompt_forward=true")["train_flops"]
        == (_plan("experiment=smollm2_word_problems", "trainer.share_prompt_forward=false")["train_flops"])
    )


def test_the_plans_activations_are_those_of_a_pass_the_step_can_hold():
    """A pass holds at most one rank's share of a mini-batch: a micro-batch setting larger than the
    step (the default 256 responses against a 16-response step) plans the step's rows, not 256."""
    step = ["experiment=smollm2_word_problems"]  # 4 prompts x 4 responses, one mini-batch
    default = _plan(*step)["memory_gb"]["activations"]
    assert _plan(*step, "trainer.micro_batch_responses=16")["memory_gb"]["activations"] == default
    eight = _plan(*step, "trainer.micro_batch_responses=8")["memory_gb"]["activations"]
    assert eight < default
    assert _plan(*step, "trainer.mini_batch_prompts=2")["memory_gb"]["activations"] == eight  # 2 x 4 responses a pass
    budget = _plan(*step, "trainer.micro_batch_tokens=1000000")["memory_gb"]["activations"]
    assert budget == pytest.approx(default, rel=0.05)  # a token budget past the mini-batch: the mini-batch


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["rollout.weights=int8"], "rollout.weights=int8"),
        (["rollout.weights=bfloat16"], "rollout.weights=bfloat16"),
        (["trainer.dtype=bfloat16", "trainer.fsdp=false"], "trainer.dtype=bfloat16"),
    ],
)
def test_the_cpu_plan_says_it_times_float32_products_under_a_lower_precision(overrides, says):
    from entropyrl.models.cost import plan_figures

    def assumptions(*overrides: str) -> list[str]:
        figures = plan_figures(["data=toy", *overrides], ranks=1, mfu=0.4, peak_tflops=989.0, prompt_len=10, cpu={})
        return [a for a in figures["assumptions"] if a.startswith(("rollout.weights=", "trainer.dtype="))]

    assert [a.split(":")[0].split(" ")[0] for a in assumptions(*overrides)] == [says]
    assert assumptions() == []  # null: the float32 sampler and training the CPU model times


def test_the_real_model_preset_runs_a_groups_prompt_once_and_the_plan_counts_it():
    """``experiment=smollm2_word_problems`` runs with ``trainer.share_prompt_forward`` (the default): its planned
    CPU training FLOPs are those of the shared forward, below the same preset with each row running its prompt."""
    from entropyrl.conf import compose
    from entropyrl.models.cost import plan_figures

    assert compose("train", ["experiment=smollm2_word_problems"]).trainer.share_prompt_forward is True
    assert compose("train", []).trainer.share_prompt_forward is True  # the default, which the preset keeps

    def cpu_flops(*overrides: str) -> float:
        figures = plan_figures(
            ["experiment=smollm2_word_problems", *overrides], ranks=1, mfu=0.4, peak_tflops=989.0, prompt_len=70, cpu={}
        )
        return figures["cpu"]["train_flops"]

    assert cpu_flops() == cpu_flops("trainer.share_prompt_forward=true")
    assert cpu_flops() < cpu_flops("trainer.share_prompt_forward=false")


def test_the_plan_counts_autocasts_copy_of_the_body_weights():
    """``trainer.dtype=bfloat16 trainer.fsdp=false``: autocast holds a bfloat16 copy of every body weight
    through a pass (2 bytes a parameter) and keeps activations in bfloat16; FSDP's mixed precision on one
    process (``trainer.fsdp`` auto) holds no such copy (the null)."""
    from entropyrl.conf import compose
    from entropyrl.models.cost import architecture, parameters, plan_figures

    def memory(*overrides: str) -> dict:
        return plan_figures(["data=toy", *overrides], ranks=1, mfu=0.4, peak_tflops=989.0, prompt_len=10)["memory_gb"]

    arch = architecture(compose("train", ["data=toy"]).model)
    body = parameters(arch)["non_embedding"] - (0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden_size)
    plain, autocast = memory(), memory("trainer.dtype=bfloat16", "trainer.fsdp=false")
    fsdp_one = memory("trainer.dtype=bfloat16")
    assert autocast["weights"] - plain["weights"] == pytest.approx(2 * body / 1e9, rel=0.02)
    assert autocast["activations"] == pytest.approx(plain["activations"] / 2, rel=0.2)
    assert fsdp_one["weights"] == pytest.approx(plain["weights"], rel=1e-6)


def test_the_plans_disk_counts_every_checkpoint_kept():
    """keep_checkpoints=0 deletes none, but the plan budgeted the disk of one."""
    one = _plan("experiment=steer_7b", "trainer.total_steps=120", "trainer.save_every=50")["checkpoint"]
    assert one["keep"] == 2 and one["disk_gb"] == pytest.approx(2 * one["gb"], abs=0.01)  # the null: the newest two
    every = _plan("experiment=steer_7b", "trainer.total_steps=120", "trainer.save_every=50", "trainer.keep_checkpoints=0")
    assert every["checkpoint"]["disk_gb"] == pytest.approx(3 * one["gb"], abs=0.01)  # steps 50, 100 and the last, 120
    assert _plan("experiment=steer_7b", "trainer.total_steps=100", "trainer.save_every=50", "trainer.keep_checkpoints=0")[
        "checkpoint"
    ]["disk_gb"] == pytest.approx(2 * one["gb"], abs=0.01)  # the last is step 100 itself
