"""The schema of ``entropyrl train``'s own keys: the loop (``trainer``), the optimizer, LoRA, rewards, validation
and diagnostics. The ``tools`` and ``tracking`` groups' keys are in ``tools.py`` and ``tracking.py``; the other
groups (``algo``, ``model``, ``rollout``, ``data``) declare theirs in their YAML options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..rules import (
    BOOL,
    FOLDER,
    NONNEG,
    NONNEG_INT,
    OPEN_PROB,
    OPT_STR,
    POS,
    POS_INT,
    PROB,
    STR,
    STR_LIST,
    THREADS,
    Rule,
    choice,
    integer,
    number,
    owned,
)
from . import key, section
from .lora import Lora

#: ``trainer.resume``: auto continues a matching run, never refuses a folder that holds one,
#: overwrite deletes the old run's checkpoints, metrics and tracking link and starts fresh.
RESUME_MODES = ("auto", "never", "overwrite")


@dataclass
class Trainer:
    """``trainer``: the training loop: its length, batch shape, checkpoints, resumption, device and threads,
    and the asynchronous rollout worker (``staleness``)."""

    total_steps: int = key(
        300,
        POS_INT,
        (
            "training steps (one rollout batch + its updates each). On the default task GRPO's entropy sinks below 0.2x "
            "its start (the `collapse` flag) late in this span; STARE holds h_tgt"
        ),
    )
    seed: int = key(0, NONNEG_INT, "seeds python, numpy, torch and the task generator: same seed, same metrics on CPU")
    prompts_per_step: int = key(32, POS_INT, "distinct prompts per step; each gets rollout.n responses")
    mini_batch_prompts: int = key(
        16, POS_INT, "prompts per optimizer step (PPO mini-batch): prompts_per_step/mini_batch_prompts updates per epoch"
    )
    micro_batch_responses: int = key(256, POS_INT, "responses per forward/backward (gradient accumulation inside a mini-batch)")
    micro_batch_tokens: int | None = key(
        None,
        integer(1, nullable=True),
        (
            "instead: pack each forward/backward longest first up to this many (padded) tokens, each pass trimmed to its "
            "own width; same gradients (null = by response count)"
        ),
    )
    ppo_epochs: int = key(1, POS_INT, "passes over the rollout batch")
    reuse_stats_forward: bool = key(
        True,
        BOOL,
        (
            "the first update pass takes its forward from the sampling statistics pass (same weights and rows: the same "
            "numbers, one forward fewer a step); only on one process without dropout (trainers/data/first_pass.py)"
        ),
    )
    share_prompt_forward: bool = key(
        True,
        BOOL,
        (
            "the rows of a forward that share a prompt (a group's n responses) run it once: its KV cache is computed for "
            "one row and gathered to the others, so the prompt positions cost 1/n (the same numbers up to float rounding; "
            "applies on one process without gradient checkpointing, the plain forward elsewhere; false runs every row's prompt; "
            "trainers/stats/policy_stats.py)"
        ),
    )
    grad_clip: float = key(1.0, POS, "max global grad norm")
    val_every: int = key(20, NONNEG_INT, "validate every N steps (and at the end); 0 disables")
    save_every: int = key(50, NONNEG_INT, "checkpoint every N steps (and at the end); 0 = only at the end")
    keep_checkpoints: int = key(2, NONNEG_INT, "the newest N checkpoints stay, older ones are deleted; 0 keeps them all")
    resume: str = key(
        "auto",
        choice(*RESUME_MODES),
        (
            "auto: continue the run in output_dir (same settings but length/logging) | never: refuse a folder holding a "
            "run | overwrite: delete it, start fresh"
        ),
    )
    device: str = key("auto", STR, "auto = cuda if available else cpu")
    dtype: str = key(
        "float32",
        choice("float32", "bfloat16"),
        (
            "float32 | bfloat16: bf16 compute with fp32 master weights, through FSDP's mixed precision (several "
            "processes, or one with trainer.fsdp auto/true), or torch.autocast around the transformer body with "
            "trainer.fsdp=false on one process (head, log-probs, gradients and AdamW state float32)"
        ),
    )
    fsdp: Any = key(
        "auto", choice("auto", True, False), "auto: shard with FSDP2 when run under torchrun/srun with >1 process; true | false"
    )
    gradient_checkpointing: bool = key(False, BOOL, "recompute activations in backward (big models)")
    token_chunk_size: int = key(
        1024, POS_INT, "tokens per chunk for log-prob/entropy from hidden states (memory O(chunk x vocab))"
    )
    threads: Any = key(
        0, THREADS, "torch intra-op threads; 0 = the CPUs left to this run (affinity, quota, load; core/resources.py)"
    )
    progress: bool = key(True, BOOL, "rich progress bar")
    samples_every: int = key(
        10,
        NONNEG_INT,
        (
            "every N steps (and at step 1) append a few responses with prompt, reward, verdict and mean token entropy to "
            "<output_dir>/samples.jsonl (rows carry `step`), also the MLflow artifact samples/samples.jsonl "
            "(docs/long-cot.md); 0 = never"
        ),
    )
    samples_rows: int = key(4, POS_INT, "responses per samples table (first of spread-out groups first)")
    staleness: int = key(
        0,
        NONNEG_INT,
        (
            "0: generate then train, in turn (the synchronous loop). k >= 1: a rollout worker process (own copy of the "
            "policy, own threads: trainer.threads each) generates the next batches while the trainer trains, from weights"
            " at most k training steps old; older batches are dropped and counted (async/* metrics; rollout=hf or vllm; a"
            " worker per trainer rank; docs/async.md)"
        ),
    )
    rollout_gpus: int = key(
        0,
        NONNEG_INT,
        (
            "with staleness >= 1: GPUs the rollout worker (and its vLLM engine) has to itself, the last ones of this "
            "process's visible GPUs (CUDA_VISIBLE_DEVICES); the trainer keeps the others. 0: the worker shares the "
            "trainer's GPU (or CPU). On SLURM give the job one GPU per trainer rank plus these (launcher.gpus_per_node, "
            "launcher.tasks_per_node)"
        ),
    )
    worker_stall_s: float | None = key(
        None,
        number(0, open_low=True, nullable=True),
        (
            "with staleness >= 1: seconds the trainer waits on a live rollout worker that sends nothing (stopped, "
            "deadlocked, spinning) before it stops it and ends the run in one line; null: 10 x the slowest batch so far, "
            "at least 300; the first batch (model load, warm-up) waits >= 1800"
        ),
    )
    collective_timeout_s: float = key(
        600,
        number(0, open_low=True),
        (
            "with several ranks: seconds one rank waits on the others (joining, any collective) before the run ends in "
            "one line naming a rank that died or stalled; raise it if ranks legitimately drift further apart (slow model "
            "loads, rank 0 writing a big checkpoint)"
        ),
    )


@dataclass
class Optim:
    """``optim``: the optimizer and its learning-rate schedule (``trainers/optim.py``: registries ``OPTIMIZERS``,
    ``LR_SCHEDULES``). The schedule advances once per training step; each step's lr is logged as ``lr``."""

    name: str = key("adamw", STR, "the optimizer (registered in trainers/optim.py): adamw")
    lr: float = key(
        0.0003,
        POS,
        (
            "peak learning rate (1e-6 for 7B, see experiment presets); on the default task 5e-4 brought GRPO's entropy "
            "down no faster"
        ),
    )
    weight_decay: float = key(0.0, NONNEG, "decoupled (AdamW) weight decay")
    betas: list[float] = key(
        [0.9, 0.999],
        Rule("float_list", low=0, high=1, open_high=True, length=2),
        "Adam's moment decay rates (beta1, beta2), each in [0, 1)",
    )
    scheduler: str = key(
        "constant", STR, "constant | linear (decay to min_lr_ratio x lr at trainer.total_steps) | cosine (half cosine down to it)"
    )
    warmup_steps: int = key(
        0, NONNEG_INT, "training steps of linear warmup from 0 to lr (step/warmup_steps, as verl), before the schedule"
    )
    min_lr_ratio: float = key(
        0.0, PROB, "floor of linear/cosine as a fraction of lr (reached at trainer.total_steps); unused by constant"
    )


