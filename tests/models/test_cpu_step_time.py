"""`entropyrl plan --cpu` (``models/cost.cpu_step_time``): a CPU step's seconds by part, generation
bound by memory bandwidth or FLOPs (the roofline), training by FLOPs. The formula against a
hand-computed case and its limits; the measured comparison is `make bench` key real_model."""

from __future__ import annotations

import pytest

from entropyrl.core.errors import UserError
from entropyrl.models.cost import Architecture, cpu_step_time, parameters, plan_figures

# a small tied-embedding architecture: N (non-embedding) and the head are easy to count by hand
ARCH = Architecture(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    tie_word_embeddings=True,
)


def _time(**kw):
    args = dict(prompts=2, n=4, prompt_len=10, response_len=5, train_flops=6e9, gflops=2.0, mem_gbps=1.0)
    return cpu_step_time(ARCH, **{**args, **kw})


def test_the_parts_against_a_hand_computed_case():
    p = parameters(ARCH)
    n_body, head = p["non_embedding"], 1000 * 64
    t = _time()
    assert t["prefill_seconds"] == pytest.approx(2 * 10 * 2 * n_body / 2e9)  # each prompt once
    assert t["decode_step_memory_seconds"] == pytest.approx((n_body + head) * 4 / 1e9)  # every weight a row multiplies
    attention = 2 * 2 * 64 * 15
    assert t["decode_step_flop_seconds"] == pytest.approx(8 * (2 * (n_body + head) + attention) / 2e9)
    assert t["decode_step_seconds"] == max(t["decode_step_memory_seconds"], t["decode_step_flop_seconds"])
    assert t["decode_seconds"] == pytest.approx(5 * t["decode_step_seconds"])
    assert t["train_seconds"] == pytest.approx(3.0)
    assert t["step_seconds"] == pytest.approx(t["prefill_seconds"] + t["decode_seconds"] + t["train_seconds"])


def test_decode_is_bandwidth_bound_with_few_rows_and_flop_bound_with_many():
    few = _time(prompts=1, n=1, gflops=100.0)
    many = _time(prompts=64, n=16, gflops=100.0)
    assert few["decode_step_seconds"] == few["decode_step_memory_seconds"] > few["decode_step_flop_seconds"]
    assert many["decode_step_seconds"] == many["decode_step_flop_seconds"] > many["decode_step_memory_seconds"]
    # twice the bandwidth halves a bandwidth-bound step, and leaves a FLOP-bound one as it is
    assert _time(prompts=1, n=1, gflops=100.0, mem_gbps=2.0)["decode_step_seconds"] == pytest.approx(
        few["decode_step_seconds"] / 2
    )
    assert _time(prompts=64, n=16, gflops=100.0, mem_gbps=2.0)["decode_step_seconds"] == many["decode_step_seconds"]


def test_a_shared_prefill_costs_one_nth():
    shared, plain = _time(shared_prefill=True), _time(shared_prefill=False)
    assert plain["prefill_seconds"] == pytest.approx(4 * shared["prefill_seconds"])
    assert plain["decode_seconds"] == shared["decode_seconds"] and plain["train_seconds"] == shared["train_seconds"]


def test_bfloat16_weights_halve_the_memory_time():
    assert _time(weight_bytes=2)["decode_step_memory_seconds"] == pytest.approx(_time()["decode_step_memory_seconds"] / 2)


def test_the_decode_rate_sets_only_the_decode_flop_time():
    slow = _time(decode_gflops=1.0)
    assert slow["decode_step_flop_seconds"] == pytest.approx(2 * _time()["decode_step_flop_seconds"])
    assert slow["prefill_seconds"] == _time()["prefill_seconds"] and slow["train_seconds"] == _time()["train_seconds"]


@pytest.mark.parametrize("bad", [dict(gflops=0.0), dict(mem_gbps=-1.0), dict(decode_gflops=0.0)])
def test_a_rate_that_is_not_positive_is_a_user_error(bad):
    with pytest.raises(UserError, match="--cpu-gflops > 0, --cpu-decode-gflops > 0 and --mem-gbps > 0"):
        _time(**bad)


