"""The algorithm facade the training loop talks to.

``Algorithm.from_config(cfg.algo, max_response_length=..., seed=...)`` turns the ``algo`` config
group into an object that owns every piece of RL math of a training step, in the order the loop
calls them::

    rewards = algo.shape_rewards(rewards, lengths)            # DAPO overlong shaping (if enabled)
    keep    = algo.keep_groups(rewards, group_ids)            # DAPO dynamic sampling (if enabled)
    adv     = algo.advantages(rewards, group_ids, mask)       # [B, T]
    algo.begin_step(sampling_entropy)                         # controllers: STARE gate, adaptive beta
    extras  = algo.prepare("batch", logp=..., ...)            # selections with scope=batch
    for mini in minibatches:
        extras_m = algo.prepare("mini", logp=..., ...)        # selections with scope=mini
        for micro in micro_batches:
            out = algo.loss(logp=..., ..., extras=sliced)     # LossOutput(loss, metrics)
    algo.step_metrics()                                       # controller state for logging

The loop never branches on the algorithm name: everything algorithm-specific is config data read
here or an intervention module (``interventions/``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ...conf import intervention_names
from ...core.errors import UserError
from ..interventions import INTERVENTIONS, Intervention, LossContext, TokenBatch, build_intervention
from ..interventions.steer import SAMPLING_ENTROPY_KEY
from ..stats.diagnostics import QUADRANTS, effective_entropy_change, quadrant_ids
from . import core_algos, objectives

__all__ = ["Algorithm", "LossOutput", "tracked_config"]

_TOP_KEYS = ("name", "advantage", "clip", "loss_agg", "loss_agg_norm", "kl_coef", "interventions",
             "dynamic_sampling", "overlong", "objective", "objective_args")
PREPARE_LEVELS = ("batch", "mini")
# scope "global" selects at the mini-batch level, over the rows of every rank (``gather``)
_AT_LEVEL = {"batch": ("batch",), "mini": ("mini", "global")}


@dataclass
class LossOutput:
    """``loss``: scalar tensor to backpropagate; ``metrics``: plain floats for logging."""
    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def _to_dict(cfg: Any) -> dict:
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return dict(cfg)
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        DictConfig = ()
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    raise TypeError(f"algo config must be a dict or DictConfig, got {type(cfg).__name__}")


def _objective_args(v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise UserError(f"algo.objective_args must be a mapping, e.g. {{tau_pos: 1.0}}; got {v!r}")
    return dict(v)


def _num(cfg: dict, key: str, default, where: str, *, allow_none: bool = False):
    v = cfg.get(key, default)
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise UserError(f"{where}.{key} must be a number, got {v!r}")
    return v


class Algorithm:
    """Advantage estimator + clipped surrogate + aggregation + KL + interventions, from config."""

    def __init__(self, *, name: str = "grpo", advantage: str = "grpo", eps_low: float = 0.2,
                 eps_high: float = 0.2, dual_c: float | None = 3.0, loss_agg: str = "token-mean",
                 loss_agg_norm: float | None = None, kl_coef: float = 0.0,
                 interventions: list[Intervention] | None = None, dynamic_sampling: bool = False,
                 max_num_gen_batches: int = 10, overlong: bool = False, overlong_buffer: int = 0,
                 max_response_length: int = 1, objective: str = "ppo_clip",
                 objective_args: dict | None = None):
        self.objective = str(objective)
        self.objective_args = objectives.check_objective_args(self.objective, dict(objective_args or {}))
        if advantage not in core_algos.ADVANTAGE_ESTIMATORS:
            raise UserError(f"unknown algo.advantage '{advantage}'; valid choices: "
                            f"{', '.join(sorted(core_algos.ADVANTAGE_ESTIMATORS))}")
        if loss_agg not in core_algos.LOSS_AGGREGATIONS:
            raise UserError(f"unknown algo.loss_agg '{loss_agg}'; valid choices: "
                            f"{', '.join(core_algos.LOSS_AGGREGATIONS)}")
        if not (0.0 <= eps_low <= 1.0 and eps_high >= 0.0):
            raise UserError(f"algo.clip: need 0 <= low <= 1 and high >= 0, got low={eps_low}, high={eps_high}")
        if dual_c is not None and dual_c <= 1.0:
            raise UserError(f"algo.clip.dual_c must be > 1 (or null to disable), got {dual_c}")
        if kl_coef < 0:
            raise UserError(f"algo.kl_coef must be >= 0, got {kl_coef}")
        if max_response_length < 1:
            raise UserError(f"max_response_length must be >= 1, got {max_response_length}")
        if overlong and not 1 <= overlong_buffer <= max_response_length:
            raise UserError(f"algo.overlong.buffer must be in [1, max_response_length={max_response_length}], "
                            f"got {overlong_buffer}")
        if dynamic_sampling and max_num_gen_batches < 1:
            raise UserError(f"algo.dynamic_sampling.max_num_gen_batches must be >= 1, got {max_num_gen_batches}")
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
        self.all_equal_frac: float | None = None   # share of groups with all-equal rewards, last step
        self._pred: dict[str, float] = {}          # first-order entropy change, summed since the last pop

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, algo_cfg, *, max_response_length: int, seed: int = 0) -> Algorithm:
        """Build from the ``algo`` config group (DictConfig or dict); bad values raise ``UserError``."""
        cfg = _to_dict(algo_cfg)
        clip = cfg.get("clip") or {}
        ds = cfg.get("dynamic_sampling") or {}
        ol = cfg.get("overlong") or {}
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
            raise UserError(f"unknown intervention '{unknown[0]}' in algo.interventions; valid choices: "
                            f"{', '.join(sorted(INTERVENTIONS))}")
        ivs = []
        for n in names:
            section = cfg.get(n)
            if section is not None and not isinstance(section, dict):
                raise UserError(f"algo.{n} must be a mapping of {n}'s parameters, got {section!r}")
            ivs.append(build_intervention(n, section, seed=seed, max_response_length=max_response_length))
        return cls(
            name=str(cfg.get("name", "custom")),
            advantage=str(cfg.get("advantage", "grpo")),
            eps_low=float(_num(clip, "low", 0.2, "algo.clip")),
            eps_high=float(_num(clip, "high", 0.2, "algo.clip")),
            dual_c=_num(clip, "dual_c", 3.0, "algo.clip", allow_none=True),
            loss_agg=str(cfg.get("loss_agg", "token-mean")),
            loss_agg_norm=_num(cfg, "loss_agg_norm", None, "algo", allow_none=True),
            kl_coef=float(_num(cfg, "kl_coef", 0.0, "algo")),
            interventions=ivs,
            dynamic_sampling=bool(ds.get("enabled", False)),
            max_num_gen_batches=int(_num(ds, "max_num_gen_batches", 10, "algo.dynamic_sampling")),
            overlong=bool(ol.get("enabled", False)),
            overlong_buffer=int(_num(ol, "buffer", 0, "algo.overlong")),
            max_response_length=int(max_response_length),
            objective=str(cfg.get("objective") or "ppo_clip"),
            objective_args=_objective_args(cfg.get("objective_args")),
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
        return rewards + pen.to(dtype=rewards.dtype if rewards.is_floating_point() else torch.float32,
                                device=rewards.device)

    def keep_groups(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """``keep [B]`` bool: dynamic-sampling filter when enabled, else all True."""
        if not self.dynamic_sampling:
            return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)
        return core_algos.filter_all_equal_groups(rewards, group_ids)

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor,
                   response_mask: torch.Tensor, entropy: torch.Tensor | None = None) -> torch.Tensor:
        """Token-level advantages ``[B, T]`` (0 on masked tokens); interventions that shape advantages
        (``shape_advantages``, e.g. GTPO) then apply, with the sampling ``entropy [B, T]``."""
        if rewards.numel():
            keep = core_algos.filter_all_equal_groups(rewards.float(), group_ids)
            groups = torch.unique(group_ids)
            mixed = torch.unique(group_ids[keep]).numel()
            self.all_equal_frac = 1.0 - mixed / max(int(groups.numel()), 1)
        adv = core_algos.compute_advantages(self.advantage_name, rewards, group_ids, response_mask)
        for iv in self.interventions:
            shape = getattr(iv, "shape_advantages", None)
            if shape is not None:
                if entropy is None:
                    raise ValueError(f"{iv.name} shapes advantages by entropy: pass advantages(..., entropy=...)")
                adv = shape(adv, entropy, group_ids, response_mask)
        return adv

    # ------------------------------------------------------------------ step control
    def begin_step(self, sampling_entropy: float) -> None:
        """Once per training step, before any update, with the sampling policy's token-mean entropy."""
        h = float(sampling_entropy)
        for iv in self.interventions:
            iv.begin_step(h)

    def prepare(self, level: str, *, logp: torch.Tensor, old_logp: torch.Tensor, entropy: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, gather=None) -> dict[str, torch.Tensor]:
        """Selections of interventions whose scope is ``level`` ("batch" or "mini"; "mini" also
        computes the "global" ones), ``{key: [b, T]}``.

        ``gather(tensors) -> (all ranks' tensors, this rank's rows)`` (``distributed.gather_rows``):
        a "global" selection is computed on every rank's rows of the mini-batch together and this
        rank's rows are kept; without it (one process) "global" is "mini".
        The loop slices them row-wise with the batch and passes them to ``loss(extras=...)``.
        """
        if level not in PREPARE_LEVELS:
            raise ValueError(f"prepare level must be one of {PREPARE_LEVELS}, got {level!r}")
        batch = TokenBatch(logp.detach(), old_logp.detach(), entropy.detach(), advantages.detach(), mask)
        out: dict[str, torch.Tensor] = {}
        if level == "batch" and any(iv.name == "steer" for iv in self.interventions):

            out[SAMPLING_ENTROPY_KEY] = entropy.detach()   # STEER's entropy_source=old
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

    # ------------------------------------------------------------------ the loss
    def loss(self, *, logp: torch.Tensor, old_logp: torch.Tensor, entropy: torch.Tensor,
             advantages: torch.Tensor, mask: torch.Tensor, ref_logp: torch.Tensor | None = None,
             extras: dict[str, torch.Tensor] | None = None) -> LossOutput:
        """Policy loss of one micro-batch; all tensors ``[b, T]``.

        ``loss = agg(omega * L) + extra terms (entropy bonus) + kl_coef * agg(k3)``.
        """
        shape = logp.shape
        for nm, t in (("old_logp", old_logp), ("entropy", entropy), ("advantages", advantages), ("mask", mask)):
            if t.shape != shape:
                raise ValueError(f"{nm} has shape {tuple(t.shape)}, expected {tuple(shape)} like logp")
        surr = self._surrogate(logp, old_logp, advantages, mask)
        ctx = LossContext(logp=logp, old_logp=old_logp, entropy=entropy, advantages=advantages, mask=mask,
                          surrogate=surr, pg_loss=surr.loss, clipped=surr.clipped, pg_mask=mask,
                          dual_clipped=surr.dual_clipped, loss_agg=self.loss_agg,
                          loss_agg_norm=self.loss_agg_norm, extras=dict(extras or {}),
                          eps_low=self.eps_low, eps_high=self.eps_high, dual_c=self.dual_c,
                          ref_logp=ref_logp, surrogate_fn=self._surrogate)
        for iv in self.interventions:
            iv.apply(ctx)
        # Multiply only when some intervention set weights: omega = 1 must stay bit-identical.
        loss_mat = ctx.pg_loss if ctx.weights is None else ctx.pg_loss * ctx.weights
        pg = core_algos.agg_loss(loss_mat, ctx.pg_mask, self.loss_agg, self.loss_agg_norm)
        total = pg
        self._accumulate_prediction(ctx, loss_mat)
        with torch.no_grad():
            dual = ctx.dual_clipped if ctx.dual_clipped is not None else torch.zeros_like(ctx.clipped)
            metrics: dict[str, float] = {
                "loss/policy": float(pg.detach().item()),
                "clip/frac": float(core_algos.masked_mean(ctx.clipped.to(logp.dtype), mask).item()),
                # the two clips cut different tokens: ratio clip (rho outside [1-eps_low, 1+eps_high]
                # on the improving side) and dual clip (A < 0, rho > c)
                "clip/ratio_frac": float(core_algos.masked_mean((ctx.clipped & ~dual).to(logp.dtype), mask).item()),
                "clip/dual_frac": float(core_algos.masked_mean(dual.to(logp.dtype), mask).item()),
                "entropy/mean": float(core_algos.masked_mean(entropy.detach(), mask).item()),
            }
        for term_name, term in ctx.extra_terms.items():
            total = total + term
            metrics[f"loss/{term_name}"] = float(term.detach().item())
        if self.kl_coef > 0.0:
            if ref_logp is None:
                raise ValueError("algo.kl_coef > 0 needs ref_logp (Algorithm.needs_ref is True)")
            kl = core_algos.agg_loss(core_algos.low_var_kl(logp, ref_logp), mask, self.loss_agg,
                                     self.loss_agg_norm)
            total = total + self.kl_coef * kl
            metrics["loss/kl"] = float(kl.detach().item())
        metrics["loss/total"] = float(total.detach().item())
        metrics.update(ctx.metrics)
        return LossOutput(total, metrics)

    def _surrogate(self, logp, old_logp, advantages, mask) -> core_algos.SurrogateOutput:
        """The configured policy objective's per-token pieces (``ppo_clip``: the clipped surrogate)."""
        if self.objective == "ppo_clip":
            return core_algos.clipped_surrogate(logp, old_logp, advantages, eps_low=self.eps_low,
                                                eps_high=self.eps_high, dual_c=self.dual_c)
        return objectives.policy_objective(self.objective, logp, old_logp, advantages, mask, eps_low=self.eps_low,
                                           eps_high=self.eps_high, dual_c=self.dual_c, **self.objective_args)

    # ------------------------------------------------------------------ diagnostics
    def _accumulate_prediction(self, ctx: LossContext, loss_mat: torch.Tensor) -> None:
        """Add this micro-batch's first-order entropy change per quadrant to the running sums.

        The effective per-token coefficient is ``g_t = -d(sum_t omega_t L_t)/d logp_t`` over the
        tokens that reach the aggregation: advantage x ratio x intervention weights x clip mask
        (and KL-Cov's penalty slope), read off the autograd graph when ``logp`` carries gradient.
        The base is plain GRPO's ``A rho`` with the configured clip, on the same tokens.
        """
        with torch.no_grad():
            valid = ctx.mask.bool()
            base = ctx.advantages * ctx.surrogate.ratio * (~ctx.surrogate.clipped).to(ctx.advantages.dtype)
        if ctx.logp.requires_grad and torch.is_grad_enabled():
            summed = core_algos.zero_padding(loss_mat, ctx.pg_mask).sum()
            (grad,) = torch.autograd.grad(summed, ctx.logp, retain_graph=True, allow_unused=True)
            eff = torch.zeros_like(base) if grad is None else -grad.detach()
        else:
            with torch.no_grad():
                w = ctx.weights if ctx.weights is not None else torch.ones_like(base)
                eff = (ctx.advantages * ctx.surrogate.ratio * w * (~ctx.clipped).to(base.dtype)
                       * ctx.pg_mask.to(base.dtype))
        with torch.no_grad():
            lp, h = ctx.logp.detach(), ctx.entropy.detach()
            ids = quadrant_ids(lp, h, ctx.advantages, valid)
            d_eff = effective_entropy_change(eff, lp, h, valid)
            d_base = effective_entropy_change(base, lp, h, valid)
            for i, q in enumerate(QUADRANTS, start=1):
                sel = ids == i
                for key, d in ((f"quadrant/{q}/pred_dH", d_eff), (f"quadrant/{q}/pred_dH_base", d_base)):
                    self._pred[key] = self._pred.get(key, 0.0) + float(d[sel].sum().item())
            for key, d in (("entropy_change/predicted", d_eff), ("quadrant/pred_dH", d_eff),
                           ("entropy_change/predicted_base", d_base), ("quadrant/pred_dH_base", d_base)):
                self._pred[key] = self._pred.get(key, 0.0) + float(d.sum().item())

    def pop_prediction(self) -> dict[str, float]:
        """The first-order entropy change summed over every micro-batch loss since the last call.

        ``quadrant/q*/pred_dH`` and ``entropy_change/predicted`` with the effective coefficients,
        ``.../pred_dH_base`` and ``entropy_change/predicted_base`` with plain GRPO's; their
        difference is the intervention's predicted effect.
        """
        out, self._pred = self._pred, {}
        return out

    # ------------------------------------------------------------------ state
    def step_metrics(self) -> dict[str, float]:
        """Controller state after ``begin_step`` (``stare/gate_on``, ``stare/w``, ``entropy_bonus/coef``...)."""
        out: dict[str, float] = {}
        if self.all_equal_frac is not None:
            out["groups/all_equal_frac"] = float(self.all_equal_frac)
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
        return (f"Algorithm(name={self.name!r}, advantage={self.advantage_name!r}, clip=({self.eps_low}, "
                f"{self.eps_high}, dual_c={self.dual_c}), loss_agg={self.loss_agg!r}, kl_coef={self.kl_coef}, "
                f"interventions={self.intervention_names})")


def tracked_config(cfg) -> dict:
    """The resolved config as a plain dict for MLflow params, without the parameter sections of
    interventions the run does not use (``algo.<name>`` for every intervention that is registered
    or has a config in ``conf/intervention/`` but is not listed in ``algo.interventions``): a run's
    params say what it ran, not every published default."""
    from omegaconf import DictConfig, OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    algo = plain.get("algo")
    if isinstance(algo, dict):
        active = set(algo.get("interventions") or [])
        for name in set(INTERVENTIONS) | set(intervention_names()):
            if name not in active:
                algo.pop(name, None)
    return plain
