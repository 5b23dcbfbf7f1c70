"""The algorithm facade the training loop talks to.

``Algorithm.from_train_config(cfg)`` (or ``Algorithm.from_config(cfg.algo, ...)``) turns the config
into an object that owns every piece of RL math of a training step, in the order the loop calls
them; it is built, and its parameters checked, before anything of a run is created::

    rewards = algo.shape_rewards(rewards, lengths)            # DAPO overlong shaping (if enabled)
    keep    = algo.keep_groups(rewards, group_ids)            # DAPO dynamic sampling (if enabled)
    algo.begin_step(algo.controller_reading(entropy, behaviour))  # controllers: STARE gate, adaptive beta
    adv     = algo.advantages(rewards, group_ids, mask)       # [B, T]
    batch   = algo.select(batch, "batch")                     # selections with scope=batch
    for mini in minibatches:                                  # mini = batch[idx]
        mini = algo.select(mini, "mini")                      # selections with scope=mini
        for micro in micro_batches:                           # micro = mini[idx]
            out = algo.micro_loss(micro, logp=..., entropy=...)   # LossOutput(loss, metrics, ...)
            algo.after_loss(out)                              # per-loss state (Clip-Cov's draws, AEnt's sums)
    algo.end_step(reduce)                                     # global-scope sums over ranks (AEnt), before a save
    algo.step_metrics()                                       # controller state for logging

``loss`` returns what it computed and changes nothing. The loop never branches on the algorithm
name and neither does this module: everything algorithm-specific is config data read here or an
intervention module (``interventions/``). The algorithm's own keys are declared once in
``ALGO_KEYS`` (type, range) with their defaults in ``conf/algo/grpo.yaml`` only (``algo_config.default``:
the constructor's defaults too), and checked in ``from_config``; an intervention's parameters
are checked by its ``Params``.
"""

# size: one facade holding every piece of a step's RL math, in the order the loop calls it
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import OmegaConf

from ...core.errors import UserError
from ...core.registry import unknown_choice
from ...core.validation import BOOL, check_value
from ..interventions import INTERVENTIONS, Intervention, LossContext, TokenBatch, build_intervention, intervention_params
from . import core_algos, objectives
from .algo_config import ALGO_KEYS, default, read_key, registered_name, to_dict, tracked_config
from .algo_config import objective_args as read_objective_args
from .step_batch import StepBatch

__all__ = ["Algorithm", "LossOutput", "ALGO_KEYS", "tracked_config"]

PREPARE_LEVELS = ("batch", "mini")
# scope "global" selects at the mini-batch level, over the rows of every rank (``gather``)
_AT_LEVEL = {"batch": ("batch",), "mini": ("mini", "global")}


@dataclass
class LossOutput:
    """What one micro-batch loss computed.

    ``loss``: scalar tensor to backpropagate; ``metrics``: plain floats for logging; ``tokens``: the
    ``LossContext`` it was built from (the per-token pieces after every intervention);
    ``token_loss``: ``[b, T]`` the weighted per-token policy loss the aggregation saw (still on the
    graph: diagnostics read gradients off it, ``stats/prediction.py``).
    """

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    tokens: LossContext | None = None
    token_loss: torch.Tensor | None = None


