"""Sampler/trainer mismatch corrections: truncated IS (TIS) and its masked variants.

When a separate engine samples (vLLM), its log-probs of the sampled tokens differ slightly from the
trainer's recomputation (kernels, precision, a weight sync that lags). With the per-token ratio
``r = exp(old_logp - sampling_logp)`` (trainer over sampler) the policy loss of each token is
weighted, detached, by (``mode``):

- ``token`` (TIS, Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
  training"): ``w = min(r, cap)``;
- ``mis`` (masked IS, Liu et al. 2025, "When speed kills stability"): ``w = r`` where ``r <= cap``,
  0 where it is larger (the token is dropped rather than truncated);
- ``icepop`` (IcePop, Ring-1T / inclusionAI 2025): ``w = r`` inside ``[icepop_low, icepop_high]``,
  0 outside (two-sided mask);
- ``seq_mask`` (geometric sequence mask, verl's ``seq_mean_k1`` rejection): every token of a
  response whose geometric-mean ratio ``exp(mean_t log r)`` lies outside ``[seq_low, seq_high]``
  gets 0, the others 1;
- ``decoupled`` (AReaL's decoupled PPO objective, Fu et al. 2025): the clipped surrogate is taken
  against a proximal policy, here the trainer's recomputed ``old_logp`` (what every objective of
  this trainer already uses), and multiplied by the behaviour weight ``pi_prox / pi_behav = r``,
  0 where ``r > cap`` (AReaL's ``behav_imp_weight_cap``). On this ratio the weight is the same as
  ``mis``'s; the mode names the objective it completes;
- ``m2po`` (M2PO, Zheng et al. 2025, arXiv 2510.01161, the paper's algorithm): the valid tokens with
  the largest squared log-ratio ``(log r)^2`` are masked, largest first, until the mean of
  ``(log r)^2`` over the tokens kept is at most ``m2_threshold`` (tau); kept tokens get ``w = r``
  (so the loss ratio becomes ``pi_theta / pi_behav`` there), masked ones 0. The second moment is
  taken over the tokens of one weight computation (``scope``).

Under ``trainer.staleness`` (docs/async.md) the rollout worker ships its behaviour log-probs as
``sampling_logp``, so every mode corrects the behaviour-vs-current ratio of stale samples.

Logged: ``rollout/tis_weight_mean`` and ``rollout/tis_clip_frac`` (the share of tokens truncated or
masked); the truncated or masked tokens themselves go to ``ctx.token_masks`` under that name, and
the loop splits them by the step's entropy quartile (``rollout/tis_clip_frac/entropy_q<i>``,
``stats/update_tokens.py``).

The trainer passes the sampler's log-probs to every loss call as the step batch's ``sampler_logp``;
batches without them (the ``hf`` engine samples with the trained model itself) are left unchanged.

    entropyrl train rollout=vllm rollout.tis.enabled=true rollout.tis.mode=icepop
    entropyrl train rollout=vllm algo.interventions=[stare,tis] algo.tis.cap=2.0
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ...core.registry import unknown_choice
from .base import Intervention, LossContext, register_intervention

TIS_MODES = ("token", "mis", "icepop", "seq_mask", "decoupled", "m2po")
_LOG_RATIO_MAX = 20.0


def sampler_mismatch_metrics(old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``rollout/logp_diff_mean`` and ``rollout/logp_diff_max``: mean and max over valid tokens of
    ``|old_logp - sampling_logp|`` (trainer minus sampler), the log of the token-level ratio a
    token objective sees; ``rollout/seq_logp_diff_mean`` / ``_max``: mean and max over responses of
    ``|mean_t (old_logp - sampling_logp)|``, the log of GSPO's sequence-level ratio between the two
    engines. ``[B, T]`` each."""
    valid = mask.bool()
    signed = (old_logp.detach().float() - sampling_logp.to(old_logp.device).float()) * valid
    d = signed.abs()
    n = valid.sum().clamp(min=1)
    rows = valid.any(-1)
    seq = (signed.sum(-1) / valid.sum(-1).clamp(min=1)).abs()[rows]
    return {
        "rollout/logp_diff_mean": float(d.sum() / n),
        "rollout/logp_diff_max": float(d.max()) if valid.any() else 0.0,
        "rollout/seq_logp_diff_mean": float(seq.mean()) if rows.any() else 0.0,
        "rollout/seq_logp_diff_max": float(seq.max()) if rows.any() else 0.0,
    }


