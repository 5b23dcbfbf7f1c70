"""What a training run costs before it runs (``entropyrl plan``): parameters, FLOPs and tokens per
step, memory per rank, step time at a stated MFU. Nothing is loaded: the architecture comes from
the model folder's ``config.json`` (or the Hugging Face cache's copy), else from the preset's
``model.arch`` (the published config.json values, recorded in conf/model/<name>.yaml).

Counting conventions (a decoder of ``L`` layers, hidden ``h``, MLP width ``i``, ``kv`` key/value
heads of width ``d``, vocabulary ``V``; a step of ``S`` sequences of ``s`` tokens, upper bounds at
the maximum prompt and response lengths):

- FLOPs: ``2 N`` per token forward (``N`` without the embedding table), attention scores and
  mixing ``2 L h s`` per token forward (causal); backward twice the forward; gradient
  checkpointing adds one forward; the step also runs a no-grad forward for the sampling policy's
  statistics (and one for the reference model with a KL term) and generates ``S x response``
  tokens (``2 N`` each, plus the prompt's prefill).
- memory per rank under FSDP (``R`` ranks): float32 master weights ``4 N / R``, gradients ``4 N /
  R``, AdamW moments ``8 N / R``, plus one gathered layer in the compute dtype; activations of one
  micro-batch of ``b`` rows: per layer and token the tensors autograd keeps for a Qwen2 block
  (norm inputs/outputs, q, k, v, rotated q/k, the grouped k/v expanded to all heads, attention
  output, the four ``i``-wide MLP tensors): ``(9 h + 4 kv d + 4 i)`` elements, or only the layer input
  ``h`` with checkpointing (plus one layer recomputed); plus the token-statistics chunk
  (``chunk x V`` logits, forward and backward).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..conf import cfg_get, compose, to_plain
from ..core.errors import UserError
from .tiny import build_tokenizer

__all__ = ["Architecture", "architecture", "parameters", "step_cost", "plan_figures"]

ARCH_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "vocab_size")


@dataclass(frozen=True)
class Architecture:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool = False
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def _from_mapping(values: dict, source: str) -> Architecture:
    missing = [k for k in ARCH_KEYS if k not in values]
    if missing:
        raise UserError(f"{source} has no {', '.join(missing)}: give model.arch.{missing[0]}=... for `entropyrl plan`")
    return Architecture(**{k: int(values[k]) for k in ARCH_KEYS},
                        tie_word_embeddings=bool(values.get("tie_word_embeddings", False)), source=source)


def _cached_config(repo: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo, "config.json")
    except Exception:  # noqa: BLE001 - no cache, a bad id: fall back to the preset
        return None
    return Path(found) if isinstance(found, str) else None


def architecture(model_cfg: Any) -> Architecture:
    """The architecture of ``model`` (a composed ``model`` config), offline."""
    path = cfg_get(model_cfg, "path")
    if path:
        local = Path(str(path)) / "config.json"
        found = local if local.is_file() else _cached_config(str(path))
        if found is not None:
            return _from_mapping(json.loads(found.read_text()), str(found))
    arch = dict(to_plain(cfg_get(model_cfg, "arch", None)) or {})
    if cfg_get(model_cfg, "embedded", False) and "vocab_size" not in arch:
        arch["vocab_size"] = len(build_tokenizer())
    if not arch:
        raise UserError(f"model {cfg_get(model_cfg, 'name', '?')}: no config.json at model.path={path} and no "
                        f"model.arch in its preset; point model.path at the model's folder")
    return _from_mapping(arch, f"the preset's model.arch (model={cfg_get(model_cfg, 'name', '?')})")


def parameters(a: Architecture) -> dict[str, int]:
    """``{total, embedding, non_embedding}`` parameter counts (Qwen2: q/k/v biases, RMSNorm)."""
    h, kvd = a.hidden_size, a.num_key_value_heads * a.head_dim
    layer = (h * h + h) + 2 * (h * kvd + kvd) + h * h + 3 * h * a.intermediate_size + 2 * h
    embedding = a.vocab_size * h
    head = 0 if a.tie_word_embeddings else a.vocab_size * h
    body = a.num_hidden_layers * layer + h
    return {"total": embedding + head + body, "embedding": embedding, "non_embedding": body + head}


@dataclass
class StepCost:
    parameters: int
    sequences: int
    tokens: int
    generated_tokens: int
    train_flops: float
    generation_flops: float
    memory_gb: dict[str, float]
    step_seconds: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def step_cost(a: Architecture, *, prompts: int, n: int, prompt_len: int, response_len: int, ranks: int,
              micro_rows: int, micro_tokens: int | None, epochs: int, checkpointing: bool, compute_bytes: int,
              chunk: int, fsdp: bool, ref_model: bool, mfu: float | None = None,
              peak_flops: float | None = None) -> StepCost:
    """The cost of one training step; memory per rank in GB (1e9 bytes), time at ``mfu`` of
    ``ranks x peak_flops``."""
    p = parameters(a)
    n_body = p["non_embedding"]
    seqs, s = prompts * n, prompt_len + response_len
    tokens = seqs * s
    L, h = a.num_hidden_layers, a.hidden_size
    fwd = tokens * (2 * n_body + 2 * L * h * s)              # forward of every sequence once
    train = fwd * (3 + (1 if checkpointing else 0)) * epochs + fwd * (2 if ref_model else 1)
    generated = seqs * response_len
    gen = seqs * prompt_len * 2 * n_body + generated * (2 * n_body + 2 * L * h * s)
    shard = ranks if fsdp and ranks > 1 else 1
    gb = 1e9
    weights = 4 * p["total"] / shard + (compute_bytes * (p["total"] - p["embedding"]) / L if shard > 1 else 0)
    grads = 4 * p["total"] / shard
    optimizer = 8 * p["total"] / shard
    rows_tokens = micro_tokens if micro_tokens else micro_rows * s   # positions of one pass
    kvd = a.num_key_value_heads * a.head_dim
    per_token_layer = 9 * h + 4 * kvd + 4 * a.intermediate_size
    chunk_bytes = 3 * min(chunk, rows_tokens) * a.vocab_size * 4      # logits, softmax, their gradient (float32)
    full = rows_tokens * L * per_token_layer * compute_bytes + chunk_bytes
    ckpt = rows_tokens * (L * h + per_token_layer) * compute_bytes + chunk_bytes
    memory = {"weights": weights / gb, "gradients": grads / gb, "optimizer": optimizer / gb,
              "activations": full / gb, "activations_checkpointed": ckpt / gb}
    states = (weights + grads + optimizer) / gb
    memory["total"] = states + (ckpt if checkpointing else full) / gb
    seconds = None
    if mfu and peak_flops:
        seconds = (train + gen) / (mfu * peak_flops * ranks)
    return StepCost(p["total"], seqs, tokens, generated, float(train), float(gen),
                    {k: round(v, 4) for k, v in memory.items()}, seconds)


def plan_figures(overrides: list[str], *, ranks: int, mfu: float, peak_tflops: float,
                 prompt_len: int | None) -> dict:
    """The cost table of ``entropyrl train <overrides>`` on ``ranks`` ranks, as a dict."""
    if ranks < 1 or not 0 < mfu <= 1 or peak_tflops <= 0:
        raise UserError("entropyrl plan: need --ranks >= 1, 0 < --mfu <= 1 and --peak-tflops > 0")
    cfg = compose("train", overrides)
    t = cfg.trainer
    arch = architecture(cfg.model)
    prompt = int(prompt_len or cfg_get(cfg.data, "max_prompt_length", 0) or 256)
    fsdp = str(t.get("fsdp", "auto")).lower() not in ("false", "0", "no") and (ranks > 1 or t.dtype == "bfloat16")
    cost = step_cost(arch, prompts=int(t.prompts_per_step), n=int(cfg.rollout.n), prompt_len=prompt,
                     response_len=int(cfg.rollout.max_new_tokens), ranks=ranks,
                     micro_rows=int(t.micro_batch_responses), micro_tokens=t.get("micro_batch_tokens"),
                     epochs=int(t.ppo_epochs), checkpointing=bool(t.gradient_checkpointing),
                     compute_bytes=2 if t.dtype == "bfloat16" else 4, chunk=int(t.token_chunk_size), fsdp=fsdp,
                     ref_model=float(cfg.algo.get("kl_coef", 0) or 0) > 0, mfu=mfu, peak_flops=peak_tflops * 1e12)
    return {"model": str(cfg.model.name), "architecture": arch.source, "ranks": ranks, "mfu": mfu,
            "peak_tflops_per_rank": peak_tflops, "prompt_len": prompt, "response_len": int(cfg.rollout.max_new_tokens),
            "fsdp": fsdp, "gradient_checkpointing": bool(t.gradient_checkpointing), **cost.to_dict()}