@dataclass
class TrainModel:
    """``model``: what ``entropyrl train`` adds to every ``model=`` preset: its LoRA settings."""

    lora: Lora = section(Lora)


@dataclass
class Reward:
    """``reward``: what a response is worth (``rewards/``). No entries: the data's own verifier (math grader,
    code sandbox, built-in task checker). Entries are summed with their weights; each is logged as
    ``reward/<name>/mean``, and ``acc/*`` stays the built-in verifier's verdict.

        entropyrl train "reward.functions=[{fn: 'my_pkg.rewards:format_ok', weight: 0.2}, 'builtin:countdown']"
        entropyrl train reward.url=http://127.0.0.1:8000/reward          # a judge served over HTTP
    """

    functions: Any = key(
        [],
        owned("rewards/ (a list of {fn, weight, ...} entries or function names)"),
        (
            "[{fn: pkg.mod:fn | path/to/file.py:fn | builtin:math|code|countdown|toy, weight: 1.0, name: <metric name, "
            "default the function's>, timeout_s/workers/fallback: per entry}] or {url: http://host:port/path, weight: "
            "...}"
        ),
    )
    url: str | None = key(
        None, OPT_STR, 'shorthand: one HTTP entry (weight 1): POST {"prompts","responses",<fields>} -> {"rewards"}'
    )
    timeout_s: float | None = key(
        60,
        number(0, open_low=True, nullable=True),
        (
            "wall-clock deadline per batch and function (HTTP: retries included); past it the batch gets the fallback "
            "(reason timeout); null: no limit"
        ),
    )
    workers: int = key(
        0,
        NONNEG_INT,
        (
            "0: each batch in a child forked from this process, killed at the deadline (with timeout_s null: in this "
            "thread); N: N warm processes, killed at the deadline"
        ),
    )
    fallback: float = key(
        0.0, number(), "the reward of a batch whose function raised / timed out / failed over HTTP, and of a non-finite value"
    )
    retries: int = key(2, NONNEG_INT, "HTTP: retries after a failed POST, with exponential backoff")
    backoff_s: float = key(0.5, NONNEG, "HTTP: first retry delay, doubling")


