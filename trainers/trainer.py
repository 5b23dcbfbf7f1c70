"""The GRPO-family training recipe, readable top to bottom.

One training step (``train_step``):
  1. sample ``prompts_per_step`` prompts and ``rollout.n`` responses each (``collect``);
  2. score them with the reward (``reward.functions``, else the data's verifier: rewards/; DAPO
     overlong shaping when enabled); dynamic sampling drops all-equal groups and keeps generating
     until the batch is full (``collect.py``);
  3. recompute the sampling policy's log-probs and entropy (no grad): ``old_logp``, ``H``;
  4. the controllers read the batch entropy (STARE's gate, adaptive schedules) and the group
     advantages are computed (3-4: ``_score``); the observers of the scored batch log its diagnostics;
  5. ``ppo_epochs`` passes of mini-batch updates of the clipped surrogate (with the entropy
     interventions), accumulated over micro-batches; the lr schedule advances a step (``_update``);
  6. metrics to MLflow + metrics.jsonl, periodic validation and atomic checkpoints (``fit``).

With ``trainer.staleness=k >= 1`` steps 1-2 run in a rollout worker process (``async_rollout.py``) on weights at most
``k`` steps old while the trainer does steps 3-6 of the batch before, publishing its weights after every step
(docs/async.md). The step travels as one ``StepBatch`` (``algos/step_batch.py``: stamped with its policy version,
sliced with ``batch[idx]`` per mini- and micro-batch); diagnostics that need extra gradients observe its moments
(``stats/observers.py``).

Beside the recipe, in ``run/``: the observers' set-up (``step_observers.py``); save and resume (``checkpointer.py``,
under staleness with the batches each rank drew ahead: ``pending.py``, so a resumed run trains what the uninterrupted
one would); the loop's cadence, start, failure lines and summary fields (``bookkeeping.py``); validation
(``validation.py``). ``train(cfg)`` resumes from ``output_dir``'s latest checkpoint (``trainer.resume=auto``).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from ..core.alive import still_working
from ..core.gc_pause import paused_gc
from ..core.heap import trim_heap
from ..core.resources import ThreadBudget
from ..core.tracking import read_metrics
from ..rollout.base import Rollout
from . import components
from .algos.algorithm import Algorithm
from .algos.loss_agg import part_weight as accumulation_weight  # a micro-batch's share of its mini-batch loss
from .algos.step_batch import StepBatch
from .async_rollout import AsyncRollouts, async_step_metrics, check_async
from .collect import CollectSettings, collect_rollouts
from .data import micro_batches
from .data.first_pass import KeptPass, epoch_orders, sampling_stats
from .optim import advance_scheduler, build_optimizer, build_scheduler
from .parallel import distributed
from .preflight import TrainingCheck, check_training
from .run import bookkeeping, run_dir
from .run import samples as run_samples
from .run.bookkeeping import RunPlan, record_config, run_failure, start_run, stopped_message, summary_fields
from .run.checkpointer import Checkpointer
from .run.overview import overview_metrics
from .run.run_report import TrainingProgress, write_run_report
from .run.step_observers import build_step_observers
from .run.stop_signals import RunInterrupted, StopSignals, stop_during_setup
from .run.validation import validation_metrics
from .settings import StepSettings
from .stats.policy_stats import batch_token_stats, response_token_stats
from .stats.reflection import reflection_settings
from .stats.tool_stats import step_loss_mask
from .stats.update_tokens import UpdateTokenStats, entropy_quartile_edges


class GRPOTrainer:
    def __init__(self, cfg: DictConfig, log=print, *, algo: Algorithm | None = None, run_mode: str | None = None):
        """Set up the run's components one by one (each buildable alone: ``trainers/components.py``).

        ``algo`` and ``run_mode``: what ``check_training`` already built and decided (so the checks
        run once per command); without them the trainer runs those checks itself."""
        self.cfg = cfg
        t = cfg.trainer
        # everything the step methods read, taken from the config once (trainers/settings.py)
        self.settings = StepSettings.from_config(cfg)
        self.output_dir = Path(cfg.output_dir)
        # trainer.threads, else the CPUs left to this job (affinity, quota, jobs and load beside it)
        self.threads = ThreadBudget(t.threads)
        # torchrun / SLURM ranks, this rank's device, FSDP or not (trainers/parallel/distributed.py)
        self.dist = distributed.setup(t)
        self.log = log if self.dist.is_main else (lambda *_a, **_k: None)
        self.nodes = distributed.node_names(self.dist)  # by rank, for summary.json
        # every algorithm and intervention value checked (and its object built) before anything exists
        self.algo = algo if algo is not None else components.build_algorithm(cfg)
        # the interventions' "acted" metrics, copied into 0_overview/ each step (run/overview.py)
        self.acted_keys = [k for iv in self.algo.interventions if (k := type(iv).acted_key()) is not None]
        # resume / refuse / overwrite what output_dir holds, before minutes of model loading
        self.run_mode = run_dir.settle_output_dir(cfg, run_mode, self.dist.is_main, self.log)
        distributed.barrier(self.dist)
        self.device = self.dist.device
        components.check_batches(cfg, self.dist)
        staleness = check_async(cfg, self.dist)  # trainer.staleness, and where its rollout worker runs
        components.check_tracking(cfg)
        # diagnostics.reflection: the word list (a bad one fails here), repetition n, token mapping
        self.reflect = reflection_settings(cfg)
        # reward.functions / reward.url (else the data's verifier, rewards/runner.py): a reference
        # that does not import or a judge that is down fails here, before the model loads
        self.rewards = components.build_rewards(cfg, log=self.log)
        components.seed_everything(int(t.seed))
        # model.lora: an adapter injected in place, only it trains (models/lora.py); else None
        self.model, self.tokenizer, self.lora = components.build_policy_and_adapter(cfg, self.dist, log=self.log)
        self.source = components.build_source(cfg, self.tokenizer, log=self.log)
        components.check_context(cfg, self.model, self.source)  # prompt + response past the model's positions
        self.rewards.bind(self.source)
        self.ref_model = None  # with LoRA the reference is the adapter disabled (_reference_logp)
        if self.algo.needs_ref and self.lora is None:
            self.ref_model = components.build_reference(cfg, self.dist, log=self.log)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, int(t.total_steps))  # one step per training step
        self.rollout = components.build_engine(cfg, self.model, self.tokenizer, log=self.log)  # tools: multi-turn
        self.tracker = components.build_tracker(cfg, self.output_dir, self.dist, log=self.log)
        self.step, self._kept = 0, KeptPass()  # _kept: the first update pass, forwarded while scoring
        self.val_problems = self.source.validation(int(cfg.val.prompts)) if cfg.val.prompts else []
        # generation, scoring and dynamic sampling of one step (collect.py), bound to this run's parts
        self._collect = functools.partial(
            collect_rollouts,
            CollectSettings.from_config(cfg, reflect=self.reflect),
            source=self.source,
            rollout=self.rollout,
            algo=self.algo,
            dist=self.dist,
            pad_token_id=self.tokenizer.pad_token_id,
            reward_runner=self.rewards,
        )
        # what watches the step without changing it, each only when switched on (run/step_observers.py)
        self.probe, self.observers = build_step_observers(cfg, self, staleness)
        # trainer.staleness >= 1: the batches come from a rollout worker process (async_rollout.py),
        # started at the first step from the (restored) weights; 0: collected here, in turn with training
        self.async_rollouts = AsyncRollouts(cfg, staleness, self.dist, log=self.log) if staleness > 0 else None
        if self.async_rollouts is None:  # the text-metrics workers start while the rest is set up (rewards/text_facts.py)
            self.rewards.start_text_facts(self.reflect.text_facts)
        # save and resume: the trained state, with the worker's batches drawn ahead (run/checkpointer.py)
        self.checkpointer = Checkpointer(self.output_dir, self.settings, self.dist, self.tokenizer, self.log)

    def close(self) -> None:
        """Stop the rollout worker, a rollout engine that runs apart (vLLM) and the reward's workers,
        and leave the process group we created."""
        for part in (self.async_rollouts, self.rollout, self.rewards):  # None, or an engine with nothing to stop
            if getattr(part, "close", None) is not None:
                part.close()
        distributed.cleanup(self.dist)

    # -- resume / checkpoint ----------------------------------------------------------------
    def maybe_resume(self) -> int | None:
        """Continue from ``output_dir``'s latest intact checkpoint when this run resumes one (as
        ``run_dir.check_output_dir`` decided): its step, else None (``run/checkpointer.py``)."""
        resumed = self.checkpointer.resume(self) if self.run_mode == "resume" else None
        self.step = self.step if resumed is None else resumed
        return resumed

    def save(self) -> Path | None:
        """This step's checkpoint, every rank taking part; its path on rank 0 (``run/checkpointer.py``)."""
        return self.checkpointer.save(self.step, self)

    # -- rollouts ---------------------------------------------------------------------------
    def collect(self) -> tuple[StepBatch | None, dict]:
        """This step's batch (``collect.collect_rollouts``): ``(StepBatch of the responses with their
        rewards, correct and group ids, or None when nothing was kept; metrics)``; under
        ``trainer.staleness`` the rollout worker's batch for this step, with its ``async/*`` metrics."""
        if self.async_rollouts is not None:  # stamped with the version the worker generated it from
            return self.async_rollouts.next_batch(self.model, self.step)
        batch, metrics = self._collect(step=self.step)
        return (None if batch is None else batch.with_(policy_version=self.step)), metrics

    def _reference_logp(self, roll: Rollout, rows_per_chunk: int, stats_kw: dict) -> torch.Tensor | None:
        """Log-probs under the KL reference: the reference model, or with LoRA the policy with its
        adapter disabled; None when the algorithm has no KL term."""
        if self.ref_model is not None:
            return batch_token_stats(self.ref_model, roll, rows_per_chunk, **stats_kw)[0]
        if self.lora is not None and self.algo.needs_ref:
            with self.lora.reference() as base:
                return batch_token_stats(base, roll, rows_per_chunk, **stats_kw)[0]
        return None

    # -- one training step ------------------------------------------------------------------
    def train_step(self, collected: tuple[StepBatch | None, dict] | None = None) -> dict[str, float]:
        """One step; ``collected`` (what ``collect`` returns) skips generation, e.g. to replay a fixed batch."""
        started = time.perf_counter()
        batch, metrics = collected if collected is not None else self.collect()
        metrics = dict(metrics)
        gen_time = time.perf_counter() - started
        if batch is None:  # every group was all-equal: nothing to learn from this step
            self._advance_schedule(metrics)
            metrics.update({"time/step": time.perf_counter() - started, "skipped": 1.0})
            return distributed.mean_metrics(metrics, self.dist)
        if self.async_rollouts is not None:  # the worker's entropy of its batch, which the controllers may read
            batch = batch.with_(behaviour_entropy=metrics.get("async/entropy_behaviour", float("nan")))
        for observer in self.observers:
            observer.begin_step(self.model, self.step)
        batch = self._score(batch, metrics)
        scored = [observer.after_score(batch, metrics) for observer in self.observers]  # metrics read-only
        metrics.update({k: v for found in scored for k, v in found.items()})
        batch = self.algo.select(batch, "batch")
        if self.dist.is_main and run_samples.samples_due(self.step + 1, self.settings.samples_every):
            self._write_samples(batch)
        self._update(batch, metrics)
        self.algo.end_step(reduce=lambda t: distributed.sum_across(t, self.dist))
        self.rollout.sync_weights()
        for observer in self.observers:  # the prediction, the probe's realised change, the attribution
            metrics.update(observer.end_step(self.model))
        metrics["time/generate"] = gen_time
        metrics["time/step"] = time.perf_counter() - started
        if "tools/seconds" in metrics:  # share of the step's wall time spent running tool calls
            metrics["tools/time_frac"] = metrics["tools/seconds"] / max(metrics["time/step"], 1e-9)
        if self.async_rollouts is not None:  # time/generate was the wait for the worker's queue
            metrics.update(async_step_metrics(metrics, len(batch)))
        return distributed.mean_metrics(metrics, self.dist)  # averaged over ranks (identity on one)

    def _score(self, batch: StepBatch, metrics: dict) -> StepBatch:
        """Steps 3-4: the loss mask, the sampling policy's token statistics, the controllers and the
        advantages, filled into the step batch (before its batch-scope selections)."""
        s, roll, reduce = self.settings, batch.responses, lambda t: distributed.sum_across(t, self.dist)
        # tool outputs, responses the tool switches or DAPO's overlong filter leave out (stats/tool_stats.py)
        mask, left_out = step_loss_mask(roll, s.tool_switches, overlong=s.overlong_filter, device=self.device)
        metrics.update(left_out)
        wanted = self.algo.sampling_vocab_stats()  # SIREN's anchor: the first batch's top-p entropies
        old_logp, entropy, sampled, self._kept = sampling_stats(
            self.model, batch, s, self.algo, step=self.step, dist=self.dist, vocab_stats=wanted
        )
        if sampled:
            self.algo.observe_sampling(sampled[0], mask, reduce=reduce)
        ref_logp = self._reference_logp(roll, s.micro_batch_responses, s.stats)
        sampler_logp = None if roll.sampling_logp is None else roll.sampling_logp.to(self.device) * mask
        metrics["entropy"] = distributed.masked_mean_across(entropy, mask, self.dist)
        # the controllers read this batch's entropy under the current policy, or under staleness the
        # behaviour policy's (algo.controller_entropy; the worker's, every rank's tokens)
        self.algo.begin_step(self.algo.controller_reading(metrics["entropy"], batch.behaviour_entropy))
        rewards, group_ids = batch.rewards.to(self.device), batch.group_ids.to(self.device)
        advantages = self.algo.advantages(rewards, group_ids, mask, entropy=entropy)
        metrics.update(self.algo.step_metrics())
        return batch.with_(
            mask=mask, old_logp=old_logp, entropy=entropy, sampler_logp=sampler_logp, ref_logp=ref_logp, advantages=advantages
        )

    def _write_samples(self, batch: StepBatch) -> None:
        """A few of this step's responses with prompt, reward and mean token entropy: appended to
        ``samples.jsonl`` and queued to MLflow (``run/samples.py``)."""
        s = self.settings
        shown = dict(group_size=s.rollout_n, rows=s.samples_rows, matcher=self.reflect.matcher, tools_cfg=s.tools)
        path = run_samples.write_step_samples(self.output_dir, self.step + 1, batch, self.tokenizer, **shown)
        self.tracker.log_artifact(path, "samples")

    def _update(self, batch: StepBatch, metrics: dict) -> None:
        """Step 5: ``ppo_epochs`` passes of mini-batch updates (slice -> statistics -> loss -> backward,
        accumulated over micro-batches -> clip -> step), then the lr schedule moves on by one step.
        The observers see each micro-batch loss before its backward and each optimizer step."""
        s = self.settings
        loss_metrics: dict[str, list[float]] = defaultdict(list)
        rows, agg = len(batch), self.algo.loss_agg
        orders = epoch_orders(rows, s.seed, self.step)  # one shuffle of the rows per epoch
        # beside the loss: clipped / corrected tokens by the step's entropy quartile, and under
        # staleness the log-prob gaps between behaviour, proximal and current policy (stats/update_tokens.py)
        token_stats = UpdateTokenStats(
            entropy_quartile_edges(batch.entropy, batch.mask), logp_gaps=self.async_rollouts is not None
        )
        self.model.train()
        grad_norms, kept, self._kept = [], self._kept, KeptPass()  # the scoring pass's graph, taken once
        for _epoch in range(s.ppo_epochs):
            order = next(orders)
            for m_start in range(0, rows, s.mini_batch_rows):
                mini = self.algo.select(
                    batch[order[m_start : m_start + s.mini_batch_rows]],
                    "mini",
                    gather=lambda tensors: distributed.gather_rows(tensors, self.dist),
                )  # scope global
                self.optimizer.zero_grad(set_to_none=True)
                dp_scale = distributed.loss_scale(agg, mini.mask, self.dist)  # 1.0 on one process
                objective = 0.0
                for local in micro_batches.passes(mini.responses, s, self.dist):
                    pairing = len(local) == 0  # only to pair this rank's collectives with the others'
                    part = mini[torch.zeros(1, dtype=torch.long) if pairing else local]
                    micro = micro_batches.pass_rows(part, s)  # trimmed to its width under a token budget
                    logp, ent, *vocab = kept.take(order[m_start : m_start + s.mini_batch_rows][local]) or response_token_stats(
                        self.model,
                        micro.responses,
                        entropy_grad=self.algo.needs_entropy_grad,
                        vocab_stats=self.algo.vocab_stats(),
                        **s.stats,
                    )
                    vocab = vocab[0] if vocab else None
                    out = self.algo.micro_loss(micro, logp=logp, entropy=ent, vocab=vocab)
                    weight = 0.0 if pairing else accumulation_weight(agg, part.mask, mini.mask) * dp_scale
                    if not pairing:
                        for observer in self.observers:  # before the backward frees the graph, and before
                            # after_loss advances the interventions' state (Clip-Cov's draw, EntroPIC's integral)
                            observer.on_micro_loss(self.algo, micro, out, (logp, ent, vocab), weight)
                        self.algo.after_loss(out)
                        token_stats.add(out.tokens)
                    (out.loss * weight).backward()
                    objective += float(out.loss.detach()) * weight
                    for k, v in ({} if pairing else out.metrics).items():
                        loss_metrics[k].append(float(v))
                loss_metrics["loss/objective"].append(objective)  # the mini-batch loss minimised
                grad_norms.append(distributed.clip_grad_norm(self.model, s.grad_clip))
                with ExitStack() as around:  # e.g. the attribution's split and prediction of this update
                    for observer in self.observers:
                        around.enter_context(observer.around_optimizer_step(self.model, self.optimizer, grad_norms[-1]))
                    self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # spent: the next step's scoring pass builds its graph without them
        self._advance_schedule(metrics)
        metrics.update({k: float(np.nanmean(v)) for k, v in loss_metrics.items()})
        metrics.update(token_stats.metrics())
        metrics["grad_norm"] = float(np.mean(grad_norms))

    def _advance_schedule(self, metrics: dict) -> None:
        """Log the lr this step used (``lr``) and move the schedule on by one training step."""
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        advance_scheduler(self.scheduler)

    # -- validation -------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """The ``val/*`` metrics: held-out prompts and benchmarks (``run/validation.py``); minutes on a CPU."""
        with still_working(self.log, f"validation after step {self.step}"):  # a line every 30 s meanwhile
            return validation_metrics(self.model, self.tokenizer, self.rollout, self.source, self.val_problems, self.settings)

    # -- the run ----------------------------------------------------------------------------
    def fit(self) -> dict:
        with StopSignals(self.log) as stop:  # SIGINT/TERM/USR1/USR2: stop at a step boundary, checkpointed (stop_signals.py)
            return self._fit(stop)

    def _fit(self, stop: StopSignals) -> dict:
        """Resume, then train step by step until ``trainer.total_steps`` or a stop signal: publish the
        weights to the rollout worker, validate, log, checkpoint; a failure ends in one line
        (``run/bookkeeping.py``), and every ending writes the summary (``_finish``)."""
        plan = RunPlan.from_config(self.cfg.trainer)  # total steps, validation and checkpoint cadence
        with bookkeeping.lost_peer_is_one_line(self.cfg, "before its first step"):  # resuming, opening the records
            resumed = self.maybe_resume()
            start_run(self.cfg, self.tracker, self.dist, resumed=resumed, step=self.step, log=self.log)
        started, status = time.perf_counter(), "FAILED"
        try:
            record_config(self.cfg, self.tracker, self.dist, resumed=resumed, log=self.log)
            with TrainingProgress(plan.progress and self.dist.is_main, max(plan.total, self.step), self.step) as bar:
                while self.step < plan.total and not stop.agreed(self.dist):
                    metrics = self.train_step()
                    self.threads.refresh()  # follows processes starting or ending beside us
                    self.step += 1
                    if self.async_rollouts is not None:  # the worker's next generations use these weights
                        self.async_rollouts.publish(self.model, self.step)
                    if plan.validates(self.step):
                        metrics.update(self.validate())
                    metrics.update(overview_metrics(metrics, self.acted_keys))  # MLflow's first section
                    self.tracker.log_metrics(self.step, metrics)
                    bar(self.step, metrics)
                    if plan.saves(self.step):
                        with stop.finishing(f"the checkpoint of step {self.step}"):  # never cut in half
                            self.save()
            if stop.requested is not None and self.step < plan.total:
                if self.step > self.checkpointer.saved_step:  # a step boundary: model, optimizer and RNG agree
                    with stop.finishing(f"the checkpoint of step {self.step}"):
                        self.save()
                raise RunInterrupted(stop.requested)
            status = "FINISHED"
        except (KeyboardInterrupt, SystemExit):  # a stop signal, or submitit exiting for a preemption requeue
            status = "KILLED"
            raise
        except (OSError, RuntimeError, MemoryError) as exc:  # storage, a lost rank, out of memory: one line
            error = run_failure(exc, self.cfg, self.dist, self.device, step=self.step, saved_step=self.checkpointer.saved_step)
            if error is None:
                raise
            raise error from None
        finally:
            with stop.finishing():
                summary = self._finish(started, status)
            if status == "KILLED":
                self.log(stopped_message(self.step, plan.total, self.checkpointer.saved_step, self.output_dir))
        return summary

    def _finish(self, started: float, status: str) -> dict:
        """The run's summary; rank 0 also writes ``summary.json``, the figures and the artifacts."""
        fields = functools.partial(summary_fields, self.cfg, status, self.step, self.dist, self.tracker, self.nodes, started)
        self._kept = KeptPass()  # a failed step's kept forward and its graph let go
        if not self.dist.is_main:
            return fields()
        trim_heap()  # what the steps freed goes back before the figures need memory (core/heap.py)
        return write_run_report(
            read_metrics(self.output_dir), self.cfg, self.output_dir, self.tracker, status, fields(), log=self.log
        )


def train(cfg: DictConfig, log=print, *, checked: TrainingCheck | None = None) -> dict:
    """Run (or resume) the training job described by ``cfg``; returns the summary dict.

    ``checked``: what ``check_training(cfg)`` returned, when the caller ran it (the CLI, before it prints);
    else it runs here. Raises ``UserError`` for a bad value or an output_dir this run may not use (before
    anything is created), ``RunInterrupted`` (a ``KeyboardInterrupt``) when a signal stopped it."""
    checked = checked if checked is not None else check_training(cfg)
    with run_dir.run_folder(cfg):  # one writer per output_dir, until the summary is written (run_lock)
        # set-up (the model classes' imports, the model): no cycle collection meanwhile; a stop ends it at once
        with paused_gc(), bookkeeping.lost_peer_is_one_line(cfg, "during set-up"), stop_during_setup():
            trainer = GRPOTrainer(cfg, log=log, algo=checked.algo, run_mode=checked.run_mode)
        try:
            return trainer.fit()
        finally:
            trainer.close()
