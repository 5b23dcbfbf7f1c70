"""The GRPO-family training recipe, readable top to bottom.

One training step:
  1. sample ``prompts_per_step`` prompts and ``rollout.n`` responses each (the policy samples);
  2. score them with the reward (``reward.functions``, else the data's verifier: rewards/; plus
     DAPO overlong shaping when enabled), and with
     dynamic sampling drop all-equal groups and keep generating until the batch is full;
  3. recompute the sampling policy's log-probs and entropy (no grad): ``old_logp``, ``H``;
  4. the algorithm's controllers look at the batch entropy (STARE's gate, adaptive schedules),
     group advantages are computed; the observers of the scored batch log its diagnostics
     (quadrants, entropy quantiles, tool and reflection tokens: ``stats/scored_metrics.py``);
  5. ``ppo_epochs`` passes of mini-batch updates of the clipped surrogate (with the configured
     entropy interventions), gradient accumulation over micro-batches; then the lr schedule
     (``optim.scheduler``) advances by one step;
  6. metrics to MLflow + metrics.jsonl, periodic validation and atomic checkpoints.

With ``trainer.staleness=k >= 1`` steps 1-2 run in a rollout worker process
(``async_rollout.py``) on weights at most ``k`` steps old, while the trainer does steps 3-6 of the
batch before; the trainer publishes its weights after every step (docs/async.md).

The step travels as one ``StepBatch`` (``algos/step_batch.py``), sliced with ``batch[idx]`` per
mini- and micro-batch; the loss returns what it computed, and the diagnostics that need extra
gradients (``diagnostics.quadrants``, ``diagnostics.attribution``) are observers of the step's
moments around it (``stats/observers.py``).

``train(cfg)`` resumes from the latest checkpoint in ``output_dir`` when there is one
(``trainer.resume=auto``), continuing the step count and the same MLflow run. Under staleness a
checkpoint also keeps the batches each rank drew from its worker for the next steps, so a resumed
run trains the batches the uninterrupted one would (``async_rollout.py``, ``drain``).
"""

# size: the recipe read top to bottom: set-up, resume and save, the step, the run loop with its failure handling
from __future__ import annotations

import functools
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ..core.gc_pause import paused_gc
from ..core.heap import trim_heap
from ..core.resources import ThreadBudget
from ..core.seeds import shuffle_seed
from ..core.tracking import read_metrics
from ..evals.reflection import TokenPieces
from ..rollout.base import Rollout
from . import components
from .algos.algo_config import tracked_config
from .algos.algorithm import Algorithm
from .algos.core_algos import part_weight
from .algos.step_batch import StepBatch
from .async_rollout import AsyncRollouts, async_step_metrics, check_async
from .collect import CollectSettings, collect_rollouts
from .data import micro_batches
from .optim import advance_scheduler, build_optimizer, build_scheduler, resume_scheduler
from .parallel import distributed
from .preflight import TrainingCheck, check_training
from .run import checkpoint as ckpt
from .run import run_dir
from .run import samples as run_samples
from .run.names import default_run_name
from .run.oom import is_out_of_memory, memory_error
from .run.overview import overview_metrics
from .run.pending import pending_records, restore_pending
from .run.run_report import TrainingProgress, write_run_report
from .run.stop_signals import RunInterrupted, StopSignals
from .run.validation import validation_metrics
from .settings import StepSettings
from .stats.attribution import build_attribution
from .stats.observers import StepObserver, build_observers
from .stats.policy_stats import batch_token_stats, response_token_stats
from .stats.probe import build_probe
from .stats.reflection import reflection_settings
from .stats.scored_metrics import scored_observers
from .stats.tool_stats import step_loss_mask
from .stats.update_tokens import UpdateTokenStats, entropy_quartile_edges


def accumulation_weight(agg: str, micro_mask: torch.Tensor, mini_mask: torch.Tensor) -> float:
    """Scale of one micro-batch's loss so that accumulated gradients equal one pass over the
    mini-batch: the micro-batch's share of the aggregation's own normaliser (valid tokens for
    token-mean, responses for seq-mean-token-mean, 1 for a constant normaliser), as the aggregation
    declared it when registered (``core_algos.register_loss_agg``)."""
    return part_weight(agg, micro_mask, mini_mask)


