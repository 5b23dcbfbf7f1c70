"""Truncated importance sampling (TIS) on the sampler/trainer mismatch.

When a separate engine samples (vLLM), its log-probs of the sampled tokens differ slightly from the
trainer's recomputation (kernels, precision, a weight sync that lags). The policy loss of each token
is then weighted by ``w = min(exp(old_logp - sampling_logp), C)`` (Yao et al. 2025, "Your efficient
RL framework secretly brings you off-policy RL training"), detached. The trainer passes the
sampler's log-probs to every loss call as the step batch's ``sampler_logp`` (``ctx.sampler_logp``);
batches without them (the ``hf`` engine samples with the trained model itself) are left unchanged.
``rollout.tis.enabled`` adds it after the listed interventions (``Algorithm.from_train_config``).

    entropyrl train rollout=vllm rollout.tis.enabled=true rollout.tis.cap=2.0
    entropyrl train rollout=vllm algo.interventions=[stare,tis] algo.tis.cap=2.0
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from .base import Intervention, LossContext, register_intervention


def sampler_mismatch_metrics(old_logp: torch.Tensor, sampling_logp: torch.Tensor,
                             mask: torch.Tensor) -> dict[str, float]:
    """``rollout/logp_diff_mean`` and ``rollout/logp_diff_max``: mean and max over valid tokens of
    ``|old_logp - sampling_logp|`` (trainer minus sampler). ``[B, T]`` each."""
    valid = mask.bool()
    d = (old_logp.detach().float() - sampling_logp.to(old_logp.device).float()).abs() * valid
    n = valid.sum().clamp(min=1)
    return {"rollout/logp_diff_mean": float(d.sum() / n),
            "rollout/logp_diff_max": float(d.max()) if valid.any() else 0.0}


def truncated_is_weight(old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor,
                        cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, clipped)``, both ``[B, T]``: ``w = min(exp(old_logp - sampling_logp), cap)`` on valid
    tokens (0 elsewhere), detached; ``clipped`` marks valid tokens whose ratio exceeded ``cap``.
    The log-ratio is bounded above by 20 before ``exp`` so a wild token cannot overflow."""
    valid = mask.bool()
    d = old_logp.detach().float() - sampling_logp.to(old_logp.device).float()
    ratio = torch.exp(d.clamp(max=20.0))
    w = torch.clamp(ratio, max=cap) * valid
    return w.to(old_logp.dtype), (ratio > cap) & valid


@register_intervention("tis")
class TruncatedIS(Intervention):
    """Weights each token's policy loss by the truncated sampler/trainer importance ratio."""

    switched_on_by = "rollout.tis"      # rollout.tis.enabled=true adds it (after algo.interventions)

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/tis.yaml."""
        cap: float  # C: the ratio is truncated at this value (Yao et al. 2025 use 2)
        scope: str

        def validate(self, name: str) -> None:
            if not self.cap > 0:
                raise UserError(f"algo.{name}.cap must be > 0, got {self.cap}")

    def apply(self, ctx: LossContext) -> None:
        sampling_logp = ctx.sampler_logp
        if sampling_logp is None:            # the trained model sampled: nothing to correct
            return
        w, clipped = truncated_is_weight(ctx.old_logp, sampling_logp, ctx.pg_mask, float(self.params.cap))
        ctx.scale(w)
        n = ctx.pg_mask.sum().clamp(min=1)
        ctx.metrics["rollout/tis_weight_mean"] = float(w.sum() / n)
        ctx.metrics["rollout/tis_clip_frac"] = float(clipped.sum() / n)
