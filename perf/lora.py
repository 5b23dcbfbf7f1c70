"""LoRA vs full fine-tuning: peak memory and time of one training step on a model of
Qwen2.5-0.5B's shape (24 layers, hidden 896, MLP 4864, 14 query / 2 KV heads, vocabulary
151,936, tied embeddings; 494M parameters), random init (no download), float32, CPU.

One step: forward of a ``[BATCH, SEQ]`` batch, the mean token log-likelihood as the loss,
backward, an AdamW step over the trainable parameters. ``lora``: ``model.lora.rank=RANK`` on every
linear layer (``models/lora.py``, PEFT), the base frozen; ``full``: every parameter trains.

Each variant runs in its own subprocess (started with ``MALLOC_MMAP_THRESHOLD_=65536`` so freed
tensor buffers go back to the OS and RSS tracks live memory). After the model is built its RSS is
the baseline; the kernel's peak mark is reset (``/proc/self/clear_refs``) and the step's peak
extra memory is ``VmHWM - baseline`` (gradients, optimizer state, activations). Ratios are
lora / full, measured in the same run.

    .venv/bin/python perf/lora.py          # prints the result
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPE = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
)
BATCH, SEQ, RANK = 2, 128, 16


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _variant(kind: str) -> dict:
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, Qwen2Config

    from entropyrl.conf import compose
    from entropyrl.core.resources import apply_threads
    from entropyrl.models.lora import apply_lora

    threads = apply_threads(0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**SHAPE))
    if kind == "lora":
        lora = {**OmegaConf.to_container(compose("train", []).model.lora), "rank": RANK, "alpha": 2 * RANK}
        apply_lora(model, OmegaConf.create({"lora": lora}))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    ids = torch.randint(0, SHAPE["vocab_size"], (BATCH, SEQ))
    baseline = _status_kb("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")
        method = "VmHWM after clear_refs"
    except OSError:
        method = "VmHWM (not reset)"
    started = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    seconds = time.perf_counter() - started
    peak = _status_kb("VmHWM")
    return {
        "step_seconds": round(seconds, 3),
        "peak_extra_mb": round((peak - baseline) / 1024, 1),
        "peak_rss_mb": round(peak / 1024, 1),
        "model_rss_mb": round(baseline / 1024, 1),
        "trainable_params": sum(p.numel() for p in params),
        "params": sum(p.numel() for p in model.parameters()),
        "threads": threads,
        "memory": method,
        "loss_finite": bool(torch.isfinite(loss).item()),
    }


def _run_child(kind: str) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, __file__, kind], capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{kind}: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> dict:
    full, lora = _run_child("full"), _run_child("lora")
    return {
        "setting": f"Qwen2.5-0.5B shape, random init, float32, CPU, batch {BATCH} x {SEQ} tokens, "
        f"LoRA rank {RANK} on all linear layers, AdamW",
        "full": full,
        "lora": lora,
        "peak_extra_mem_ratio": round(lora["peak_extra_mb"] / full["peak_extra_mb"], 3),
        "peak_rss_ratio": round(lora["peak_rss_mb"] / full["peak_rss_mb"], 3),
        "step_time_ratio": round(lora["step_seconds"] / full["step_seconds"], 3),
        "trainable_frac": round(lora["trainable_params"] / lora["params"], 5),
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("full", "lora"):
        print(json.dumps(_variant(sys.argv[1])))
    else:
        print(json.dumps(run(), indent=2))
