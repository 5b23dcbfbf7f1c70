"""What the rollout engines and the tool driver read from their config sections, read once into
typed settings: ``SamplingSettings`` (the engine section: ``conf/rollout/<name>.yaml`` in training,
built from ``eval.*`` in evaluation) and ``ToolSettings`` (the ``tools`` section,
declared in the run schema's ``core/schema/tools.py``).

Each key is declared once, here, with its default: the value the composed default ``train``
config sets (``tests/rollout/test_settings.py`` holds the two together), so a caller that passes a
partial dict (a test, an evaluation) samples as a plain ``entropyrl train`` would. A key missing from the section,
or null in it, takes the field's default; keys the engines do not read are ignored (the config's
validation, ``core/validation.py``, refuses unknown ones). Both read like a mapping too
(``settings["top_k"]``, ``settings.get("top_k")``), for code written against the raw section.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from ..conf import cfg_get, to_plain

__all__ = ["SamplingSettings", "ToolSettings", "ToolShaping", "TAG_KEYS"]

#: ``tools.tags`` keys: the strings that open and close a call and its output (``tool_formats.py``).
TAG_KEYS = ("call_open", "call_close", "output_open", "output_close")


def _mapping(value) -> dict:
    return dict(to_plain(value))


def _int_tuple(value) -> tuple[int, ...]:
    return tuple(int(v) for v in to_plain(value))


# a field's declared type -> how a config value becomes it (types not listed: taken as they are)
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "str | None": str,
    "int | None": int,
    "float | None": float,
    "bool | None": bool,
    "dict": _mapping,
    "tuple[int, ...]": _int_tuple,
}


class _Settings:
    """``from_config`` for a frozen dataclass of section keys, and mapping-style reads of its fields."""

    @classmethod
    def from_config(cls, section):
        """The settings of ``section`` (an OmegaConf node, a dict, or None: every default; settings
        already built are returned as they are). A key missing or null takes the field's default."""
        if isinstance(section, cls):
            return section
        values = {}
        for f in fields(cls):
            raw = cfg_get(section, f.name)
            if raw is not None:
                convert = _NESTED.get(f.type) or _CONVERT.get(f.type, to_plain)
                values[f.name] = convert(raw)
        return cls(**values)

    def __getitem__(self, key: str):
        if key not in {f.name for f in fields(self)}:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default=None):
        return getattr(self, key) if key in {f.name for f in fields(self)} else default


@dataclass(frozen=True)
class SamplingSettings(_Settings):
    """An engine section's keys (``rollout.*``; in evaluation ``eval.*`` and ``eval.<backend>``)."""

    # every engine
    name: str = "hf"  # the engine's registered name (rollout/base.py ROLLOUT_ENGINES)
    n: int = 8  # responses per prompt, the GRPO group size (generate takes it per call)
    temperature: float = 1.0  # sampling temperature when a call gives none; 0 = greedy
    top_p: float = 1.0  # nucleus sampling's mass (1.0 = off) when a call gives none
    top_k: int = 0  # keep the k likeliest tokens (0 = off)
    max_new_tokens: int = 32  # response length cap when a call gives none (the default task's, conf/data/countdown.yaml)
    add_special_tokens: bool = False  # the tokenizer's special tokens around each prompt (false: templated or raw prompts)
    seed_scope: str = "call"  # call: one seed per generate call on a rank; group: one per group (trainers/collect.py)
    option: str = "rollout"  # the setting that chose the engine, named in its errors (rollout, eval.backend)
    # hf (rollout/hf_engine.py)
    batch_size: int = 512  # sequences per model.generate call
    share_prefill: bool = True  # a prompt's n responses share one prefill of it
    weights: str = "float32"  # float32: the live model samples; int8 | bfloat16: a copy in that precision (sampler_copy.py)
    # vllm (rollout/vllm_engine.py)
    model_path: str | None = None  # the model folder the engine starts from when it gets no model (evaluation)
    extra_stop_ids: tuple[int, ...] = ()  # token ids that end a response besides the EOS ids (model.stop_tokens)
    dtype: str | None = None  # the engine's dtype; null = the trainer's parameter dtype
    gpu_memory_utilization: float | None = None  # null = 0.1 on CPU, 0.6 beside a trainer, 0.9 alone
    cpu_kvcache_space: int = 1  # GiB of KV cache on CPU (VLLM_CPU_KVCACHE_SPACE, unless already set)
    tensor_parallel_size: int = 1  # GPUs the engine shards the model over
    max_model_len: int | None = None  # context in tokens; null = the model's max_position_embeddings
    max_num_seqs: int | None = None  # sequences scheduled at once; null = vLLM's default
    enforce_eager: bool | None = None  # no CUDA graphs / torch.compile; null = true on CPU, false on GPU
    inprocess: str | bool = "auto"  # the engine in the training process (auto: on one GPU, single-process)
    seed: int = 0  # the engine's seed (every request also gets its own)
    sync_bucket_mb: float = 512.0  # weights are pushed in buckets of whole layers of about this many MiB
    engine_kwargs: dict = field(default_factory=dict)  # any other vllm.LLM argument
    # read by the algorithm, not by an engine
    tis: dict | None = None  # rollout.tis: the truncated-IS intervention's section (trainers/interventions/tis.py)


@dataclass(frozen=True)
class ToolShaping(_Settings):
    """``tools.shaping``: reward terms for tool use, added to the verifier's reward."""

    call_bonus: float = 0.0  # added once to a response that ran at least one call without error
    error_penalty: float = 0.0  # subtracted per call that errored


@dataclass(frozen=True)
class ToolSettings(_Settings):
    """The ``tools`` section: multi-turn rollouts with a code interpreter (``rollout/multi_turn.py``)."""

    enabled: bool = False  # multi-turn rollouts with the tool
    name: str = "code_interpreter"  # the tool's name, as a call names it
    format: str = "hermes"  # how a call is written and its output returned (rollout/tool_formats.py)
    tags: dict = field(default_factory=lambda: dict.fromkeys(TAG_KEYS))  # the format's tags; null = the format's own
    max_turns: int = 4  # generation turns per response
    max_calls: int = 3  # tool calls run per response
    max_output_chars: int = 1024  # a longer tool output is cut in the middle
    tool_turn: str = "inline"  # inline: output in the assistant's message; chat: a chat-templated tool turn
    session: str = "stateless"  # stateless: each call alone; trajectory: the response's earlier calls replayed first
    mask_invalid_calls: bool = False  # a response with a malformed call out of the loss
    mask_repeated: bool = False  # a response that runs the same code twice out of the loss
    drop_void_turns: bool = False  # a response with a void turn out of the loss
    answer_pattern: str | None = None  # a final answer's regular expression; null = the math grader's final answer
    show_last_expression: bool = True  # a call whose code ends in an expression prints its repr
    executor: dict = field(default_factory=dict)  # the sandbox's limits per call (evals/code/tool_executor.py reads them)
    shaping: ToolShaping = field(default_factory=ToolShaping)  # optional reward terms for tool use


# nested sections: a field of one of these types is read with its own from_config
_NESTED: dict[str, Callable[[Any], Any]] = {"ToolShaping": ToolShaping.from_config}
