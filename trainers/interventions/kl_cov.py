"""KL-Cov ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
Cui et al. 2025).

docs/algorithms.md §5. The ``max(1, floor(ratio * n_valid))`` valid tokens with the largest centred
covariance between advantage and log-prob get a KL-like penalty ``kappa * |logp - old_logp|`` on
top of the unclipped surrogate ``-A * rho``; all other tokens use ``-A * rho``. No ratio clipping
in this mode (verl ``compute_policy_loss_kl_cov``).

``scope``: micro (the reference) selects in every micro-batch from the current log-probs; mini and
global select once per mini-batch before the update, from the sampling policy's log-probs, global
over the tokens of every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.core_algos import token_covariance
from .base import Intervention, LossContext, TokenBatch, finding, register_intervention
from .clip_cov import one_token_warning


def kl_cov_selection(cov: torch.Tensor, valid: torch.Tensor, ratio: float) -> torch.Tensor:
    """Bool ``[b, T]``: the ``max(1, floor(ratio * n_valid))`` valid tokens with the largest cov."""
    valid = valid.bool()
    idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    out = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    if idx.numel():
        k = min(max(1, int(ratio * idx.numel())), int(idx.numel()))
        top = torch.topk(cov.reshape(-1)[idx], k, largest=True).indices
        out[idx[top]] = True
    return out.view_as(valid)


def kl_cov_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    ratio_rho: torch.Tensor,
    selected: torch.Tensor,
    kappa: float,
) -> torch.Tensor:
    """Per-token loss ``[b, T]``: ``-A rho + kappa |logp - old_logp|`` on ``selected``, ``-A rho`` elsewhere."""
    base = -advantages * ratio_rho
    return torch.where(selected.bool(), base + kappa * (logp - old_logp).abs(), base)


@register_intervention("kl_cov")
class KlCov(Intervention):
    logged_metrics = ("kl_cov/frac",)

    @classmethod
    def regime_warnings(cls, series, params: dict) -> list[dict]:
        out = one_token_warning(cls.name, series, params)
        zero = series("kl_cov/penalty_zero")
        share = sum(v for _, v in zero) / len(zero) if zero else 0.0
        if share >= 0.5:
            first = next(s for s, v in zero if v > 0)
            out.append(
                finding(
                    "kl_cov_on_policy",
                    f"kl_cov's penalty kappa|logp - old_logp| was exactly 0 on {share:.0%} of micro-batches: "
                    f"the update is on-policy there (first mini-batch of a step), where |x| has zero gradient; "
                    f"use several mini-batches or ppo_epochs > 1",
                    first,
                )
            )
        return out

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/kl_cov.yaml."""

        ratio: float  # fraction of valid tokens that get the penalty
        kappa: float  # penalty coefficient
        scope: str  # where tokens are selected: micro | mini | batch | global

        def validate(self, name: str) -> None:
            if not 0.0 <= self.ratio <= 1.0 or self.kappa < 0:
                raise UserError(f"algo.{name}: need 0 <= ratio <= 1 and kappa >= 0")

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        valid = batch.mask.bool()
        return {
            "kl_cov/selected": kl_cov_selection(token_covariance(batch.advantages, batch.logp, valid), valid, self.params.ratio)
        }

    def apply(self, ctx: LossContext) -> None:
        valid = ctx.pg_mask.bool()
        if self.scope == "micro":
            sel = kl_cov_selection(token_covariance(ctx.advantages, ctx.logp, valid), valid, self.params.ratio)
        else:
            sel = self.selection(ctx)["kl_cov/selected"].bool() & valid
        ctx.pg_loss = kl_cov_loss(ctx.logp, ctx.old_logp, ctx.advantages, ctx.surrogate.ratio, sel, self.params.kappa)
        ctx.clipped = torch.zeros_like(ctx.clipped)  # no ratio clip in this mode
        ctx.dual_clipped = None
        n_sel = int(sel.sum().item())
        ctx.metrics["kl_cov/frac"] = n_sel / max(int(valid.sum().item()), 1)
        ctx.metrics["kl_cov/count"] = float(n_sel)
        # On-policy (first mini-batch of a step) |logp - old_logp| is exactly 0 and so is its
        # gradient: the penalty cannot act. Logged so the regime check can say so.
        gap = (ctx.logp.detach() - ctx.old_logp).abs()[sel]
        ctx.metrics["kl_cov/penalty_zero"] = float(bool(n_sel == 0 or bool((gap == 0).all())))