# ---------------------------------------------------------------------------------------------
# the recipe
# ---------------------------------------------------------------------------------------------
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
        self.run_mode = run_mode if run_mode is not None else run_dir.check_output_dir(cfg)
        if self.run_mode == "overwrite":
            run_dir.clear_previous_run(self.output_dir, is_main=self.dist.is_main, log=self.log)
            self.run_mode = "fresh"
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
        self.token_pieces = TokenPieces.for_tokenizer(self.tokenizer)  # token id -> its text, for reflection positions
        self.rewards.bind(self.source)
        self.ref_model = None  # with LoRA the reference is the adapter disabled (_reference_logp)
        if self.algo.needs_ref and self.lora is None:
            self.ref_model = components.build_reference(cfg, self.dist, log=self.log)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, int(t.total_steps))  # one step per training step
        self.rollout = components.build_engine(cfg, self.model, self.tokenizer)  # with tools: multi-turn
        self.tracker = components.build_tracker(cfg, self.output_dir, self.dist, log=self.log)
        self.step = 0
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
        self._setup_observers(cfg, staleness)
        # trainer.staleness >= 1: the batches come from a rollout worker process (async_rollout.py),
        # started at the first step from the (restored) weights; 0: collected here, in turn with training
        self.async_rollouts = AsyncRollouts(cfg, staleness, self.dist) if staleness > 0 else None
        if self.async_rollouts is None:  # the text-metrics workers start while the rest is set up (rewards/text_facts.py)
            self.rewards.start_text_facts(self.reflect.text_facts)

    def _setup_observers(self, cfg: DictConfig, staleness: int) -> None:
        """What watches the step without changing it, built only when switched on: the entropy
        probe, the attribution of its change, the quadrants' prediction (stats/observers.py), and the
        metrics of the scored batch (stats/scored_metrics.py)."""
        self.probe = build_probe(
            cfg,
            self.source,
            self.rollout,
            lambda model, roll: batch_token_stats(model, roll, self.settings.micro_batch_responses, **self.settings.stats),
        )
        self.attribution = build_attribution(
            cfg,
            self.probe,
            self.dist,
            lambda model, roll: (response_token_stats(model, roll, entropy_grad=True, **self.settings.stats)[1]),
            self.model,
            log=self.log,
        )
        self.observers: list[StepObserver] = build_observers(
            quadrants=self.settings.quadrants, probe=self.probe, attribution=self.attribution
        )
        self.observers += scored_observers(
            eps_low=self.algo.eps_low,
            eps_high=self.algo.eps_high,
            dist=self.dist,
            # under a rollout worker: the entropy the controllers read, and whether it is the worker's
            controller=(self.algo.controller_reading, self.algo.controller_entropy == "behaviour") if staleness > 0 else None,
            entropy_quantiles=self.settings.entropy_quantiles,
            quadrants=self.settings.quadrants,
            tools=bool((cfg.get("tools") or {}).get("enabled", False)),
            reflection=(self.token_pieces, self.reflect.matcher) if self.reflect.token_metrics else None,
        )

    def _stats_kwargs(self) -> dict:
        return dict(self.settings.stats)

    def close(self) -> None:
        """Stop the rollout worker and a rollout engine that runs apart (vLLM), and leave the
        process group we created."""
        if self.async_rollouts is not None:
            self.async_rollouts.close()
        close = getattr(self.rollout, "close", None)
        if close is not None:
            close()
        self.rewards.close()
        distributed.cleanup(self.dist)

    # -- resume / checkpoint ----------------------------------------------------------------
    def maybe_resume(self) -> int | None:
        if self.run_mode != "resume":  # run_dir.prepare_output_dir decided: nothing to continue
            return None
        if self.dist.is_main:
            ckpt.remove_staging(self.output_dir)  # what a save killed mid-write left behind
        found = ckpt.load_latest_intact(self.output_dir, dtype=next(self.model.parameters()).dtype, warn=self.log)
        if found is None:
            return None
        latest, state, weights = found
        if self.lora is not None:  # an adapter checkpoint: the adapter in, the frozen base as it is
            self.lora.load_adapter(latest / "model")
            weights = self.model.state_dict()
        distributed.load_full_state(self.model, self.optimizer, weights, state["optimizer"])
        self.rollout.sync_weights()  # an engine holding its own weights (vLLM) gets the restored ones
        self.algo.load_state_dict(state.get("algo", {}))
        resume_scheduler(self.scheduler, state.get("scheduler"), int(state["step"]))  # none before schedules
        ckpt.set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.log(f"resumed from {latest} (step {self.step})")
        if self.async_rollouts is not None:  # the batches its worker drew ahead (run/pending.py)
            restore_pending(self.async_rollouts, latest, self.step, self.dist.rank, self.log)
        return self.step

    def save(self) -> Path | None:
        # Under FSDP every rank takes part in gathering the full state; rank 0 writes it, with every
        # rank's batches drawn ahead of the next steps under staleness.
        pending = pending_records(self.async_rollouts, self.step, self.dist, self.log)
        model, optimizer = distributed.checkpoint_views(self.model, self.optimizer, self.dist)
        path = None
        if self.dist.is_main:
            export = None
            if self.lora is not None:  # the adapter only; the merged model too on request
                model, export = self.lora.checkpoint_parts(self.settings.lora, self.tokenizer)
            path = ckpt.save_checkpoint(
                self.output_dir,
                self.step,
                model,
                self.tokenizer,
                optimizer,
                extra={"algo": self.algo.state_dict(), "scheduler": self.scheduler.state_dict()},
                keep=self.settings.keep_checkpoints,
                export=export,
                config_text=self.settings.config_yaml,
                objects=pending,
            )
        distributed.barrier(self.dist)
        return path

    # -- rollouts ---------------------------------------------------------------------------
    def collect(self) -> tuple[StepBatch | None, dict]:
        """This step's batch (``collect.collect_rollouts``): ``(StepBatch of the responses with their
        rewards, correct and group ids, or None when nothing was kept; metrics)``; under
        ``trainer.staleness`` the rollout worker's batch for this step, with its ``async/*`` metrics."""
        if self.async_rollouts is not None:
            return self.async_rollouts.next_batch(self.model, self.step)
        return self._collect(step=self.step)

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
        old_logp, entropy, *sampled = batch_token_stats(self.model, roll, s.micro_batch_responses, vocab_stats=wanted, **s.stats)
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
        path = run_samples.write_step_samples(
            self.output_dir,
            self.step + 1,
            batch,
            self.tokenizer,
            group_size=s.rollout_n,
            rows=s.samples_rows,
            matcher=self.reflect.matcher,
            tools_cfg=s.tools,
        )
        self.tracker.log_artifact(path, "samples")

    def _update(self, batch: StepBatch, metrics: dict) -> None:
        """Step 5: ``ppo_epochs`` passes of mini-batch updates (slice -> statistics -> loss -> backward,
        accumulated over micro-batches -> clip -> step), then the lr schedule moves on by one step.
        The observers see each micro-batch loss before its backward and each optimizer step."""
        s = self.settings
        loss_metrics: dict[str, list[float]] = defaultdict(list)
        rows, agg = len(batch), self.algo.loss_agg
        shuffle = torch.Generator().manual_seed(shuffle_seed(s.seed, self.step))
        # beside the loss: clipped / corrected tokens by the step's entropy quartile, and under
        # staleness the log-prob gaps between behaviour, proximal and current policy (stats/update_tokens.py)
        token_stats = UpdateTokenStats(
            entropy_quartile_edges(batch.entropy, batch.mask), logp_gaps=self.async_rollouts is not None
        )
        self.model.train()
        grad_norms = []
        for _epoch in range(s.ppo_epochs):
            order = torch.randperm(rows, generator=shuffle)
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
                    logp, ent, *vocab = response_token_stats(
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
        """The ``val/*`` metrics: held-out prompts and benchmarks (``run/validation.py``)."""
        return validation_metrics(self.model, self.tokenizer, self.rollout, self.source, self.val_problems, self.settings)

    # -- the run ----------------------------------------------------------------------------
    def fit(self) -> dict:
        # SIGINT/SIGTERM/SIGUSR1/2: stop at the next step boundary with a checkpoint (stop_signals.py)
        with StopSignals(self.log) as stop:
            return self._fit(stop)

    def _fit(self, stop: StopSignals) -> dict:
        t = self.cfg.trainer
        resumed = self.maybe_resume()
        total = int(t.total_steps)
        if self.step >= total:
            self.log(
                f"the run is already at step {self.step} (trainer.total_steps={total}): nothing to train; "
                f"raise trainer.total_steps to continue it"
            )
        run_name = self.cfg.tracking.get("run_name") or default_run_name(self.cfg)  # what differs, in the name
        # start-up succeeded: only now the folder gets its MLflow run and config.yaml
        self.tracker.start(tracked_config(self.cfg), run_name, resume_step=resumed)
        if resumed is not None and self.dist.is_main:  # the samples of steps this run redoes
            run_samples.drop_after(self.output_dir, resumed)
        started = time.perf_counter()
        status = "FAILED"
        saved_step = resumed or 0
        try:
            run_dir.check_metrics_record(self.output_dir, resumed, self.log)  # deleted/cut short: rebuilt
            if self.dist.is_main:
                run_dir.atomic_write_text(self.output_dir / "config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True))
            if resumed is None:
                self.tracker.log_artifact(self.output_dir / "config.yaml")
            with TrainingProgress(bool(t.progress) and self.dist.is_main, max(total, self.step), self.step) as bar:
                while self.step < total and not stop.agreed(self.dist):
                    metrics = self.train_step()
                    self.threads.refresh()  # follows processes starting or ending beside us
                    self.step += 1
                    if self.async_rollouts is not None:  # the worker's next generations use these weights
                        self.async_rollouts.publish(self.model, self.step)
                    last = self.step == total
                    if int(t.val_every) > 0 and (self.step % int(t.val_every) == 0 or last):
                        metrics.update(self.validate())
                    metrics.update(overview_metrics(metrics, self.acted_keys))  # MLflow's first section
                    self.tracker.log_metrics(self.step, metrics)
                    bar(self.step, metrics)
                    if last or (int(t.save_every) > 0 and self.step % int(t.save_every) == 0):
                        self.save()
                        saved_step = self.step
            if stop.requested is not None and self.step < total:
                if self.step > saved_step:  # a step boundary: model, optimizer and RNG agree
                    self.save()
                    saved_step = self.step
                raise RunInterrupted(stop.requested)
            status = "FINISHED"
        except (KeyboardInterrupt, SystemExit):  # a stop signal, or submitit exiting for a preemption requeue
            status = "KILLED"
            raise
        except OSError as exc:  # disk full, read-only or vanished folder: one line, resumable
            raise run_dir.storage_error(exc, self.output_dir, saved_step) from None
        except (RuntimeError, MemoryError) as exc:  # out of memory: the knobs to turn, in one line (run/oom.py)
            timeout = distributed.collective_timeout_s(t)
            lost = distributed.peer_failure(exc, self.dist, timeout, self.step + 1, saved_step)
            if lost is not None:  # another rank died or stalled: one line, not gloo's traceback
                raise lost from None
            if not is_out_of_memory(exc):
                raise
            error = memory_error(exc, self.cfg, self.step + 1, saved_step, str(self.device))
            exc.__traceback__ = None  # the failed step's tensors go before the summary is written
            raise error from None
        finally:
            with stop.finishing():
                summary = self._finish(started, status)
            if status == "KILLED":
                self.log(
                    f"stopped at step {self.step} of {total}"
                    + (f"; checkpoint at step {saved_step}" if saved_step else "; no checkpoint yet")
                    + f". To continue, run the same command again (output_dir={self.output_dir}, "
                    f"trainer.resume=auto)" + (f": it resumes from step {saved_step}" if saved_step else "")
                )
        return summary

    def _finish(self, started: float, status: str) -> dict:
        run = {"status": status, "steps": self.step, "algo": str(self.cfg.algo.name), "output_dir": str(self.output_dir)}
        if not self.dist.is_main:  # rank 0 writes the summary, plots and artifacts
            return {**run, "rank": self.dist.rank}
        trim_heap()  # what the steps freed goes back before the figures need memory (core/heap.py)
        return write_run_report(
            read_metrics(self.output_dir),
            self.cfg,
            self.output_dir,
            self.tracker,
            status,
            {
                **run,
                "world_size": self.dist.world_size,
                "nodes": self.nodes,
                "mlflow_run_id": self.tracker.run_id,
                "tracking_uri": self.tracker.uri if self.tracker.enabled else None,
                "wall_seconds": time.perf_counter() - started,
            },
            log=self.log,
        )


def train(cfg: DictConfig, log=print, *, checked: TrainingCheck | None = None) -> dict:
    """Run (or resume) the training job described by ``cfg``; returns the summary dict.

    ``checked``: what ``check_training(cfg)`` returned, when the caller ran it (the CLI, before it
    prints); else it runs here. Raises ``UserError`` for a bad value or an output_dir this run may
    not use (before anything is created), ``RunInterrupted`` (a ``KeyboardInterrupt``) when a
    signal stopped it."""
    checked = checked if checked is not None else check_training(cfg)
    with run_dir.run_lock(cfg):  # one writer per output_dir, held until the summary is written
        with paused_gc():  # set-up (the model classes' imports, the model): no cycle collection meanwhile
            trainer = GRPOTrainer(cfg, log=log, algo=checked.algo, run_mode=checked.run_mode)
        try:
            return trainer.fit()
        finally:
            trainer.close()
