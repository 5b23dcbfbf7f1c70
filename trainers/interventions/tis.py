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
- ``m2po`` (M2PO, Zheng et al. 2025, arXiv 2510.01161): the second-moment mask of the paper's
  Algorithm 1 and its objective, eq. 5 (``m2po_mask``, below); kept tokens get ``w = r``, masked
  ones 0.

Where the weights are computed (``scope``, every mode): ``micro`` on each micro-batch of the loss,
``mini`` on each optimizer mini-batch and ``batch`` on the step's whole batch (this rank's rows),
before any update of the step (``Algorithm.select``), then sliced with the rows. Every mode but
``m2po`` is a function of each token (or response) alone, so its weights are the same at any scope;
M2PO's mask is a function of the whole unit's second moment, so at ``mini`` or ``batch`` it is the
same whatever ``trainer.micro_batch_responses`` splits the unit into, and at ``micro`` it is not.
A loss called without the step's selections (a direct ``Algorithm.loss`` call) takes its own tokens
as the unit. ``global`` (every rank's rows) is refused: the behaviour log-probs are not gathered.

M2PO as the paper defines it, and where this implementation stands:

- the second moment ``M2 = mean (log r)^2`` is taken over the unit's *trust-region tokens* only
  (Algorithm 1's ``T``): the valid tokens the PPO clip could cut, ``A > 0`` with ``r > 1`` or
  ``A < 0`` with ``r < 1``; the others are never masked. Algorithm 1 removes the token of largest
  ``(log r)^2`` from ``T`` while the mean over ``T`` exceeds ``tau`` (``m2_threshold``, 0.04 in
  every experiment of the paper); one sort finds the same set (``m2po_keep``). The paper's unit is
  the training batch: ``scope: batch`` is the published setting;
- ``r`` is ``pi_theta / pi_behav`` at the moment the mask is made: at the start of the step, where
  ``pi_theta`` is the proximal policy (``old_logp``, the trainer's recompute), so
  ``r = exp(old_logp - sampling_logp)``;
- the objective (eq. 5) has no trust-region clip: ``J = 1/N sum_t M_t (pi_theta / pi_behav) A_t``
  over all ``N`` valid tokens (masked ones count in the normaliser, the paper's footnote 2). With
  ``m2po_clip: false`` (the default) the per-token loss is the objective's unclipped term
  ``-A pi_theta / pi_prox`` (``SurrogateOutput.loss_unclipped``; the clip and dual clip are off,
  ``clip/frac`` is 0) times ``w = M r``, which is ``-M A pi_theta / pi_behav``. ``m2po_clip: true``
  keeps the clipped surrogate against ``pi_prox`` (AReaL's decoupled loss) under the same mask;
- when every valid token of a unit would be masked (each one a trust-region token whose
  ``(log r)^2`` exceeds ``tau``), the one with the smallest ``(log r)^2`` is kept, so a unit never
  leaves the loss without a word: ``rollout/m2po_forced_frac`` is their share. The paper's
  loop would mask them all;
- the authors' public code (Infini-AI-Lab/M2PO, ``compute_m2po_policy_loss``) differs from the
  paper: it turns the same budget into an adaptive clip range on the harmful tokens of each
  micro-batch instead of a mask; this module implements the paper. AReaL's ``m2po`` masks over every
  valid token, not only the trust-region ones.

Logged in ``m2po`` mode: ``rollout/m2po_masked_frac`` (share of the valid tokens masked, the same
tokens ``rollout/tis_clip_frac`` counts), ``rollout/m2po_trust_region_frac`` (share of the valid
tokens in ``T``) and ``rollout/m2po_forced_frac`` (share of the valid tokens kept by the rule above:
above 0, the rule fired). Each is a share of the micro-batch's valid tokens, averaged over the
step's losses like the other loss metrics.

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
    entropyrl train trainer.staleness=2 algo.interventions=[tis] algo.tis.mode=m2po algo.tis.scope=batch
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ...core.errors import UserError
from ...core.registry import unknown_choice
from .base import Intervention, LossContext, TokenBatch, register_intervention

TIS_MODES = ("token", "mis", "icepop", "seq_mask", "decoupled", "m2po")
TIS_SCOPES = ("micro", "mini", "batch")  # global is refused: the behaviour log-probs are not gathered
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


class M2POMask(NamedTuple):
    """M2PO's mask of one unit, each ``[B, T]`` bool: ``keep`` the valid tokens kept, ``candidates``
    the trust-region tokens the mask chose from, ``forced`` the token kept beyond the rule (at most
    one: every valid token was a candidate over the threshold)."""

    keep: torch.Tensor
    candidates: torch.Tensor
    forced: torch.Tensor


def m2po_mask(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float, advantages: torch.Tensor | None = None) -> M2POMask:
    """M2PO's mask over one unit (Algorithm 1 of arXiv 2510.01161; the module docstring): the
    candidates are the valid tokens (``mask [B, T]``) where the advantage pushes the ratio away from
    1, ``A > 0`` with ``log r > 0`` or ``A < 0`` with ``log r < 0`` (``advantages [B, T]``; None: every
    valid token); ``m2po_keep`` masks among them, the other valid tokens are kept. When no valid token
    would be kept, the one with the smallest ``log_ratio [B, T] ** 2`` is (``forced``)."""
    valid = mask.bool()
    d = log_ratio.detach()
    if advantages is None:
        candidates = valid
    else:
        a = advantages.detach().to(d.device)
        candidates = valid & (((a > 0) & (d > 0)) | ((a < 0) & (d < 0)))
    keep = (valid & ~candidates) | m2po_keep(d, candidates, threshold)
    forced = torch.zeros_like(valid)
    if valid.any() and not keep.any():
        squares = torch.where(valid, d.pow(2), torch.full_like(d, float("inf")))
        forced.view(-1)[torch.argmin(squares)] = True
        keep = forced.clone()
    return M2POMask(keep, candidates, forced)


def _log_ratio(old_logp: torch.Tensor, sampling_logp: torch.Tensor) -> torch.Tensor:
    """``old_logp - sampling_logp`` (``[B, T]``), detached, in at least float32, bounded to +-20."""
    dt = torch.promote_types(old_logp.dtype, torch.float32)
    return (old_logp.detach().to(dt) - sampling_logp.to(old_logp.device, dt)).clamp(-_LOG_RATIO_MAX, _LOG_RATIO_MAX)


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
    advantages: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, corrected)``, ``[B, T]``: the detached weight of correction ``mode`` (see the module
    docstring) on valid tokens (0 elsewhere) and the valid tokens it truncated or masked, the
    tensors given taken as one unit. ``old_logp``, ``sampling_logp``, ``mask``: ``[B, T]``;
    ``m2_threshold``: M2PO's tau and ``advantages [B, T]`` its trust-region tokens (only ``m2po``
    reads them; ``advantages`` None: every valid token is a candidate, ``m2po_mask``)."""
    if mode == "token":
        return truncated_is_weight(old_logp, sampling_logp, mask, cap)
    valid = mask.bool()
    d = _log_ratio(old_logp, sampling_logp)
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
        keep = m2po_mask(d, valid, m2_threshold, advantages).keep
        w = ratio * keep
    else:
        raise UserError(unknown_choice("rollout.tis.mode", mode, TIS_MODES))
    return (w * valid).to(old_logp.dtype), ~keep & valid


@register_intervention("tis")
class TruncatedIS(Intervention):
    """Weights each token's policy loss by a sampler/trainer mismatch correction (``mode``),
    computed over the ``scope`` unit; in ``m2po`` mode also the paper's clip-free objective."""

    logged_metrics = ("rollout/tis_weight_mean", "rollout/tis_clip_frac")

    switched_on_by = "rollout.tis"  # rollout.tis.enabled=true adds it (after algo.interventions)

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/tis.yaml."""

        cap: float  # C: the ratio is truncated (token) or masked (mis) above this value
        scope: str  # micro | mini | batch: the unit the weights are computed over (M2PO's second moment)
        mode: str  # token | mis | icepop | seq_mask | decoupled | m2po
        icepop_low: float  # IcePop keeps tokens with ratio in [icepop_low, icepop_high]
        icepop_high: float
        seq_low: float  # seq_mask keeps responses with geometric-mean ratio in [seq_low, seq_high]
        seq_high: float
        m2_threshold: float  # m2po: tau, the largest mean (log r)^2 of the kept trust-region tokens
        m2po_clip: bool  # m2po: false, the paper's clip-free objective; true, the clipped surrogate under the mask

        def validate(self, name: str) -> None:
            if not self.cap > 0:
                raise UserError(f"algo.{name}.cap must be > 0, got {self.cap}")
            if self.mode not in TIS_MODES:
                raise UserError(unknown_choice(f"algo.{name}.mode", self.mode, TIS_MODES))
            if self.scope not in TIS_SCOPES:
                raise UserError(
                    f"algo.{name}.scope={self.scope} is not supported: the behaviour log-probs are not gathered "
                    f"across ranks; use one of {', '.join(TIS_SCOPES)} (batch: this rank's step batch)"
                )
            if not 0 < self.icepop_low < self.icepop_high or not 0 < self.seq_low < self.seq_high:
                raise UserError(f"algo.{name}: need 0 < icepop_low < icepop_high and 0 < seq_low < seq_high")
            if not self.m2_threshold > 0:
                raise UserError(f"algo.{name}.m2_threshold must be > 0 (M2PO's tau, 0.04 published), got {self.m2_threshold}")

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        """The weights of one unit, ``{"tis/weight", "tis/corrected"}`` (``[b, T]``; in ``m2po`` mode
        also ``"tis/candidate"``, ``"tis/forced"``: ``M2POMask``); none without behaviour log-probs."""
        if batch.sampler_logp is None:
            return {}
        p = self.params
        if p.mode != "m2po":
            w, corrected = mismatch_weight(
                p.mode,
                batch.old_logp,
                batch.sampler_logp,
                batch.mask,
                cap=float(p.cap),
                icepop_low=p.icepop_low,
                icepop_high=p.icepop_high,
                seq_low=p.seq_low,
                seq_high=p.seq_high,
            )
            return {"tis/weight": w, "tis/corrected": corrected}
        valid = batch.mask.bool()
        d = _log_ratio(batch.old_logp, batch.sampler_logp)
        m = m2po_mask(d, valid, p.m2_threshold, batch.advantages)
        w = (torch.exp(d) * m.keep).to(batch.old_logp.dtype)
        return {"tis/weight": w, "tis/corrected": valid & ~m.keep, "tis/candidate": m.candidates, "tis/forced": m.forced}

    def apply(self, ctx: LossContext) -> None:
        if ctx.sampler_logp is None:  # the trained model sampled: nothing to correct
            return
        p = self.params
        sel = {k: v for k, v in ctx.extras.items() if k.startswith("tis/")}
        if self.scope == "micro" or not sel:  # this micro-batch; a direct loss call: its own tokens
            sel = self.select(ctx.batch())
        sel = {k: v.to(ctx.pg_loss.device) for k, v in sel.items()}
        valid = ctx.pg_mask.bool()
        w = sel["tis/weight"] * valid
        corrected = sel["tis/corrected"].bool() & valid
        if p.mode == "m2po" and not p.m2po_clip:  # eq. 5: M r (-A pi_theta / pi_prox), no clip
            if ctx.pg_loss is not ctx.surrogate.loss:
                raise UserError(
                    "algo.tis.mode=m2po (clip-free, the paper's objective) replaces the per-token loss, which an "
                    "intervention listed before tis has already changed; list tis first in algo.interventions, "
                    "or set algo.tis.m2po_clip=true to keep the clipped loss under the mask"
                )
            ctx.pg_loss = ctx.surrogate.loss_unclipped
            ctx.clipped = torch.zeros_like(ctx.clipped)
            ctx.dual_clipped = torch.zeros_like(ctx.clipped)
        ctx.scale(w)
        n = valid.sum().clamp(min=1)
        ctx.metrics["rollout/tis_weight_mean"] = float(w.sum() / n)
        ctx.metrics["rollout/tis_clip_frac"] = float(corrected.sum() / n)
        ctx.token_masks["rollout/tis_clip_frac"] = corrected  # by entropy quartile: rollout/tis_clip_frac/entropy_q<i>
        if p.mode == "m2po":
            ctx.metrics["rollout/m2po_masked_frac"] = float(corrected.sum() / n)
            ctx.metrics["rollout/m2po_trust_region_frac"] = float((sel["tis/candidate"].bool() & valid).sum() / n)
            ctx.metrics["rollout/m2po_forced_frac"] = float((sel["tis/forced"].bool() & valid).sum() / n)