def test_plan_figures_for_the_real_model_follow_rollout_share_prefill():
    """Offline (the preset's model.arch): the study's shape, with and without the shared prefill."""
    base = ["experiment=smollm2_word_problems"]
    on = plan_figures(base, ranks=1, mfu=0.4, peak_tflops=989.0, prompt_len=70, cpu={"gflops": 30.0, "mem_gbps": 6.0})["cpu"]
    off = plan_figures(
        [*base, "rollout.share_prefill=false"],
        ranks=1,
        mfu=0.4,
        peak_tflops=989.0,
        prompt_len=70,
        cpu={"gflops": 30.0, "mem_gbps": 6.0},
    )["cpu"]
    assert on["gflops"] == 30.0 and on["mem_gbps"] == 6.0 and on["decode_gflops"] == 15.0  # left out: the default
    assert off["prefill_seconds"] == pytest.approx(4 * on["prefill_seconds"], rel=1e-3)  # rollout.n 4
    assert on["step_seconds"] < off["step_seconds"]
    assert plan_figures(base, ranks=1, mfu=0.4, peak_tflops=989.0, prompt_len=70)["cpu"] is None  # only when asked


def test_step_cost_counts_the_head_at_the_response_positions_only_when_asked():
    from entropyrl.models.cost import step_cost

    args = dict(
        prompts=2, n=4, prompt_len=10, response_len=5, ranks=1, micro_rows=8, micro_tokens=None, epochs=1,
        checkpointing=False, compute_bytes=4, chunk=1024, fsdp=False, ref_model=False,
    )  # fmt: skip
    plain = step_cost(ARCH, **args).train_flops
    head = 1000 * 64  # the tied head: vocabulary x hidden
    with_head = step_cost(ARCH, **args, head_flops=True).train_flops
    assert with_head == pytest.approx(plain + 4 * 8 * 5 * 2 * head)  # 8 rows x 5 response positions, 4 passes


@pytest.mark.parametrize("quadrants, lora, reuse", [("true", None, True), ("false", None, False), ("true", 4, True)])
def test_step_cost_as_executed_matches_the_flops_a_training_step_runs(tmp_path, quadrants, lora, reuse):
    """``step_cost(head_flops=True)`` against the matrix products a real step runs (torch's FLOP
    counter over ``train_step`` on a collected batch): within 10 %, with the quadrants' diagnostic
    on or off (its ``autograd.grad`` stops at the log-probs), and with a LoRA adapter (no gradient
    of the frozen weights), with the statistics forward reused by the first update or not, and with the
    prompts run once a group (the default ``trainer.share_prompt_forward``)."""
    from torch.utils.flop_counter import FlopCounterMode

    from entropyrl.conf import compose
    from entropyrl.models.cost import architecture, lora_parameters, reused_stats_share, shared_prompt_share, step_cost
    from entropyrl.trainers.trainer import GRPOTrainer

    cfg = compose(
        "train",
        [
            "trainer.threads=1", "trainer.val_every=0", "trainer.progress=false", "tracking.enabled=false",
            "trainer.prompts_per_step=4", "trainer.mini_batch_prompts=4", "rollout.n=4",
            f"diagnostics.quadrants={quadrants}", f"output_dir={tmp_path / 'run'}", f"model.lora.rank={lora or 'null'}",
            f"trainer.reuse_stats_forward={reuse}",
        ],
    )  # fmt: skip
    trainer = GRPOTrainer(cfg, log=lambda *_: None)
    try:
        batch, metrics = trainer.collect()
        roll = batch.responses
        with FlopCounterMode(display=False) as counter:
            trainer.train_step((batch, metrics))
    finally:
        trainer.close()
    shape = dict(prompt_len=roll.prompt_ids.shape[1], response_len=roll.response_ids.shape[1])
    planned = step_cost(
        architecture(cfg.model), prompts=4, n=4, **shape, ranks=1, micro_rows=16, micro_tokens=None, epochs=1,
        checkpointing=False, compute_bytes=4, chunk=1024, fsdp=False, ref_model=False, head_flops=True,
        lora_params=lora_parameters(architecture(cfg.model), lora, "all-linear") if lora else None,
        stats_reused=reused_stats_share(cfg, 1), prompt_share=shared_prompt_share(cfg, 1, False),
    ).train_flops  # fmt: skip
    assert reused_stats_share(cfg, 1) == (1.0 if reuse else 0.0)  # one pass: every row's statistics forward
    assert shared_prompt_share(cfg, 1, False) == pytest.approx(1 / 4)  # one pass of 4 groups x 4: a prompt a group
    ratio = planned / counter.get_total_flops()
    print(f"planned / counted {ratio:.3f}")
    assert ratio == pytest.approx(1.0, abs=0.1)