class Algorithm:
    """Advantage estimator + clipped surrogate + aggregation + KL + interventions, from config.

    Build it with ``from_config`` / ``from_train_config``, which check every value; the constructor
    takes checked values."""

    def __init__(
        self,
        *,
        name: str = default("name"),
        advantage: str = default("advantage"),
        eps_low: float = default("clip.low"),
        eps_high: float = default("clip.high"),
        dual_c: float | None = default("clip.dual_c"),
        loss_agg: str = default("loss_agg"),
        loss_agg_norm: float | None = default("loss_agg_norm"),
        kl_coef: float = default("kl_coef"),
        interventions: list[Intervention] | None = None,
        dynamic_sampling: bool = default("dynamic_sampling.enabled"),
        max_num_gen_batches: int = default("dynamic_sampling.max_num_gen_batches"),
        overlong: bool = default("overlong.enabled"),
        overlong_buffer: int = default("overlong.buffer"),
        max_response_length: int = 1,
        objective: str = default("objective"),
        objective_args: dict | None = None,
        controller_entropy: str = default("controller_entropy"),
    ):
        self.objective = str(objective)
        self.objective_args = objectives.check_objective_args(self.objective, dict(objective_args or {}))
        self.name = name
        self.advantage_name = advantage
        self.eps_low, self.eps_high, self.dual_c = float(eps_low), float(eps_high), dual_c
        self.loss_agg = loss_agg
        # Dr.GRPO's constant normaliser: the max response length unless given.
        self.loss_agg_norm = float(loss_agg_norm) if loss_agg_norm is not None else float(max_response_length)
        self.kl_coef = float(kl_coef)
        self.interventions: list[Intervention] = list(interventions or [])
        self.dynamic_sampling = bool(dynamic_sampling)
        self.max_num_gen_batches = int(max_num_gen_batches)
        self.overlong = bool(overlong)
        self.overlong_buffer = int(overlong_buffer)
        self.max_response_length = int(max_response_length)
        self.controller_entropy = str(controller_entropy)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(
        cls, algo_cfg, *, max_response_length: int, seed: int = 0, switches: dict[str, Any] | None = None
    ) -> Algorithm:
        """Build from the ``algo`` config group (DictConfig or dict); bad values raise ``UserError``.

        ``switches``: ``{config path: section}`` for the interventions switched on from outside
        ``algo`` (``Intervention.switched_on_by``, e.g. ``rollout.tis``): one whose section says
        ``enabled: true`` is added after the listed ones (unless listed), with the section's other
        keys as its parameters."""
        cfg = to_dict(algo_cfg)
        if isinstance(max_response_length, bool) or not isinstance(max_response_length, int) or max_response_length < 1:
            raise UserError(f"rollout.max_new_tokens must be a positive integer, got {max_response_length!r}")
        names = cfg.get("interventions") or []
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise UserError(f"algo.interventions must be a list of names, e.g. [stare]; got {names!r}")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise UserError(f"algo.interventions lists {', '.join(dup)} more than once; list each at most once")
        unknown = [n for n in names if n not in INTERVENTIONS]
        if unknown:
            raise UserError(unknown_choice("algo.interventions entry", unknown[0], INTERVENTIONS))
        sections = {n: cfg.get(n) for n in names}
        listed, where = list(names), {}
        for n, cls_ in INTERVENTIONS.items():
            path = cls_.switched_on_by
            switch = to_dict((switches or {}).get(path)) if path else {}
            check_value(f"{path}.enabled", switch.get("enabled", False), BOOL)
            if switch.get("enabled", False) and n not in names:
                names = [*names, n]
                sections[n] = {k: v for k, v in switch.items() if k != "enabled"}
                where[n] = path
        for n in INTERVENTIONS:
            section = sections.get(n, cfg.get(n))
            if section is not None and not isinstance(section, dict):
                raise UserError(f"algo.{n} must be a mapping of {n}'s parameters, got {section!r}")
            if n not in names and section is not None:
                intervention_params(n, section)  # a section the run does not use is still checked
        ivs = []
        for n in names:
            try:
                ivs.append(build_intervention(n, sections[n], seed=seed, max_response_length=max_response_length))
            except UserError as exc:
                if n in where and n not in listed:  # the user set <path>.*, not algo.<name>.*
                    raise UserError(str(exc).replace(f"algo.{n}.", f"{where[n]}.")) from None
                raise
        loss_agg, loss_agg_norm = registered_name(cfg, "loss_agg", core_algos.LOSS_AGGREGATIONS), read_key(cfg, "loss_agg_norm")
        if loss_agg_norm is not None and core_algos.LOSS_AGGREGATIONS[loss_agg].denominator is not None:
            # only an aggregation with a constant normaliser reads it: elsewhere it would be accepted and ignored
            raise UserError(
                f"algo.loss_agg_norm={loss_agg_norm} is not read by algo.loss_agg={loss_agg}, which divides by its own "
                f"count: set algo.loss_agg_norm=null, or algo.loss_agg=seq-mean-token-sum-norm for a constant normaliser"
            )
        overlong, buffer = read_key(cfg, "overlong.enabled"), read_key(cfg, "overlong.buffer")
        if overlong and not 1 <= buffer <= max_response_length:
            raise UserError(
                f"algo.overlong.buffer={buffer} is not allowed: it must be in [1, rollout.max_new_tokens={max_response_length}]"
            )
        return cls(
            name=str(cfg.get("name", default("name"))),
            advantage=registered_name(cfg, "advantage", core_algos.ADVANTAGE_ESTIMATORS),
            eps_low=float(read_key(cfg, "clip.low")),
            eps_high=float(read_key(cfg, "clip.high")),
            dual_c=read_key(cfg, "clip.dual_c"),
            loss_agg=loss_agg,
            loss_agg_norm=loss_agg_norm,
            kl_coef=float(read_key(cfg, "kl_coef")),
            interventions=ivs,
            dynamic_sampling=read_key(cfg, "dynamic_sampling.enabled"),
            max_num_gen_batches=int(read_key(cfg, "dynamic_sampling.max_num_gen_batches")),
            overlong=overlong,
            overlong_buffer=int(buffer),
            max_response_length=int(max_response_length),
            objective=str(cfg.get("objective") or default("objective")),
            objective_args=read_objective_args(cfg.get("objective_args")),
            controller_entropy=read_key(cfg, "controller_entropy"),
        )

    @classmethod
    def from_train_config(cls, cfg) -> Algorithm:
        """The algorithm of a composed ``train`` config: ``algo``, with ``rollout.max_new_tokens``
        as the response length, the sections that switch interventions on from outside ``algo``
        (``rollout.tis``) and ``trainer.seed``. The one place that reads
        them; it checks every algorithm and intervention value (``UserError``)."""
        paths = {c.switched_on_by for c in INTERVENTIONS.values() if c.switched_on_by}
        switches = {p: OmegaConf.select(cfg, p, default=None) for p in paths}
        return cls.from_config(
            cfg.algo, max_response_length=int(cfg.rollout.max_new_tokens), seed=int(cfg.trainer.seed), switches=switches
        )

    # ------------------------------------------------------------------ properties
    @property
    def needs_entropy_grad(self) -> bool:
        """True when the loss differentiates the entropy (entropy_bonus / adaptive_entropy)."""
        return any(iv.needs_entropy_grad for iv in self.interventions)

    def vocab_stats(self) -> dict:
        """``{key: (name, params)}``: the full-distribution statistics the interventions read from
        ``extras[key]`` (trainers/stats/vocab_stats.py); empty for every other algorithm."""
        out: dict = {}
        for iv in self.interventions:
            out.update(iv.vocab_stats())
        return out

    @property
    def needs_ref(self) -> bool:
        """True when the loss has a KL term to the reference policy (loop passes ``ref_logp``)."""
        return self.kl_coef > 0.0 or any(getattr(iv, "needs_ref", False) for iv in self.interventions)

    @property
    def intervention_names(self) -> list[str]:
        return [iv.name for iv in self.interventions]

    # ------------------------------------------------------------------ rewards and advantages
    def shape_rewards(self, rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``rewards [B]`` plus the overlong penalty of ``lengths [B]`` when enabled, else unchanged."""
        if not self.overlong:
            return rewards
        pen = core_algos.overlong_penalty(lengths, self.max_response_length, self.overlong_buffer)
        return rewards + pen.to(dtype=rewards.dtype if rewards.is_floating_point() else torch.float32, device=rewards.device)

    def keep_groups(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """``keep [B]`` bool: dynamic-sampling filter when enabled, else all True."""
        if not self.dynamic_sampling:
            return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)
        return core_algos.filter_all_equal_groups(rewards, group_ids)

    def advantages(
        self, rewards: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, entropy: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Token-level advantages ``[B, T]`` (0 on masked tokens); interventions that shape advantages
        (``shape_advantages``, e.g. GTPO) then apply, with the sampling ``entropy [B, T]``."""
        adv = core_algos.compute_advantages(self.advantage_name, rewards, group_ids, response_mask)
        for iv in self.interventions:
            shape = getattr(iv, "shape_advantages", None)
            if shape is not None:
                if entropy is None:
                    raise ValueError(f"{iv.name} shapes advantages by entropy: pass advantages(..., entropy=...)")
                adv = shape(adv, entropy, group_ids, response_mask)
        return adv

    # ------------------------------------------------------------------ step control
    def sampling_vocab_stats(self) -> dict:
        """``{key: (name, params)}`` the interventions need this step on the whole batch under the
        sampling policy (``Intervention.sampling_vocab_stats``); empty almost always."""
        out: dict = {}
        for iv in self.interventions:
            out.update(iv.sampling_vocab_stats())
        return out

    def observe_sampling(self, stats: dict, mask: torch.Tensor, reduce=None) -> None:
        """The statistics ``sampling_vocab_stats`` asked for, ``{key: [B, T]}`` on this rank's rows;
        ``reduce(tensor)`` sums over ranks (None on one process)."""
        for iv in self.interventions:
            wanted = iv.sampling_vocab_stats()
            if wanted:
                iv.observe_sampling({k: stats[k] for k in wanted}, mask, reduce)

    def controller_reading(self, current: float, behaviour: float | None = None) -> float:
        """The batch entropy to hand ``begin_step`` (``algo.controller_entropy``): ``current``, the
        token-mean entropy of the batch under the trainer's policy at the start of the step, or
        ``behaviour``, under the weights that generated it (the rollout worker's, with
        ``trainer.staleness >= 1``; None without a worker, where the two are the same policy and
        ``current`` is read)."""
        if self.controller_entropy == "behaviour" and behaviour is not None:
            return float(behaviour)
        return float(current)

    def begin_step(self, sampling_entropy: float) -> None:
        """Once per training step, before any update, with the sampling policy's token-mean entropy."""
        h = float(sampling_entropy)
        for iv in self.interventions:
            iv.begin_step(h)

    def end_step(self, reduce=None) -> None:
        """Once per training step, after its updates and before a checkpoint is saved:
        ``reduce(tensor)`` sums over ranks (``distributed.sum_across``) what global-scope controllers
        recorded this step (``Intervention.reduce_step``); None on one process. Reduced here, not at the
        next ``begin_step``, so the state a checkpoint holds is the same on every rank and complete."""
        if reduce is not None:
            for iv in self.interventions:
                iv.reduce_step(reduce)

    def prepare(
        self,
        level: str,
        *,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        entropy: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        gather=None,
        sampler_logp: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Selections of interventions whose scope is ``level`` ("batch" or "mini"; "mini" also
        computes the "global" ones), ``{key: [b, T]}``; ``sampler_logp``: the behaviour log-probs
        (``TokenBatch.sampler_logp``, the ``tis`` corrections' weights at scope mini or batch).

        ``gather(tensors) -> (all ranks' tensors, this rank's rows)`` (``distributed.gather_rows``):
        a "global" selection is computed on every rank's rows of the mini-batch together and this
        rank's rows are kept; without it (one process) "global" is "mini".
        ``select`` puts them into a ``StepBatch``; a direct caller passes them as ``loss(extras=...)``.
        """
        if level not in PREPARE_LEVELS:
            raise ValueError(f"prepare level must be one of {PREPARE_LEVELS}, got {level!r}")
        behaviour = None if sampler_logp is None else sampler_logp.detach()
        batch = TokenBatch(logp.detach(), old_logp.detach(), entropy.detach(), advantages.detach(), mask, behaviour)
        out: dict[str, torch.Tensor] = {}
        for iv in self.interventions:
            if iv.scope == level:
                out.update(iv.select(batch))
        wide = [iv for iv in self.interventions if iv.scope == "global" and level in _AT_LEVEL["mini"]]
        if wide:
            fields = ("logp", "old_logp", "entropy", "advantages", "mask")
            if gather is None:
                whole, rows = batch, slice(None)
            else:
                tensors, rows = gather({f: getattr(batch, f) for f in fields})
                whole = TokenBatch(*(tensors[f] for f in fields))
            width = mask.shape[1]
            for iv in wide:
                out.update({k: v[rows, :width] for k, v in iv.select(whole).items()})
        return out

    def select(self, batch: StepBatch, level: str, gather=None) -> StepBatch:
        """``batch`` with the selections of the interventions whose scope is ``level`` added (made
        on the sampling policy's statistics, before any update of the step); ``gather``: as in
        ``prepare`` (scope "global")."""
        with torch.no_grad():
            made = self.prepare(
                level,
                logp=batch.old_logp,
                old_logp=batch.old_logp,
                entropy=batch.entropy,
                advantages=batch.advantages,
                mask=batch.mask,
                gather=gather,
                sampler_logp=batch.sampler_logp,
            )
        return batch.with_(selections={**batch.selections, **made}) if made else batch

    # ------------------------------------------------------------------ the loss
    def micro_loss(
        self, batch: StepBatch, *, logp: torch.Tensor, entropy: torch.Tensor, vocab: dict[str, torch.Tensor] | None = None
    ) -> LossOutput:
        """``loss`` of a micro-batch of the step batch; ``logp``/``entropy`` ``[b, T]``: the policy
        being updated (``logp`` with gradient); ``vocab``: the full-distribution statistics of this
        micro-batch that interventions asked for (``vocab_stats``), read from ``ctx.extras``."""
        return self.loss(
            logp=logp,
            old_logp=batch.old_logp,
            entropy=entropy,
            advantages=batch.advantages,
            mask=batch.mask,
            ref_logp=batch.ref_logp,
            extras={**batch.selections, **(vocab or {})},
            sampling_entropy=batch.entropy,
            sampler_logp=batch.sampler_logp,
        )

    def loss_prefixes(
        self, batch: StepBatch, *, logp: torch.Tensor, entropy: torch.Tensor, vocab: dict[str, torch.Tensor] | None = None
    ) -> list[tuple[str, torch.Tensor]]:
        """The micro-batch loss built up one term at a time, for the entropy attribution
        (``stats/update_split.py``): ``[("objective", L_0), (iv_1.name, L_1), ..., (iv_n.name, L_n)]``
        where ``L_0`` is the configured objective without interventions or KL and ``L_k`` adds the first
        ``k`` interventions (in the order they apply); ``micro_loss`` (which adds the KL term) follows.
        Consecutive differences are each intervention's own contribution given the ones before it, so
        they telescope to the whole loss. Pure, like ``loss``."""
        out = []
        for k in range(len(self.interventions) + 1):
            partial = copy.copy(self)
            partial.interventions, partial.kl_coef = self.interventions[:k], 0.0
            name = "objective" if k == 0 else self.interventions[k - 1].name
            out.append((name, partial.micro_loss(batch, logp=logp, entropy=entropy, vocab=vocab).loss))
        return out

    def loss(
        self,
        *,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        entropy: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
        extras: dict[str, torch.Tensor] | None = None,
        sampling_entropy: torch.Tensor | None = None,
        sampler_logp: torch.Tensor | None = None,
    ) -> LossOutput:
        """Policy loss of one micro-batch; all tensors ``[b, T]``. Changes nothing (no state, no
        hidden accumulation): what it computed is in the returned ``LossOutput``.

        ``loss = agg(omega * L) + extra terms (entropy bonus) + kl_coef * agg(k3)``. ``extras``:
        the selections made on a wider scope; ``sampling_entropy`` / ``sampler_logp``: the step
        batch's sampling entropy and engine log-probs (``LossContext``).
        """
        shape = logp.shape
        for nm, t in (("old_logp", old_logp), ("entropy", entropy), ("advantages", advantages), ("mask", mask)):
            if t.shape != shape:
                raise ValueError(f"{nm} has shape {tuple(t.shape)}, expected {tuple(shape)} like logp")
        surr = self._surrogate(logp, old_logp, advantages, mask)
        ctx = LossContext(
            logp=logp,
            old_logp=old_logp,
            entropy=entropy,
            advantages=advantages,
            mask=mask,
            surrogate=surr,
            pg_loss=surr.loss,
            clipped=surr.clipped,
            pg_mask=mask,
            dual_clipped=surr.dual_clipped,
            loss_agg=self.loss_agg,
            loss_agg_norm=self.loss_agg_norm,
            extras=dict(extras or {}),
            sampling_entropy=None if sampling_entropy is None else sampling_entropy.detach(),
            sampler_logp=sampler_logp,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            dual_c=self.dual_c,
            ref_logp=ref_logp,
            surrogate_fn=self._surrogate,
        )
        for iv in self.interventions:
            iv.apply(ctx)
        # Multiply only when some intervention set weights: omega = 1 must stay bit-identical.
        loss_mat = ctx.pg_loss if ctx.weights is None else ctx.pg_loss * ctx.weights
        pg = core_algos.agg_loss(loss_mat, ctx.pg_mask, self.loss_agg, self.loss_agg_norm)
        total = pg
        with torch.no_grad():
            dual = ctx.dual_clipped if ctx.dual_clipped is not None else torch.zeros_like(ctx.clipped)
            metrics: dict[str, float] = {
                "loss/policy": float(pg.detach().item()),
                "clip/frac": float(core_algos.masked_mean(ctx.clipped.to(logp.dtype), mask).item()),
                # the two clips cut different tokens: ratio clip (rho outside [1-eps_low, 1+eps_high]
                # on the improving side) and dual clip (A < 0, rho > c)
                "clip/ratio_frac": float(core_algos.masked_mean((ctx.clipped & ~dual).to(logp.dtype), mask).item()),
                "clip/dual_frac": float(core_algos.masked_mean(dual.to(logp.dtype), mask).item()),
                # the policy being updated, on this micro-batch (after the step's earlier mini-batch
                # updates); the run's headline ``entropy`` is the sampling batch before any update
                "entropy/update": float(core_algos.masked_mean(entropy.detach(), mask).item()),
            }
        for term_name, term in ctx.extra_terms.items():
            total = total + term
            metrics[f"loss/{term_name}"] = float(term.detach().item())
        if self.kl_coef > 0.0:
            if ref_logp is None:
                raise ValueError("algo.kl_coef > 0 needs ref_logp (Algorithm.needs_ref is True)")
            kl = core_algos.agg_loss(core_algos.low_var_kl(logp, ref_logp), mask, self.loss_agg, self.loss_agg_norm)
            total = total + self.kl_coef * kl
            metrics["loss/kl"] = float(kl.detach().item())
        metrics["loss/total"] = float(total.detach().item())
        # what the objective itself did (objectives.OBJECTIVE_METRICS), from the surrogate the loss used
        metrics.update({k: float(v) for k, v in (getattr(ctx.surrogate, "metrics", None) or {}).items()})
        metrics.update(ctx.metrics)
        return LossOutput(total, metrics, tokens=ctx, token_loss=loss_mat)

    def after_loss(self, out: LossOutput | None = None) -> None:
        """After each micro-batch loss of the loop: the interventions advance their per-loss state
        and, given the loss's ``out``, record what their controllers read next step (``record``)."""
        for iv in self.interventions:
            iv.after_loss()
            if out is not None and out.tokens is not None:
                iv.record(out.tokens)

    def _surrogate(self, logp, old_logp, advantages, mask) -> core_algos.SurrogateOutput:
        """The configured policy objective's per-token pieces (``ppo_clip``: the clipped surrogate)."""
        if self.objective == "ppo_clip":
            return core_algos.clipped_surrogate(
                logp, old_logp, advantages, eps_low=self.eps_low, eps_high=self.eps_high, dual_c=self.dual_c
            )
        return objectives.policy_objective(
            self.objective,
            logp,
            old_logp,
            advantages,
            mask,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            dual_c=self.dual_c,
            **self.objective_args,
        )

    # ------------------------------------------------------------------ state
    def step_metrics(self) -> dict[str, float]:
        """Controller state after ``begin_step`` (``stare/gate_on``, ``stare/w``, ``entropy_bonus/coef``...)."""
        out: dict[str, float] = {}
        for iv in self.interventions:
            out.update(iv.step_metrics())
        return out

    def state_dict(self) -> dict:
        """JSON-serialisable controller state, for checkpoint resume."""
        return {"interventions": {iv.name: iv.state_dict() for iv in self.interventions}}

    def load_state_dict(self, state: dict) -> None:
        """Restore controller state; interventions absent from ``state`` keep their fresh state."""
        saved = (state or {}).get("interventions", {})
        for iv in self.interventions:
            if iv.name in saved:
                iv.load_state_dict(saved[iv.name])

    def __repr__(self) -> str:
        return (
            f"Algorithm(name={self.name!r}, advantage={self.advantage_name!r}, clip=({self.eps_low}, "
            f"{self.eps_high}, dual_c={self.dual_c}), loss_agg={self.loss_agg!r}, kl_coef={self.kl_coef}, "
            f"interventions={self.intervention_names})"
        )
