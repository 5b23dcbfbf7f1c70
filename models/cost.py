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
  statistics, less the rows the first update pass takes over (``reused_stats_share``), (and one for
  the reference model with a KL term) and generates ``S x response``
  tokens (``2 N`` each, plus the prompt's prefill).
- memory per rank under FSDP (``R`` ranks): float32 master weights ``4 N / R``, gradients ``4 N /
  R``, AdamW moments ``8 N / R``, plus one gathered layer in the compute dtype; activations of one
  micro-batch of ``b`` rows: per layer and token the tensors autograd keeps for a Qwen2 block
  (norm inputs/outputs, q, k, v, rotated q/k, the grouped k/v expanded to all heads, attention
  output, the four ``i``-wide MLP tensors): ``(9 h + 4 kv d + 4 i)`` elements, or only the layer input
  ``h`` with checkpointing (plus one layer recomputed); plus the token-statistics chunk
  (``chunk x V`` logits, forward and backward).
- the verdict: a rank fits when its training memory fits in what the GPU (``--gpu-gb``) leaves
  beside the vLLM engine (``rollout=vllm``: a share ``rollout.gpu_memory_utilization`` of the GPU,
  null meaning the engine's own default beside a trainer); the engine holds the full weights in its
  dtype (one engine per rank, ``tensor_parallel_size`` splitting them) and its KV cache in the rest
  of its share. Not counted: the CUDA context, allocator fragmentation, Hugging Face ``generate``'s
  KV cache (``rollout=hf``), a reference model. Step time: training FLOPs at ``mfu``, generation at
  ``decode_mfu`` (decoding is memory-bound; it defaults to ``mfu`` and is usually far below it).
- a checkpoint: the float32 weights (``4 N``) and the AdamW moments (``8 N``), every
  ``trainer.save_every`` steps, ``trainer.keep_checkpoints`` of them kept; with LoRA those of the
  adapter's ``n`` parameters (``12 n``), plus the merged float32 model (``4 N``) with ``save_merged``.
"""

# size: one cost model: the counting conventions of the docstring hold for every function here
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..conf import cfg_get, compose, to_plain
from ..core.errors import UserError
from ..core.schema import bind
from ..core.schema.lora import check_lora_is_on_where_set
from ..core.schema.train import Trainer
from .loading import looks_local, resolve_model_path
from .tiny import build_tokenizer

__all__ = [
    "Architecture",
    "architecture",
    "parameters",
    "step_cost",
    "reused_stats_share",
    "cpu_step_time",
    "plan_figures",
    "vllm_share",
    "verdict",
]

# what the vLLM engine takes beside a trainer when rollout.gpu_memory_utilization is null (rollout/vllm_engine.py)
VLLM_DEFAULT_SHARE = 0.6

ARCH_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")


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
    return Architecture(
        **{k: int(values[k]) for k in ARCH_KEYS},
        tie_word_embeddings=bool(values.get("tie_word_embeddings", False)),
        source=source,
    )


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
    unread = ""  # why model.path gave no config.json, said beside the preset's arch used instead
    if path:
        folder = Path(resolve_model_path(str(path), log=lambda *_: None)).expanduser()
        local = folder / "config.json"
        found = local if local.is_file() else _cached_config(str(path))
        if found is not None:
            return _from_mapping(json.loads(found.read_text()), str(found))
        if not folder.exists() and looks_local(str(path)):
            raise UserError(
                f"model.path={path}: no such folder: point model.path at the model's folder (or leave it "
                f"out for the preset model={model_cfg.name})"
            )
        unread = f"model.path={path}: " + ("no config.json in it" if folder.exists() else "not in the Hugging Face cache")
        if model_cfg.embedded:  # the embedded preset's arch is its own model's, not this one's
            raise UserError(
                f"{unread}, so its architecture is unknown offline: fetch its config.json "
                f"(hf download {path} config.json) or choose its preset (model=...)"
            )
        unread = "; " + unread
    arch = dict(to_plain(model_cfg.arch) or {})
    if model_cfg.embedded and "vocab_size" not in arch:
        arch["vocab_size"] = len(build_tokenizer())
    if not arch:
        raise UserError(
            f"model {model_cfg.name}: no config.json at model.path={path} and no "
            f"model.arch in its preset; point model.path at the model's folder"
        )
    return _from_mapping(arch, f"the preset's model.arch (model={model_cfg.name}{unread})")


def parameters(a: Architecture) -> dict[str, int]:
    """``{total, embedding, non_embedding}`` parameter counts (Qwen2: q/k/v biases, RMSNorm)."""
    h, kvd = a.hidden_size, a.num_key_value_heads * a.head_dim
    layer = (h * h + h) + 2 * (h * kvd + kvd) + h * h + 3 * h * a.intermediate_size + 2 * h
    embedding = a.vocab_size * h
    head = 0 if a.tie_word_embeddings else a.vocab_size * h
    body = a.num_hidden_layers * layer + h
    return {"total": embedding + head + body, "embedding": embedding, "non_embedding": body + head}


def lora_parameters(a: Architecture, rank: int, targets) -> int:
    """The parameters of a rank-``rank`` LoRA adapter on ``targets`` (``"all-linear"``, PEFT's every
    linear layer of the blocks, the output head not included, or module names): ``rank x (in + out)``
    for each targeted linear layer of each block; a name that is not a Llama/Qwen2 block linear counts 0."""
    h, kvd, inter = a.hidden_size, a.num_key_value_heads * a.head_dim, a.intermediate_size
    shapes = {
        "q_proj": (h, h),
        "k_proj": (h, kvd),
        "v_proj": (h, kvd),
        "o_proj": (h, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    names = list(shapes) if targets == "all-linear" else [str(t) for t in targets]
    return a.num_hidden_layers * sum(rank * sum(shapes[name]) for name in names if name in shapes)


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
    train_seconds: float | None = None
    generation_seconds: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def step_cost(
    a: Architecture,
    *,
    prompts: int,
    n: int,
    prompt_len: int,
    response_len: int,
    ranks: int,
    micro_rows: int,
    micro_tokens: int | None,
    epochs: int,
    checkpointing: bool,
    compute_bytes: int,
    chunk: int,
    fsdp: bool,
    ref_model: bool,
    mfu: float | None = None,
    peak_flops: float | None = None,
    decode_mfu: float | None = None,
    head_flops: bool = False,
    lora_params: int | None = None,
    stats_reused: float = 0.0,
    prompt_share: float = 1.0,
    autocast: bool = False,
) -> StepCost:
    """The cost of one training step; memory per rank in GB (1e9 bytes), time at ``mfu`` of
    ``ranks x peak_flops`` for the training FLOPs and ``decode_mfu`` (default ``mfu``) for generation.
    ``head_flops``: count the training FLOPs as the trainer executes them: the output head's product
    (``V h`` a token, tied or not) at the response positions only, where the log-probs are taken
    (``stats/policy_stats.response_token_stats``), the body at every position. Off: the usual ``6 N``
    count of model FLOPs (MFU), every parameter at every position. ``diagnostics.quadrants``' one
    ``autograd.grad`` a micro-batch stops at the log-probs and adds no model FLOPs.
    ``lora_params``: the adapter's parameters when only a LoRA adapter trains (``lora_parameters``):
    the backward computes the activations' gradients but not the frozen weights' (one forward's FLOPs
    instead of two, the adapter's own products aside), and gradients and AdamW's moments are the
    adapter's. ``stats_reused``: the share (0 to 1) of the statistics forward's rows whose forward the
    first update pass takes over (``trainer.reuse_stats_forward``, ``reused_stats_share``). ``prompt_share``
    (with ``head_flops``): the share of rows whose prompt a forward runs (``shared_prompt_share``); ``autocast``: as
    ``_step_memory``'s."""
    p = parameters(a)
    head = a.vocab_size * a.hidden_size
    seqs, s = prompts * n, prompt_len + response_len
    tokens = seqs * s
    L, h = a.num_hidden_layers, a.hidden_size
    # the positions a forward runs: with shared prompts each distinct prompt of a pass once (as executed only)
    run = seqs * (response_len + prompt_len * (prompt_share if head_flops else 1.0))
    attention = run * 2 * L * h * s
    if head_flops:  # the body at every position run, the head at the response positions only
        body = p["non_embedding"] - (0 if a.tie_word_embeddings else head)
        fwd = run * 2 * body + attention + seqs * response_len * 2 * head
    else:
        fwd = tokens * 2 * p["non_embedding"] + attention  # forward of every sequence once
    n_body = p["non_embedding"]
    adapter = run * 2 * (lora_params or 0)  # the adapter's own products, a forward
    fwd += adapter
    # the backward: the activations' gradients (a forward's FLOPs) and the trained weights' (another one for
    # full fine-tuning; the adapter's alone with LoRA: a frozen weight needs no gradient of its own)
    backward = fwd + (adapter if lora_params else fwd)
    stats = fwd * (1.0 - stats_reused)  # the sampling policy's statistics, less the rows the first update reuses
    train = (fwd * (2 if checkpointing else 1) + backward) * epochs + stats + (fwd if ref_model else 0)
    generated = seqs * response_len
    gen = seqs * prompt_len * 2 * n_body + generated * (2 * n_body + 2 * L * h * s)
    shard = ranks if fsdp and ranks > 1 else 1
    rows_tokens = micro_tokens if micro_tokens else micro_rows * s  # positions of one pass
    memory = _step_memory(a, shard, compute_bytes, lora_params, rows_tokens, chunk, checkpointing, autocast)
    seconds = train_s = gen_s = None
    if mfu and peak_flops:
        train_s = train / (mfu * peak_flops * ranks)
        gen_s = gen / ((decode_mfu or mfu) * peak_flops * ranks)
        seconds = train_s + gen_s
    memory = {k: round(v, 4) for k, v in memory.items()}
    return StepCost(p["total"], seqs, tokens, generated, float(train), float(gen), memory, seconds, train_s, gen_s)


def _step_memory(
    a: Architecture,
    shard: int,
    compute_bytes: int,
    lora_params: int | None,
    rows_tokens: int,
    chunk: int,
    checkpointing: bool,
    autocast: bool = False,
) -> dict[str, float]:
    """``step_cost``'s memory per rank in GB: float32 weights (and a layer's gathered copy under FSDP, or with
    ``autocast``, the body under ``torch.autocast``, its ``compute_bytes`` copy of the body's weights through a
    pass), the trained parameters' gradients and AdamW moments (the adapter's with LoRA), one pass's activations."""
    p = parameters(a)
    L, h, gb = a.num_hidden_layers, a.hidden_size, 1e9
    weights = 4 * p["total"] / shard + (compute_bytes * (p["total"] - p["embedding"]) / L if shard > 1 else 0)
    body = p["non_embedding"] - (0 if a.tie_word_embeddings else a.vocab_size * h)  # the head runs in float32
    weights += compute_bytes * body if autocast else 0
    trainable = lora_params if lora_params else p["total"]
    weights += 4 * (lora_params or 0) / shard
    grads = 4 * trainable / shard
    optimizer = 8 * trainable / shard
    kvd = a.num_key_value_heads * a.head_dim
    per_token_layer = 9 * h + 4 * kvd + 4 * a.intermediate_size
    chunk_bytes = 3 * min(chunk, rows_tokens) * a.vocab_size * 4  # logits, softmax, their gradient (float32)
    full = rows_tokens * L * per_token_layer * compute_bytes + chunk_bytes
    ckpt = rows_tokens * (L * h + per_token_layer) * compute_bytes + chunk_bytes
    memory = {
        "weights": weights / gb,
        "gradients": grads / gb,
        "optimizer": optimizer / gb,
        "activations": full / gb,
        "activations_checkpointed": ckpt / gb,
    }
    memory["total"] = (weights + grads + optimizer) / gb + (ckpt if checkpointing else full) / gb
    return memory


# `entropyrl plan --cpu`'s rates when not given: one core of this project's reference machine (an AMD EPYC
# with AVX2, no AVX-512, 2 cores), float32, measured by `make bench` key real_model (perf/real_model.py:
# `matmul_gflops`, a [tokens x hidden] @ [hidden x intermediate] product; `bandwidth_gbps`, a sum over a
# tensor far larger than L3). Measure your own machine's with `make bench` and pass them.
CPU_GFLOPS_DEFAULT = 30.0
CPU_MEM_GBPS_DEFAULT = 6.0
CPU_DECODE_GFLOPS_DEFAULT = 15.0  # `decode_matmul_gflops`: 16 rows through the model's weights, streamed from memory
# the share of those limits a step reaches (`make bench` key real_model: `decode_roofline_frac`,
# `train_flops_frac` with the training FLOPs as executed): HF generate's decode loses the rest to the KV
# cache's concatenation, attention, norms and per-token Python. The defaults are the shares the reference
# machine reached when nothing else ran on it (decode 0.51-0.53, training 0.70-0.81); with other
# jobs on its cores (load average near 4) they fell to 0.35-0.37 and 0.41 (docs/performance.md)
CPU_DECODE_EFFICIENCY_DEFAULT = 0.5
CPU_TRAIN_EFFICIENCY_DEFAULT = 0.8
CPU_KEYS = ("gflops", "mem_gbps", "decode_gflops", "decode_efficiency", "train_efficiency")


def cpu_step_time(
    a: Architecture,
    *,
    prompts: int,
    n: int,
    prompt_len: int,
    response_len: int,
    train_flops: float,
    gflops: float,
    mem_gbps: float,
    shared_prefill: bool = True,
    weight_bytes: int = 4,
    decode_gflops: float | None = None,
    decode_efficiency: float = 1.0,
    train_efficiency: float = 1.0,
) -> dict[str, float]:
    """One step's seconds on a CPU, by part, with Hugging Face ``generate`` (``rollout=hf``). Pure.

    A CPU runs the step's matrix products at about ``gflops`` GFLOP/s and streams memory at about
    ``mem_gbps`` GB/s (the rates of one run, measured side by side), so:

    - prefill: every prompt once (``shared_prefill``, ``rollout.share_prefill``) or once per response,
      ``prompt_len`` tokens at ``2 N`` FLOPs each, compute-bound;
    - decode: ``response_len`` steps of ``prompts x n`` rows; a step reads every weight once
      (``weight_bytes`` each, the tied output head included) and does ``2 (N + V h)`` FLOPs a row (the
      output head over the vocabulary for every row), so it takes the longer of its memory time and
      its FLOP time (the roofline): with few rows a step is weights-bandwidth-bound, with many it is
      FLOP-bound. Its FLOPs run at ``decode_gflops`` (default ``gflops``): a product of a few rows
      by a weight streamed from memory runs well below a training-sized one. Not counted: the
      attention over the KV cache and its concatenation, norms and the per-token Python of
      ``generate`` (a quarter to a third of a CPU decode step under ``torch.profiler``);
    - training: ``train_flops`` (``step_cost``'s: the sampling policy's forward, forward and backward
      per epoch, a reference forward) at the same FLOP rate.

    ``decode_efficiency`` and ``train_efficiency`` (0-1]: the share of its limit each part reaches
    (1: the limit itself, a lower bound on the time); ``*_floor_seconds`` keep the limits' own times.
    """
    if gflops <= 0 or mem_gbps <= 0 or (decode_gflops is not None and decode_gflops <= 0):
        raise UserError("entropyrl plan --cpu: need --cpu-gflops > 0, --cpu-decode-gflops > 0 and --mem-gbps > 0")
    if not (0 < decode_efficiency <= 1 and 0 < train_efficiency <= 1):
        raise UserError("entropyrl plan --cpu: need 0 < --cpu-decode-efficiency <= 1 and 0 < --cpu-train-efficiency <= 1")
    p = parameters(a)
    head = a.vocab_size * a.hidden_size
    row_flops = 2 * (p["non_embedding"] + (head if a.tie_word_embeddings else 0))
    rows = prompts * n
    flops_s, bytes_s = gflops * 1e9, mem_gbps * 1e9
    prefill_rows = prompts if shared_prefill else rows
    prefill = prefill_rows * prompt_len * 2 * p["non_embedding"] / flops_s
    step_memory = row_flops / 2 * weight_bytes / bytes_s  # the weights a row multiplies: all but the input embedding
    decode_rate = (decode_gflops or gflops) * 1e9
    step_flops = rows * (row_flops + 2 * a.num_hidden_layers * a.hidden_size * (prompt_len + response_len)) / decode_rate
    decode_floor = max(step_memory, step_flops)
    decode_step = decode_floor / decode_efficiency
    decode = response_len * decode_step
    train_floor = train_flops / flops_s
    train = train_floor / train_efficiency
    return {
        "decode_step_floor_seconds": decode_floor,
        "train_floor_seconds": train_floor,
        "prefill_seconds": prefill,
        "decode_step_seconds": decode_step,
        "decode_step_memory_seconds": step_memory,
        "decode_step_flop_seconds": step_flops,
        "decode_seconds": decode,
        "generation_seconds": prefill + decode,
        "train_seconds": train,
        "step_seconds": prefill + decode + train,
    }


def vllm_share(a: Architecture, *, share: float, gpu_gb: float, weight_bytes: int, tensor_parallel: int, seq_len: int) -> dict:
    """The vLLM engine's part of one GPU: ``share x gpu_gb`` GB, of which the weights (``weight_bytes``
    a parameter, split over ``tensor_parallel`` GPUs) and the KV cache the rest; how many tokens and
    full-length sequences (``seq_len``) that cache holds, and whether the weights fit at all. Pure."""
    gb = share * gpu_gb
    weights = weight_bytes * parameters(a)["total"] / tensor_parallel / 1e9
    kv_per_token = 2 * a.num_hidden_layers * a.num_key_value_heads * a.head_dim * weight_bytes / tensor_parallel
    kv_gb = max(gb - weights, 0.0)
    tokens = int(kv_gb * 1e9 / kv_per_token)
    return {
        "share": share,
        "gb": round(gb, 3),
        "weights_gb": round(weights, 3),
        "kv_cache_gb": round(kv_gb, 3),
        "kv_cache_tokens": tokens,
        "sequences_at_max_len": tokens // max(seq_len, 1),
        "fits": tokens >= seq_len,
    }


def verdict(train_gb: float, gpu_gb: float, engine: dict | None, engine_beside: bool = True) -> dict:
    """Per rank: the trainer's budget (the GPU less the engine's share when the engine sits beside it,
    the whole GPU when it has GPUs of its own), whether its memory fits there and whether the engine
    fits its share; ``fits`` only when both do. Pure."""
    budget = gpu_gb - (engine["gb"] if engine and engine_beside else 0.0)
    trainer_fits = train_gb <= budget
    return {
        "gpu_gb": gpu_gb,
        "trainer_budget_gb": round(budget, 3),
        "trainer_gb": round(train_gb, 3),
        "trainer_fits": trainer_fits,
        "engine_fits": engine["fits"] if engine else None,
        "fits": trainer_fits and (engine is None or engine["fits"]),
    }


def async_estimate(
    train_seconds: float | None, generation_seconds: float | None, staleness: int, rollout_gpus: int = 0
) -> dict | None:
    """The step time with ``trainer.staleness >= 1`` if generation overlapped training completely,
    ``max(train, generation)``, and the ideal speed-up over taking turns, ``(train + generation) /
    max(...)``; None without both times. ``rollout_gpus``: the worker's own GPUs (0: shared)."""
    if not train_seconds or not generation_seconds:
        return None
    overlapped = max(train_seconds, generation_seconds)
    return {
        "staleness": staleness,
        "rollout_gpus": rollout_gpus,
        "step_seconds": round(overlapped, 3),
        "ideal_speedup": round((train_seconds + generation_seconds) / overlapped, 3),
    }


def plan_figures(
    overrides: list[str],
    *,
    ranks: int,
    mfu: float,
    peak_tflops: float,
    prompt_len: int | None,
    gpu_gb: float = 80.0,
    decode_mfu: float | None = None,
    cpu: dict | None = None,
) -> dict:
    """The cost table of ``entropyrl train <overrides>`` on ``ranks`` ranks, as a dict, with the
    per-rank verdict against ``gpu_gb`` GB GPUs and the assumptions it rests on. ``cpu``: a CPU's
    rates and efficiencies (``CPU_KEYS``; one left out: its ``CPU_*_DEFAULT``): adds ``cpu``, the step's
    seconds there by part (``cpu_step_time``) with its training FLOPs as executed (the tied head,
    the output head at the response positions)."""
    if ranks < 1 or not 0 < mfu <= 1 or peak_tflops <= 0 or gpu_gb <= 0 or not 0 < (decode_mfu or mfu) <= 1:
        raise UserError(
            "entropyrl plan: need --ranks >= 1, 0 < --mfu <= 1, 0 < --decode-mfu <= 1, --peak-tflops > 0 and --gpu-gb > 0"
        )
    cfg = compose("train", overrides)
    t = cfg.trainer
    arch = architecture(cfg.model)
    prompt = int(prompt_len or cfg_get(cfg.data, "max_prompt_length", 0) or 256)
    fsdp = str(t.fsdp).lower() not in ("false", "0", "no") and (ranks > 1 or t.dtype == "bfloat16")
    shape = _step_shape(cfg, prompt, ranks, fsdp)  # the run's step as step_cost reads it
    cost = step_cost(
        arch,
        **shape,
        mfu=mfu,
        peak_flops=peak_tflops * 1e12,
        decode_mfu=decode_mfu,
    )
    staleness = bind(Trainer, t).staleness  # a config from before the key: the schema's default, synchronous
    rollout_gpus = int(t.rollout_gpus or 0) if staleness else 0  # the worker's own GPUs
    engine_dtype = str(cfg.rollout.get("dtype") or t.dtype)  # null: the trainer's dtype
    engine = _vllm_plan(cfg, arch, gpu_gb, prompt, engine_dtype, rollout_gpus)
    cpu_time = None if cpu is None else _cpu_plan(cfg, arch, shape, prompt, cpu)
    decode = decode_mfu or mfu
    overlap = async_estimate(cost.train_seconds, cost.generation_seconds, staleness, rollout_gpus)
    assumptions = _plan_assumptions(mfu, decode, peak_tflops, gpu_gb, engine, engine_dtype, overlap, ranks, rollout_gpus)
    weights = cfg_get(cfg.rollout, "weights")
    if cpu_time is not None and weights in ("float32_packed", "int8", "bfloat16"):
        key = {"int8": "decode_int8_speedup", "bfloat16": "decode_bf16_speedup"}.get(weights, "decode_packed_speedup")
        assumptions.append(
            f"rollout.weights={weights}: the CPU generation time is that of float32 sampling, an upper bound where the "
            f"CPU has the kernels (the copy decodes faster there: `make bench` key real_model, {key}); the copy made "
            "after each update is not counted"
        )
    if cpu_time is not None and shape["autocast"]:
        assumptions.append(
            "trainer.dtype=bfloat16 (autocast, no FSDP): the CPU training time is that of float32 products, an upper "
            "bound where the CPU has bfloat16 kernels (`make bench` key real_model, bf16_train_speedup)"
        )
    return {
        "model": str(cfg.model.name),
        "architecture": arch.source,
        "ranks": ranks,
        "mfu": mfu,
        "decode_mfu": decode,
        "peak_tflops_per_rank": peak_tflops,
        "prompt_len": prompt,
        "response_len": int(cfg.rollout.max_new_tokens),
        "fsdp": fsdp,
        "gradient_checkpointing": bool(t.gradient_checkpointing),
        **cost.to_dict(),
        "vllm": engine,
        "verdict": verdict(cost.memory_gb["total"], gpu_gb, engine, engine_beside=not rollout_gpus),
        "async": overlap,
        "cpu": cpu_time,
        "checkpoint": _checkpoint_plan(cfg, cost.parameters),
        "assumptions": assumptions,
    }


def _step_shape(cfg, prompt: int, ranks: int, fsdp: bool) -> dict:
    """``step_cost``'s keyword arguments for the run's step: the GPU plan and the CPU step time alike."""
    t = cfg.trainer
    n, response = int(cfg.rollout.n), int(cfg.rollout.max_new_tokens)
    # a pass holds at most one rank's share of a mini-batch, whatever the micro-batch setting allows
    mini_rows = -(-min(int(t.mini_batch_prompts), int(t.prompts_per_step)) * n // ranks)
    budget = t.get("micro_batch_tokens")
    return dict(
        prompts=int(t.prompts_per_step),
        n=n,
        prompt_len=prompt,
        response_len=response,
        ranks=ranks,
        micro_rows=min(int(t.micro_batch_responses), mini_rows),
        micro_tokens=min(int(budget), mini_rows * (prompt + response)) if budget else None,
        epochs=int(t.ppo_epochs),
        checkpointing=bool(t.gradient_checkpointing),
        compute_bytes=2 if t.dtype == "bfloat16" else 4,
        chunk=int(t.token_chunk_size),
        fsdp=fsdp,
        ref_model=float(cfg.algo.kl_coef or 0) > 0,
        lora_params=_lora_params(cfg.model),
        stats_reused=reused_stats_share(cfg, ranks),
        prompt_share=shared_prompt_share(cfg, ranks, fsdp),
        autocast=t.dtype == "bfloat16" and not fsdp,
    )


def shared_prompt_share(cfg, ranks: int, fsdp: bool) -> float:
    """The expected share of a pass's rows whose prompt its forward runs with ``trainer.share_prompt_forward``
    (``stats/policy_stats.shared_prompt_hidden``): distinct prompts over rows, for a pass of ``micro_rows``
    rows drawn at random from a step's groups of ``rollout.n`` (the update's shuffled order); 1 when it is off,
    under FSDP with several ranks or with gradient checkpointing, where every row runs its prompt."""
    t = bind(Trainer, cfg.trainer)
    n = int(cfg.rollout.n)
    if not t.share_prompt_forward or (fsdp and ranks > 1) or t.gradient_checkpointing or n < 2:
        return 1.0
    rows = t.prompts_per_step * n
    pass_rows = min(t.micro_batch_responses, -(-min(t.mini_batch_prompts, t.prompts_per_step) * n // ranks), rows)
    # P(a group has no row in the pass) = C(rows - n, pass_rows) / C(rows, pass_rows)
    missed = 1.0
    for i in range(n):
        missed *= max(rows - pass_rows - i, 0) / (rows - i)
    return t.prompts_per_step * (1.0 - missed) / pass_rows


def reused_stats_share(cfg, ranks: int) -> float:
    """The share of a step's rows whose statistics forward the first update pass takes over
    (``trainers/data/first_pass.py``): its first micro-batch (by count, or as many full-length rows as the
    token budget holds) over the step's rows; 0 when it is off, with several ranks, without an epoch, or
    with LoRA dropout (the model's own dropout rates are not known without loading it)."""
    t = bind(Trainer, cfg.trainer)
    rows, mini = t.prompts_per_step * int(cfg.rollout.n), t.mini_batch_prompts * int(cfg.rollout.n)
    lora_dropout = float((cfg.model.get("lora") or {}).get("dropout") or 0) if _lora_params(cfg.model) else 0.0
    if not t.reuse_stats_forward or ranks > 1 or t.ppo_epochs < 1 or lora_dropout > 0:
        return 0.0
    if t.micro_batch_tokens:
        seq_len = int(cfg_get(cfg.data, "max_prompt_length", 0) or 0) + int(cfg.rollout.max_new_tokens)
        first = max(1, t.micro_batch_tokens // max(seq_len, 1))
    else:
        first = t.micro_batch_responses
    return min(first, mini, rows) / rows


def _checkpoint_plan(cfg, parameters: int) -> dict:
    """A checkpoint's size (GB), what it holds and the disk the kept ones take: the float32 weights and
    AdamW moments of what trains (the adapter alone with LoRA, plus the merged model with ``save_merged``),
    saved every ``save_every`` steps and at the last."""
    t = cfg.trainer
    adapter = _lora_params(cfg.model)
    merged = bool(adapter) and bool((cfg.model.get("lora") or {}).get("save_merged"))
    gb = (12 * (adapter or parameters) + (4 * parameters if merged else 0)) / 1e9
    keep, every, total = int(t.keep_checkpoints or 0), int(t.save_every or 0), int(t.total_steps)
    saves = (total // every if every else 0) + int(not every or total % every != 0)  # every save_every steps, and the last
    kept = min(keep, saves) if keep > 0 else saves  # 0 deletes none: every save stays on disk
    holds = "float32 weights + AdamW moments"
    if adapter:
        holds = "the LoRA adapter + its AdamW moments" + (" + the merged model" if merged else "")
    return {"gb": round(gb, 6), "holds": holds, "save_every": every, "keep": keep, "disk_gb": round(gb * kept, 6)}


def _lora_params(model_cfg) -> int | None:
    """The LoRA adapter's parameters of ``model.lora`` (None: full fine-tuning), read as
    ``models/lora.lora_settings`` reads it; that module is not imported here, since it imports torch at its
    top and ``models/cost.py`` is imported by commands that never load a model."""
    lora = model_cfg.get("lora") or {}
    check_lora_is_on_where_set(lora)
    if not lora.get("rank"):
        return None
    targets = lora.get("target_modules")
    targets = "all-linear" if targets in (None, "all-linear") else [str(t) for t in targets]
    return lora_parameters(architecture(model_cfg), int(lora["rank"]), targets)


def _vllm_plan(cfg, arch, gpu_gb: float, prompt: int, engine_dtype: str, rollout_gpus: int) -> dict | None:
    """The vLLM engine's share of a GPU (``vllm_share``) with where it comes from and where it sits;
    None with another engine."""
    if str(cfg.rollout.name) != "vllm":
        return None
    share = cfg.rollout.gpu_memory_utilization
    engine = vllm_share(
        arch,
        share=float(VLLM_DEFAULT_SHARE if share is None else share),
        gpu_gb=gpu_gb,
        weight_bytes=4 if engine_dtype == "float32" else 2,
        tensor_parallel=int(cfg.rollout.tensor_parallel_size or 1),
        seq_len=prompt + int(cfg.rollout.max_new_tokens),
    )
    engine["source"] = (
        "rollout.gpu_memory_utilization"
        if share is not None
        else f"rollout.gpu_memory_utilization=null: the engine's {VLLM_DEFAULT_SHARE} beside a trainer"
    )
    engine["placement"] = f"the rollout worker's own {rollout_gpus} GPU(s)" if rollout_gpus else "beside the trainer"
    return engine


def _cpu_plan(cfg, arch, shape: dict, prompt: int, cpu: dict) -> dict:
    """The step's seconds on a CPU of ``cpu``'s rates (``CPU_KEYS``; one left out: its default), by
    part, with the training FLOPs as executed (the output head at the response positions)."""
    t = cfg.trainer
    unknown = sorted(set(cpu) - set(CPU_KEYS))
    if unknown:
        raise UserError(f"entropyrl plan: unknown CPU rate {unknown[0]}: give {', '.join(CPU_KEYS)}")
    defaults = dict(
        zip(
            CPU_KEYS,
            (
                CPU_GFLOPS_DEFAULT,
                CPU_MEM_GBPS_DEFAULT,
                CPU_DECODE_GFLOPS_DEFAULT,
                CPU_DECODE_EFFICIENCY_DEFAULT,
                CPU_TRAIN_EFFICIENCY_DEFAULT,
            ),
        )
    )
    rates = {k: float(defaults[k] if cpu.get(k) is None else cpu[k]) for k in CPU_KEYS}
    executed = step_cost(
        arch,
        **shape,
        head_flops=True,
    )
    cpu_time = cpu_step_time(
        arch,
        prompts=int(t.prompts_per_step),
        n=int(cfg.rollout.n),
        prompt_len=prompt,
        response_len=int(cfg.rollout.max_new_tokens),
        train_flops=executed.train_flops,
        **rates,
        shared_prefill=str(cfg.rollout.name) == "hf" and bool(cfg.rollout.share_prefill),
        weight_bytes=2 if t.dtype == "bfloat16" else 4,
    )
    return {**rates, "train_flops": float(executed.train_flops), **{k: round(v, 3) for k, v in cpu_time.items()}}


def _plan_assumptions(
    mfu: float,
    decode: float,
    peak_tflops: float,
    gpu_gb: float,
    engine: dict | None,
    engine_dtype: str,
    overlap: dict | None,
    ranks: int,
    rollout_gpus: int,
) -> list[str]:
    """What the plan's figures rest on, one sentence each, as ``entropyrl plan`` prints them."""
    assumptions = [
        f"training FLOPs at MFU {mfu:.0%} of {peak_tflops:g} TFLOP/s per rank (--mfu, --peak-tflops)",
        f"generation at MFU {decode:.0%} (--decode-mfu): decoding is memory-bound and usually runs far below "
        f"the training MFU, so this part of the step time is a lower bound unless --decode-mfu says otherwise",
        f"{gpu_gb:g} GB per GPU (--gpu-gb); every sequence at the maximum prompt and response length",
        "not counted: CUDA context, allocator fragmentation, Hugging Face generate's KV cache, a reference model",
    ]
    if engine:
        assumptions.append(
            f"one vLLM engine {'in the rollout worker, on GPUs of its own,' if rollout_gpus else 'per rank'} holding "
            f"the full weights in {engine_dtype} (split over rollout.tensor_parallel_size GPUs), its KV cache in the "
            f"rest of its {engine['share']:.0%} share ({engine['source']})"
        )
    if overlap:
        assumptions.append(
            "trainer.staleness >= 1: the step time if generation overlaps training completely (no weight-sync "
            "cost); "
            + (
                f"the rollout worker has {rollout_gpus} GPU(s) of its own (trainer.rollout_gpus), "
                f"{ranks + rollout_gpus} GPUs in all"
                if rollout_gpus
                else "the rollout worker shares a rank's GPUs (trainer.rollout_gpus=0), so a run reaches less"
            )
            + " (docs/async.md)"
        )
    return assumptions
