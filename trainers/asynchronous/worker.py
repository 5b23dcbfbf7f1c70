"""The rollout worker process (``rollout_worker``): a spawned process that builds its own copy of
the policy, tokenizer, prompt source, rewards and engine from the run's config
(``trainers/components.py``) and produces one ``StaleBatch`` per step, behind the staleness gate,
from the weights the trainer publishes. It ignores SIGINT and SIGTERM (the trainer owns shutdown)
and exits when its parent is gone. ``rollout_worker`` is the process's target: a spawned child
imports it by this module's path."""

from __future__ import annotations

import dataclasses
import os
import queue as queue_errors
import time
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import OmegaConf

from ...core.helper_process import (
    end_process_group,
    ignore_group_stop_signals,
    lead_own_process_group,
    parent_alive_check,
)
from ...core.resources import ThreadBudget
from .. import components
from ..collect import CollectSettings, collect_rollouts
from ..parallel import distributed
from ..stats.policy_stats import batch_token_stats, masked_mean
from .channel import _LOCK_BOUND_S, _POLL_S, StaleBatch, WeightChannel, WorkerFailed

__all__ = ["rollout_worker"]


def rollout_worker(cfg_yaml: str, weights: WeightChannel, out, stop, first_step: int, staleness: int) -> None:
    """The worker process: build the run's parts from ``cfg_yaml``, then produce one ``StaleBatch``
    per step from ``first_step`` on into ``out`` until ``stop`` is set or the parent is gone."""
    # a Ctrl-C or a scheduler's SIGTERM to the process group is the trainer's to handle (a step
    # boundary), where it stops us; parent_alive() is False once we are re-parented (the trainer is gone)
    ignore_group_stop_signals()
    lead_own_process_group()  # what the worker starts (vLLM's engine process) is ended with it: client.close
    parent_alive = parent_alive_check()
    step, engine = first_step, None
    try:
        cfg = OmegaConf.create(cfg_yaml)
        parts = _build_parts(cfg)
        engine = components.build_engine(cfg, parts.model, parts.tokenizer, log=lambda _m: None)  # said by the trainer
        collect = CollectSettings.from_config(cfg)  # what each batch reads from the config, read once
        stats_kw, rows_per_chunk = components.stats_kwargs(cfg), int(cfg.trainer.micro_batch_responses)
        loaded, idle, ready_before = -1, 0.0, time.perf_counter()
        while not stop.is_set():
            waited = time.perf_counter()
            while weights.version.value < step - staleness:  # the staleness gate
                if stop.wait(0.002) or not parent_alive():
                    return
            if weights.version.value != loaded:
                loaded = weights.load_into(parts.model, alive=parent_alive)
                if loaded is None:
                    raise RuntimeError(f"could not take the weights' lock in {_LOCK_BOUND_S:.0f} s")
                engine.sync_weights()  # an engine holding its own copy (vLLM) gets them too
            idle += time.perf_counter() - waited
            batch, metrics = collect_rollouts(
                collect,
                source=parts.source,
                rollout=engine,
                algo=parts.algo,
                dist=parts.dist,
                pad_token_id=parts.tokenizer.pad_token_id,
                step=step,
                reward_runner=parts.rewards,
            )
            batch, behaviour_entropy = _with_behaviour_stats(parts.model, batch, metrics, rows_per_chunk, stats_kw)
            ready = time.perf_counter()
            item = StaleBatch(step, loaded, (batch, metrics), behaviour_entropy, idle, ready - ready_before)
            ready_before = ready
            if not _send(out, item, stop, parent_alive):
                return
            idle = time.perf_counter() - ready
            step += 1
    except BaseException as exc:  # noqa: BLE001  (sent to the trainer, which ends the run with it)
        try:
            out.put(WorkerFailed(step, f"{type(exc).__name__}: {exc}"), timeout=5)
        finally:
            raise SystemExit(1) from None
    finally:
        if engine is not None:
            engine.close()  # vLLM's engine process ends with its worker
        if not parent_alive():  # no trainer left to end the group: what the engine left behind ends here
            end_process_group(os.getpid())


@dataclass
class _WorkerParts:
    """What the worker builds from the run's config before its engine."""

    dist: Any
    algo: Any
    rewards: Any
    model: torch.nn.Module
    tokenizer: Any
    source: Any


def _build_parts(cfg) -> _WorkerParts:
    """The worker's own policy, tokenizer, prompt source, rewards and algorithm, on its own thread
    budget and, with several trainer ranks, in the workers' own process group."""
    _quiet_loading()
    ThreadBudget(cfg.trainer.threads)
    dist = distributed.setup(cfg.trainer)  # the workers' own group when the trainer has several ranks
    if dist.world_size > 1:  # a whole model per worker: generation needs no collective
        dist = dataclasses.replace(dist, fsdp=False)
    components.seed_everything(int(cfg.trainer.seed))
    quiet = lambda *_a, **_k: None  # noqa: E731  (the trainer already said what it builds)
    algo = components.build_algorithm(cfg)
    rewards = components.build_rewards(cfg, log=quiet)
    model, tokenizer, _adapter = components.build_policy_and_adapter(cfg, dist, log=quiet)
    if dist.world_size > 1 and str(cfg.trainer.dtype) == "bfloat16":
        model.to(torch.bfloat16)  # the trainer's FSDP computes in bf16; the published float32 weights are cast on load
    source = components.build_source(cfg, tokenizer, log=quiet)
    rewards.bind(source)
    return _WorkerParts(dist, algo, rewards, model, tokenizer, source)


def _with_behaviour_stats(model, batch, metrics: dict, rows_per_chunk: int, stats_kw: dict):
    """``(batch, behaviour entropy)``: the behaviour policy's token log-probs and entropy of the
    samples, the log-probs kept as ``sampling_logp`` where the engine reported none; where it did
    (vLLM), ``metrics`` gets how far its weights are from the ones loaded. NaN entropy without a batch."""
    if batch is None:
        return batch, float("nan")
    roll = batch.responses
    with torch.no_grad():
        logp, entropy = batch_token_stats(model, roll, rows_per_chunk, **stats_kw)
    mask = roll.policy_mask.to(logp.device).float()
    behaviour_entropy = masked_mean(entropy, mask)
    if roll.sampling_logp is None:
        batch = batch.with_(responses=dataclasses.replace(roll, sampling_logp=(logp * mask).cpu()))
    else:  # the engine's own log-probs (vLLM): how far its weights are from the ones loaded
        gap = (roll.sampling_logp.to(logp.device) - logp).abs() * mask
        metrics["async/engine_logp_diff_max"] = float(gap.max()) if gap.numel() else 0.0
    return batch, behaviour_entropy


def _send(out, item: StaleBatch, stop, parent_alive) -> bool:
    """Put ``item`` on the queue, waiting while it is full (the trainer is behind); False, not sent,
    once ``stop`` is set or the trainer is gone."""
    while True:
        try:
            out.put(item, timeout=_POLL_S)
            return True
        except queue_errors.Full:
            if stop.is_set() or not parent_alive():
                return False


def _quiet_loading() -> None:
    """No transformers progress bars in the worker (a spawned process starts with them on; the
    trainer's command turned its own off)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