@dataclass
class Val:
    """``val``: validation every ``trainer.val_every`` steps: held-out task prompts (``val/acc``, pass@k) and
    real benchmarks through the eval harness."""

    prompts: int = key(128, NONNEG_INT, "held-out task prompts for val/acc (built-in tasks)")
    temperature: float = key(0.0, NONNEG, "0 = greedy")
    pass_k: int = key(
        0, NONNEG_INT, "> 0: also sample pass_k responses per prompt at the rollout temperature: val/pass@1, val/pass@<k>"
    )
    top_p: float = key(1.0, OPEN_PROB, "nucleus sampling of validation's samples (with temperature > 0)")
    max_new_tokens: int | None = key(
        None, integer(1, nullable=True), "null = rollout.max_new_tokens (held-out prompts and benchmarks alike)"
    )
    benchmarks: list[str] = key(
        [],
        STR_LIST,
        (
            "real benchmarks through the eval harness, e.g. [math500] (logged as val/<bench>/avg@<n>); with tools on, "
            "sampled through the run's tool driver (val/<bench>/tools/calls/mean, ...)"
        ),
    )
    n_samples: int = key(1, POS_INT, "samples per problem of val.benchmarks (val/<bench>/avg@<n>)")
    limit: int | None = key(32, integer(1, nullable=True), "only the first N problems of each of val.benchmarks; null = all")
    prompt: str = key(
        "boxed",
        STR,
        'the prompt of val.benchmarks\' problems, as eval.prompt: boxed ("... within \\boxed{}") | dapo ("Answer: $Answer") | native',
    )
    chat_template: Any = key(
        "auto", owned("evals/ (auto, or what model.chat_template accepts)"), "val.benchmarks' prompts as eval.chat_template"
    )
    batch_size: int = key(16, POS_INT, "val.benchmarks: sequences per generate() call")
    data_root: str | None = key(
        None, OPT_STR, "where val.benchmarks' files are read, as eval.data_root (null: $ENTROPYRL_DATA, else packaged)"
    )


