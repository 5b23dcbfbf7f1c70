"""`make gpu-check`: one training step of a ~0.5B model on a GPU, as entropyrl trains at scale.

A randomly initialised Qwen2 of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV
heads, vocabulary 151,936, tied embeddings: ~494M parameters) goes through the trainer's own path
for ``trainer.dtype=bfloat16``: FSDP2 on one process with bf16 compute and float32 master
weights (``trainers/distributed.prepare_model``), gradient checkpointing, log-probs and entropy
from the chunked token statistics (``policy_stats.response_token_stats``, no ``[B, T, V]`` logits),
the GRPO clipped surrogate (``Algorithm.loss``), backward, gradient clipping and an AdamW step.
It prints one JSON object: tokens/s (prompt + response tokens through forward + backward),
step time and peak GPU memory.

    .venv/bin/python perf/gpu_check.py                  # on a GPU machine (make gpu-check)
    .venv/bin/python perf/gpu_check.py --batch 8 --response-len 2048
    .venv/bin/python perf/gpu_check.py --cpu-smoke      # a tiny shape on CPU: tests the script

Without a CUDA device (and without ``--cpu-smoke``) it prints a skip message and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# Qwen2.5-0.5B's architecture (config.json of Qwen/Qwen2.5-0.5B), random weights: nothing is downloaded.
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
            rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="run a tiny shape on CPU (tests the script)")
    p.add_argument("--batch", type=int, default=None, help="responses per step (default 16; 4 with --cpu-smoke)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 256; 16 smoke)")
    p.add_argument("--response-len", type=int, default=None, help="response tokens (default 1024; 32 smoke)")
    p.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    p.add_argument("--no-checkpointing", action="store_true", help="disable gradient checkpointing")
    p.add_argument("--chunk", type=int, default=1024, help="tokens per chunk of the token statistics")
    return p.parse_args(argv)


def run(argv=None) -> dict:
    import torch

    args = parse(argv if argv is not None else [])
    if not torch.cuda.is_available() and not args.cpu_smoke:
        return {"skipped": True, "reason": "gpu-check needs a CUDA GPU (torch.cuda.is_available() is False); "
                                          "run it on a GPU machine, or pass --cpu-smoke for a tiny CPU run"}
    from omegaconf import OmegaConf
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from entropyrl.rollout.base import Rollout
    from entropyrl.trainers.algos.algorithm import Algorithm
    from entropyrl.trainers.parallel import distributed
    from entropyrl.trainers.stats.policy_stats import response_token_stats

    smoke = args.cpu_smoke
    batch = args.batch or (4 if smoke else 16)
    p_len = args.prompt_len or (16 if smoke else 256)
    r_len = args.response_len or (32 if smoke else 1024)
    shape = TINY if smoke else QWEN25_05B
    trainer_cfg = OmegaConf.create({"device": "cpu" if smoke else "auto", "dtype": "bfloat16", "fsdp": "auto",
                                    "gradient_checkpointing": not args.no_checkpointing})
    info = distributed.setup(trainer_cfg)
    device = info.device
    torch.manual_seed(0)
    config = Qwen2Config(**shape, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    model = Qwen2ForCausalLM(config).to(device)             # float32 master weights
    n_params = sum(p.numel() for p in model.parameters())
    model = distributed.prepare_model(model, trainer_cfg, info)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    algo = Algorithm.from_config({"name": "grpo", "clip": {"low": 0.2, "high": 0.28, "dual_c": 10.0}},
                                 max_response_length=r_len)

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(2, shape["vocab_size"], (batch, p_len), generator=g)
    response = torch.randint(2, shape["vocab_size"], (batch, r_len), generator=g)
    lengths = torch.randint(r_len // 2, r_len + 1, (batch,), generator=g)
    resp_mask = (torch.arange(r_len)[None, :] < lengths[:, None]).long()
    roll = Rollout(prompt, torch.ones_like(prompt), response * resp_mask, resp_mask, [""] * batch,
                   lengths >= r_len)
    mask = resp_mask.to(device).float()
    advantages = (torch.randn(batch, 1, generator=g).to(device) * mask)
    tokens = int(batch * p_len + resp_mask.sum())

    def step() -> float:
        logp, ent = response_token_stats(model, roll, temperature=1.0, chunk_size=args.chunk)
        out = algo.loss(logp=logp, old_logp=logp.detach(), entropy=ent.detach(), advantages=advantages, mask=mask)
        out.loss.backward()
        distributed.clip_grad_norm(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step()                                                   # warm-up (allocator, kernels)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, loss = [], float("nan")
    for _ in range(max(1, args.steps)):
        started = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - started)
    best = min(times)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke)",
        "model": "Qwen2.5-0.5B shape, random init" if not smoke else "tiny Qwen2 shape (smoke)",
        "params": n_params, "mode": "FSDP2 bf16 compute, fp32 master weights, AdamW",
        "gradient_checkpointing": not args.no_checkpointing, "batch": batch, "prompt_len": p_len,
        "response_len": r_len, "tokens_per_step": tokens, "step_seconds": round(best, 4),
        "tokens_per_s": round(tokens / best, 1),
        "peak_mem_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if device.type == "cuda" else None,
        "loss_finite": loss == loss and abs(loss) != float("inf"),
    }
    distributed.cleanup(info)
    return result


def main(argv=None) -> int:
    result = run(sys.argv[1:] if argv is None else argv)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