def truncated_is_weight(
    old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, clipped)``, both ``[B, T]``: ``w = min(exp(old_logp - sampling_logp), cap)`` on valid
    tokens (0 elsewhere), detached; ``clipped`` marks valid tokens whose ratio exceeded ``cap``.
    The log-ratio is bounded above by 20 before ``exp`` so a wild token cannot overflow."""
    valid = mask.bool()
    d = old_logp.detach().float() - sampling_logp.to(old_logp.device).float()
    ratio = torch.exp(d.clamp(max=_LOG_RATIO_MAX))
    w = torch.clamp(ratio, max=cap) * valid
    return w.to(old_logp.dtype), (ratio > cap) & valid


def m2po_keep(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """M2PO's second-moment mask, ``[B, T]`` bool: the valid tokens (``mask [B, T]``) kept once the
    ones with the largest ``log_ratio [B, T] ** 2`` are masked, largest first, until the mean of
    the squares over the kept tokens is ``<= threshold``. Sorted ascending, the kept set is the
    longest prefix whose running mean stays under the threshold (running means of an ascending
    sequence only grow), so one sort finds it."""
    valid = mask.bool()
    squares = log_ratio.detach()[valid].pow(2)
    order = torch.argsort(squares, stable=True)
    counts = torch.arange(1, squares.numel() + 1, device=squares.device, dtype=squares.dtype)
    n_keep = int((torch.cumsum(squares[order], 0) / counts <= threshold).sum())
    kept = torch.zeros_like(squares, dtype=torch.bool)
    kept[order[:n_keep]] = True
    keep = torch.zeros_like(valid)
    keep[valid] = kept
    return keep


def mismatch_weight(
    mode: str,
    old_logp: torch.Tensor,
    sampling_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float,
    icepop_low: float,
    icepop_high: float,
    seq_low: float,
    seq_high: float,
    m2_threshold: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, corrected)``, ``[B, T]``: the detached weight of correction ``mode`` (see the module
    docstring) on valid tokens (0 elsewhere) and the valid tokens it truncated or masked.
    ``old_logp``, ``sampling_logp``, ``mask``: ``[B, T]``; ``m2_threshold``: M2PO's tau (only
    ``m2po`` reads it)."""
    if mode == "token":
        return truncated_is_weight(old_logp, sampling_logp, mask, cap)
    valid = mask.bool()
    dt = torch.promote_types(old_logp.dtype, torch.float32)
    d = (old_logp.detach().to(dt) - sampling_logp.to(old_logp.device, dt)).clamp(-_LOG_RATIO_MAX, _LOG_RATIO_MAX)
    ratio = torch.exp(d)
    if mode in ("mis", "decoupled"):  # decoupled: AReaL's capped behaviour weight pi_prox / pi_behav
        keep = ratio <= cap
        w = ratio * keep
    elif mode == "icepop":
        keep = (ratio >= icepop_low) & (ratio <= icepop_high)
        w = ratio * keep
    elif mode == "seq_mask":
        m = valid.to(d.dtype)
        geo = torch.exp((d * m).sum(-1) / m.sum(-1).clamp(min=1.0))
        keep = ((geo >= seq_low) & (geo <= seq_high)).unsqueeze(-1).expand_as(valid)
        w = keep.to(d.dtype)
    elif mode == "m2po":
        if m2_threshold is None:
            raise ValueError("mode m2po needs m2_threshold")
        keep = m2po_keep(d, valid, m2_threshold)
        w = ratio * keep
    else:
        raise UserError(unknown_choice("rollout.tis.mode", mode, TIS_MODES))
    return (w * valid).to(old_logp.dtype), ~keep & valid


@register_intervention("tis")
class TruncatedIS(Intervention):
    """Weights each token's policy loss by a sampler/trainer mismatch correction (``mode``)."""

    logged_metrics = ("rollout/tis_weight_mean", "rollout/tis_clip_frac")

    switched_on_by = "rollout.tis"  # rollout.tis.enabled=true adds it (after algo.interventions)

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/tis.yaml."""

        cap: float  # C: the ratio is truncated (token) or masked (mis) above this value
        scope: str
        mode: str  # token | mis | icepop | seq_mask | decoupled | m2po
        icepop_low: float  # IcePop keeps tokens with ratio in [icepop_low, icepop_high]
        icepop_high: float
        seq_low: float  # seq_mask keeps responses with geometric-mean ratio in [seq_low, seq_high]
        seq_high: float
        m2_threshold: float  # m2po: tau, the largest mean (log r)^2 of the kept tokens

        def validate(self, name: str) -> None:
            if not self.cap > 0:
                raise UserError(f"algo.{name}.cap must be > 0, got {self.cap}")
            if self.mode not in TIS_MODES:
                raise UserError(unknown_choice(f"algo.{name}.mode", self.mode, TIS_MODES))
            if not 0 < self.icepop_low < self.icepop_high or not 0 < self.seq_low < self.seq_high:
                raise UserError(f"algo.{name}: need 0 < icepop_low < icepop_high and 0 < seq_low < seq_high")
            if not self.m2_threshold > 0:
                raise UserError(f"algo.{name}.m2_threshold must be > 0 (M2PO's tau, 0.04 published), got {self.m2_threshold}")

    def apply(self, ctx: LossContext) -> None:
        sampling_logp = ctx.sampler_logp
        if sampling_logp is None:  # the trained model sampled: nothing to correct
            return
        p = self.params
        w, corrected = mismatch_weight(
            p.mode,
            ctx.old_logp,
            sampling_logp,
            ctx.pg_mask,
            cap=float(p.cap),
            icepop_low=p.icepop_low,
            icepop_high=p.icepop_high,
            seq_low=p.seq_low,
            seq_high=p.seq_high,
            m2_threshold=p.m2_threshold,
        )
        ctx.scale(w)
        n = ctx.pg_mask.sum().clamp(min=1)
        ctx.metrics["rollout/tis_weight_mean"] = float(w.sum() / n)
        ctx.metrics["rollout/tis_clip_frac"] = float(corrected.sum() / n)
        ctx.token_masks["rollout/tis_clip_frac"] = corrected  # by entropy quartile: rollout/tis_clip_frac/entropy_q<i>