@dataclass
class Reflection:
    """``diagnostics.reflection``: long chain-of-thought metrics of each step's responses (docs/long-cot.md)."""

    words: Any = key(
        "default",
        owned("trainers/stats/reflection.py (default, orz, oat_zero, or a list of words)"),
        (
            "reflection words/phrases, matched case-insensitively on word boundaries: default (orz + oat_zero) | orz "
            "(wait, recheck, retry, alternatively, however) | oat_zero (recheck, rethink, try again, ...) | a list, e.g. "
            "\"[wait,'try again']\"; []: no reflection/* metrics (repetition and lengths stay)"
        ),
    )
    repetition_n: int = key(4, POS_INT, "n of the word n-grams of repetition/score/mean (1 - distinct/total n-grams)")
    entropy: bool = key(
        True,
        BOOL,
        (
            "reflection/entropy_first|at|before|all, surprisal_*, frac/adv_pos|neg: the words mapped onto response tokens"
            " (one cached decode per distinct token id)"
        ),
    )
    workers: int = key(
        1,
        NONNEG_INT,
        (
            "processes that find each response's words and repetition while its reward is computed "
            "(rewards/text_facts.py); 0: in the process that scores"
        ),
    )


@dataclass
class Diagnostics:
    """``diagnostics``: what each step measures about entropy beyond the loss: the four quadrants, the realised and
    predicted entropy change on a held-out probe, the attribution, token-entropy quantiles, reflection."""

    quadrants: bool = key(
        True,
        BOOL,
        (
            "four-quadrant entropy diagnostics every step, with the first-order prediction (one extra autograd.grad per "
            "micro-batch; false: neither; docs/algorithms.md §6)"
        ),
    )
    entropy_change: bool = key(
        False, BOOL, "realised entropy change of each update on a fixed held-out probe batch (one extra forward)"
    )
    probe_prompts: int = key(32, POS_INT, "held-out prompts of the probe batch (entropy_change)")
    probe_responses: int = key(4, POS_INT, "responses sampled per probe prompt, once, then re-scored every step")
    attribution: bool = key(
        False,
        BOOL,
        (
            "entropy_change/predicted_net = sum over the step's optimizer steps k of the trapezoid (g(theta_k) + "
            "g(theta_k+1))/2 . (theta_k+1 - theta_k), g = dH_probe/dtheta, beside the realised probe change, and "
            "predicted_net_1st with g(theta_k) alone (first order); one backward through the probe per optimizer step "
            "plus one; under FSDP the dot products are reduced over shards. Each split into attribution/<part>, "
            "attribution_1st/<part> (momentum, weight_decay, q1-q4, zero_adv, intervention, ...; one process without "
            "FSDP)"
        ),
    )
    attribution_every: int = key(1, POS_INT, "... on steps N, 2N, ... (counted as val_every and save_every count)")
    entropy_quantiles: list[float] | None = key(
        [0.1, 0.5, 0.9, 0.99],
        Rule("float_list", low=0, high=1, open_low=True, open_high=True, nullable=True),
        (
            "entropy/p10, p50, ... of the step's valid response tokens (sampling policy) over every rank's tokens: the "
            "same figures on 1 or N ranks (one all-gather of 4 bytes a token and one sort per step); null: none"
        ),
    )
    reflection: Reflection = section(Reflection)


@dataclass
class TrainSchema:
    """The keys ``conf/train.yaml`` itself owns (``output_dir`` and the sections below)."""

    output_dir: str = key(
        "outputs/train/${now:%Y%m%d-%H%M%S}-${algo.name}-s${trainer.seed}",
        FOLDER,
        (
            "Where checkpoints, metrics.jsonl, summary.json and plots go. A fresh folder per run by default; pass an "
            "existing one to resume it (see trainer.resume)."
        ),
    )
    trainer: Trainer = section(Trainer)
    optim: Optim = section(Optim)
    model: TrainModel = section(TrainModel)
    reward: Reward = section(Reward)
    val: Val = section(Val)
    diagnostics: Diagnostics = section(Diagnostics)
