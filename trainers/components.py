"""The pieces a training run is made of, each built on its own from a composed ``train`` config.

``GRPOTrainer.__init__`` (trainers/trainer.py) sets them up one by one, in this order; anything
that needs only some of them (the lab's quadrant experiment, a test) builds those alone, without
a trainer, an output folder, an MLflow check or an optimizer:

    check_batches(cfg, dist); check_tracking(cfg)      # refuse a bad run before loading a model
    seed_everything(cfg.trainer.seed)
    model, tokenizer = build_policy(cfg, dist)          # the policy, on its device, FSDP-wrapped
    source = build_source(cfg, tokenizer)               # prompts and their verifiable rewards
    rewards = build_rewards(cfg, source)                # reward.functions / reward.url, else the source's
    algo = build_algorithm(cfg)                         # advantages, loss, interventions
    ref_model = build_reference(cfg, dist)              # when the algorithm needs one (KL)
    optimizer = build_optimizer(model.parameters(), cfg.optim)       # trainers/optim.py
    scheduler = build_scheduler(optimizer, cfg.optim, total_steps)
    rollout = build_engine(cfg, model, tokenizer)       # rollout/base.py; with tools, rollout/multi_turn.py
    tracker = build_tracker(cfg, output_dir, dist)      # MLflow + metrics.jsonl on rank 0

``collect_rollouts`` (trainers/collect.py) samples and scores one batch from the source, rollout
engine and algorithm.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from ..core.alive import still_working
from ..core.errors import UserError
from ..core.mlflow_store import resolve_uri
from ..core.tracking import RunTracker, TrackingSettings, check_reachable
from ..evals.code.tool_executor import build_tool_executor
from ..evals.grading.answer_extraction import extract_answer
from ..models.loading import load_policy
from ..models.lora import apply_lora
from ..rewards import RewardRunner, build_reward_runner
from ..rollout.base import build_rollout
from ..rollout.multi_turn import ToolRollout, calls_limit_note
from ..rollout.settings import SamplingSettings, ToolSettings
from .algos.algorithm import Algorithm
from .data.prompts_source import build_prompt_source
from .parallel import distributed

__all__ = [
    "check_batches",
    "check_tracking",
    "seed_everything",
    "build_policy",
    "build_source",
    "build_algorithm",
    "build_reference",
    "build_tracker",
    "stats_kwargs",
    "build_policy_and_adapter",
    "build_rewards",
    "build_engine",
]


def check_batches(cfg, dist) -> None:
    """``UserError`` when the batch sizes cannot be split into mini-batches and ranks."""
    t = cfg.trainer
    if t.prompts_per_step % t.mini_batch_prompts:
        raise UserError(
            f"trainer.prompts_per_step ({t.prompts_per_step}) must be a multiple of "
            f"trainer.mini_batch_prompts ({t.mini_batch_prompts})"
        )
    distributed.check_batch_sizes(t, dist)


def check_context(cfg, model, source) -> None:
    """``UserError`` when a response cannot fit the policy's context (``max_position_embeddings``):
    ``rollout.max_new_tokens`` alone, or with a prompt of the data (a source that reads a file says
    each prompt's tokens: ``prompt_tokens``). Generation past the positions a model was built for
    runs on silently with positions it never saw; the error names the rows and the fix. The HF
    engine's single-turn rollout: vLLM checks its own ``max_model_len``, and the multi-turn driver
    ends a conversation at the context."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if cfg.rollout.name != "hf" or cfg.tools.enabled or not context:
        return
    new, context = int(cfg.rollout.max_new_tokens), int(context)
    if new >= context:
        raise UserError(
            f"rollout.max_new_tokens={new} leaves no room for a prompt in the model's context of {context} "
            f"positions (model.arch.max_position_embeddings): give rollout.max_new_tokens below {context}, or a "
            "model with a longer context"
        )
    over = [(row, n) for row, n in getattr(source, "prompt_tokens", None) or () if n + new > context]
    if over:
        rows = ", ".join(row for row, _ in over[:5]) + (f" and {len(over) - 5} more" if len(over) > 5 else "")
        raise UserError(
            f"data={cfg.data.name}: {len(over)} prompt(s) do not leave rollout.max_new_tokens={new} in the model's "
            f"context of {context} positions (rows {rows}; longest {max(n for _, n in over)} tokens): "
            f"data.max_prompt_length={context - new} leaves them out (counted), or give a smaller "
            "rollout.max_new_tokens or a model with a longer context"
        )


def check_tracking(cfg) -> None:
    """``UserError`` when tracking is on and its store cannot be reached: before minutes of model
    loading, not after."""
    if TrackingSettings.from_config(cfg.tracking).enabled:
        check_reachable(resolve_uri(cfg.tracking))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _on_device(model, cfg, dist, *, trainable: bool):
    model.to(dist.device)
    if not trainable:
        model.eval().requires_grad_(False)
    return distributed.prepare_model(model, cfg.trainer, dist, trainable=trainable)  # FSDP2 / checkpointing


def build_policy_and_adapter(cfg, dist, log=print):
    """``(model, tokenizer, lora)``: the policy on this rank's device with ``model.lora``'s adapter
    injected (``lora``: its ``models.lora.LoraPolicy``, None without LoRA), sharded under FSDP."""
    model, tokenizer = load_policy(cfg.model, cfg.data, log=log)
    model.to(dist.device)
    model.config.use_cache = True
    lora = apply_lora(model, cfg.model, log=log)  # before FSDP wraps the layers
    return distributed.prepare_model(model, cfg.trainer, dist), tokenizer, lora


def build_policy(cfg, dist, log=print):
    """``(model, tokenizer)``: the policy on this rank's device (with its LoRA adapter when
    ``model.lora.rank`` is set), sharded under FSDP."""
    model, tokenizer, _lora = build_policy_and_adapter(cfg, dist, log=log)
    return model, tokenizer


def build_rewards(cfg, source=None, log=print) -> RewardRunner:
    """The reward of ``cfg.reward`` (``rewards/runner.py``); ``bind(source)`` once the source exists."""
    return build_reward_runner(cfg.get("reward"), source, log=log)


def build_reference(cfg, dist, log=print):
    """A frozen copy of the starting policy (the KL reference), on this rank's device."""
    model, _ = load_policy(cfg.model, cfg.data, log=log)
    return _on_device(model, cfg, dist, trainable=False)


def build_source(cfg, tokenizer, log=print):
    """The prompt source of ``cfg.data``: training prompts, held-out prompts, rewards. What the source
    has to say about its data (columns read, rows left out) is logged once, here."""
    with still_working(log, f"data={cfg.data.name}: reading and checking the problems"):
        source = build_prompt_source(cfg.data, int(cfg.trainer.seed), tokenizer=tokenizer)
    if hasattr(source, "log"):  # a source's warnings during the run (grading it could not decide)
        source.log = log
    for note in getattr(source, "notes", []):
        log(note)
    asked = int(cfg.val.prompts or 0)
    held = len(source.validation(asked)) if asked else 0
    on_training = bool(getattr(source, "validates_on_training", False))
    if asked and on_training:  # data.holdout=0: val/acc is measured on problems the run trains on
        log(
            f"val: val.prompts={asked} validates on {held} of the problems it trains on (data.holdout=0): val/acc is "
            f"not a held-out score; set data.holdout=N to keep N problems out of training for it"
        )
    elif held < asked:
        log(
            f"val: validating on {held} problem(s), not val.prompts={asked}: the data's validation set holds "
            f"{held} (raise data.holdout, or set val.prompts={held})"
        )
    return source


def build_algorithm(cfg) -> Algorithm:
    """The algorithm of a ``train`` config (``Algorithm.from_train_config``: ``algo.*``, with
    ``rollout.tis.enabled`` also the truncated-IS intervention); checks every value."""
    return Algorithm.from_train_config(cfg)


def build_tracker(cfg, output_dir: Path, dist, log=print):
    """MLflow + metrics.jsonl on the main rank; a tracker that does nothing on the others."""
    return RunTracker(cfg.tracking, Path(output_dir), log=log) if dist.is_main else distributed.NullTracker()


def stats_kwargs(cfg) -> dict:
    """Keyword arguments of the token statistics (``stats/policy_stats.py``) for this config. The body
    runs under autocast where ``trainer.dtype=bfloat16`` is not FSDP's (``trainer.fsdp=false``, one
    process: ``parallel/process_group.py``); under FSDP its mixed-precision policy casts instead."""
    autocast = str(cfg.trainer.dtype) == "bfloat16" and str(cfg.trainer.fsdp).lower() in ("false", "0", "no")
    return dict(
        temperature=float(cfg.rollout.temperature),
        chunk_size=int(cfg.trainer.token_chunk_size),
        share_prompts=bool(cfg.trainer.share_prompt_forward),
        body_dtype=torch.bfloat16 if autocast else None,
    )


def build_engine(cfg, model, tokenizer, log=print):
    """The rollout engine ``cfg.rollout``; with ``tools.enabled`` wrapped in the multi-turn driver
    (``rollout/multi_turn.py``) whose calls run in the code sandbox (``evals/code/tool_executor.py``).
    Both sections are read here once, into ``SamplingSettings`` and ``ToolSettings``; a
    ``tools.max_calls`` that its turns cannot reach is said (``calls_limit_note``)."""
    sampling = SamplingSettings.from_config(cfg.rollout)
    engine = build_rollout(sampling, model, tokenizer)
    tools = ToolSettings.from_config(cfg.get("tools"))
    if not tools.enabled:
        return engine
    if (note := calls_limit_note(tools)) is not None:
        log(note)
    return ToolRollout(engine, tools, build_tool_executor(cfg.tools), sampling, final_answer=extract_answer)