def test_plan_cpu_prints_the_cpu_step_time_and_refuses_a_bad_rate():
    import subprocess
    import sys

    from entropyrl.models.cost import CPU_DECODE_EFFICIENCY_DEFAULT, CPU_TRAIN_EFFICIENCY_DEFAULT

    cli = [sys.executable, "-m", "entropyrl.cli.main", "plan", "experiment=smollm2_word_problems", "--prompt-len", "70"]
    out = subprocess.run([*cli, "--cpu", "--cpu-gflops", "34", "--mem-gbps", "7.5"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("step time on a CPU"))
    assert (
        f"(34 GFLOP/s, decode 15 GFLOP/s, 7.5 GB/s; efficiency decode {CPU_DECODE_EFFICIENCY_DEFAULT:g}, "
        f"training {CPU_TRAIN_EFFICIENCY_DEFAULT:g})"
        in row
        and "64 steps x" in row
        and "training" in row
    )
    bad = subprocess.run([*cli, "--cpu-gflops", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "error: entropyrl plan --cpu: need --cpu-gflops > 0" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_efficiencies_stretch_their_own_part_over_its_floor():
    base, slow = _time(), _time(decode_efficiency=0.5, train_efficiency=0.25)
    assert slow["decode_step_seconds"] == pytest.approx(2 * base["decode_step_seconds"])
    assert slow["decode_step_floor_seconds"] == base["decode_step_floor_seconds"] == base["decode_step_seconds"]
    assert (
        slow["train_seconds"] == pytest.approx(4 * base["train_seconds"]) and slow["prefill_seconds"] == base["prefill_seconds"]
    )
    with pytest.raises(UserError, match="0 < --cpu-decode-efficiency <= 1"):
        _time(decode_efficiency=1.5)


def test_plan_figures_refuses_an_unknown_cpu_rate():
    with pytest.raises(UserError, match="unknown CPU rate gflop"):
        plan_figures(["experiment=smollm2_word_problems"], ranks=1, mfu=0.4, peak_tflops=1.0, prompt_len=70, cpu={"gflop": 1.0})


def test_the_plan_of_a_lora_run_holds_the_adapters_gradients_and_moments_only():
    from entropyrl.conf import compose
    from entropyrl.models.cost import architecture, lora_parameters, plan_figures

    base = ["experiment=smollm2_word_problems"]
    full = plan_figures(base, ranks=1, mfu=0.4, peak_tflops=989.0, prompt_len=70)
    lora = plan_figures([*base, "model.lora.rank=8"], ranks=1, mfu=0.4, peak_tflops=989.0, prompt_len=70)
    arch = architecture(compose("train", base).model)
    adapter = lora_parameters(arch, 8, "all-linear")  # every linear of the 30 blocks, rank x (in + out)
    h, kvd, inter = arch.hidden_size, arch.num_key_value_heads * arch.head_dim, arch.intermediate_size
    assert adapter == 30 * 8 * (2 * 2 * h + 2 * (h + kvd) + 3 * (h + inter))
    assert lora["memory_gb"]["gradients"] == pytest.approx(4 * adapter / 1e9, abs=1e-4)
    assert lora["memory_gb"]["optimizer"] == pytest.approx(8 * adapter / 1e9, abs=1e-4)
    assert lora["train_flops"] < 0.8 * full["train_flops"]  # no gradient of the frozen weights
    assert lora_parameters(arch, 8, ["q_proj", "v_proj"]) == 30 * 8 * (2 * h + h + kvd)
