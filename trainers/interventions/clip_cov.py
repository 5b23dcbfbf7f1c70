"""Clip-Cov ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
Cui et al. 2025).

docs/algorithms.md §5. Entropy falls where the covariance between a token's log-prob and its advantage
is high. Clip-Cov picks ``max(1, floor(ratio * n_valid))`` tokens at random among the valid,
not-already-ratio-clipped tokens whose centred covariance lies in ``(lb, ub)`` and detaches them
(zero loss, no gradient). The remaining tokens use ``max(L1, L2)`` without the dual clip, as the
reference implementation (verl ``compute_policy_loss_clip_cov``).

The random pick is reproducible: the generator is seeded from the run seed and a counter of the
losses computed so far, which the loop advances after each micro-batch loss (``after_loss``; the
loss itself changes nothing) and which is part of the checkpointed state.

``scope``: micro (the reference) picks in every micro-batch from the current log-probs; mini and
global pick once per mini-batch before the update, from the sampling policy's log-probs (nothing
is ratio-clipped yet), global over the tokens of every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ...core.seeds import draw_seed
from ..algos.core_algos import token_covariance
from .base import Intervention, LossContext, TokenBatch, finding, register_intervention


def one_token_warning(name: str, series, params: dict) -> list[dict]:
    """``<name>_one_token`` when the covariance pick selected <= 1 token per micro-batch on most
    steps (``<name>/count``): at this batch size the published ratio barely acts."""
    counts = series(f"{name}/count")
    low = [(s, v) for s, v in counts if v <= 1.0]
    if not counts or len(low) * 2 <= len(counts):
        return []
    return [
        finding(
            f"{name}_one_token",
            f"{name} selects <= 1 token per micro-batch on {len(low)}/{len(counts)} steps "
            f"(ratio {params.get('ratio')} x the micro-batch's valid tokens): it barely acts at this batch "
            f"size; raise algo.{name}.ratio (experiment=lab_{name} scales it to the lab)",
            low[0][0],
        )
    ]


def clip_cov_candidates(
    cov: torch.Tensor, valid: torch.Tensor, ratio_clipped: torch.Tensor, lb: float, ub: float
) -> torch.Tensor:
    """Bool ``[b, T]``: valid, not ratio-clipped (``L2 > L1``), ``lb < cov < ub``."""
    return valid.bool() & ~ratio_clipped.bool() & (cov > lb) & (cov < ub)


@register_intervention("clip_cov")
class ClipCov(Intervention):
    logged_metrics = ("clip_cov/frac",)

    @classmethod
    def regime_warnings(cls, series, params: dict) -> list[dict]:
        return one_token_warning(cls.name, series, params)

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/clip_cov.yaml."""

        ratio: float  # fraction of valid tokens to detach
        lb: float  # covariance window (lb, ub)
        ub: float
        scope: str  # where tokens are picked: micro | mini | batch | global

        def validate(self, name: str) -> None:
            if not 0.0 <= self.ratio <= 1.0 or not self.lb < self.ub:
                raise UserError(f"algo.{name}: need 0 <= ratio <= 1 and lb < ub")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.calls = 0

    def _pick(
        self, logp: torch.Tensor, advantages: torch.Tensor, valid: torch.Tensor, ratio_clipped: torch.Tensor
    ) -> torch.Tensor:
        """Bool ``[b, T]``: the tokens to detach (``k`` at random among the candidates)."""
        p = self.params
        cov = token_covariance(advantages, logp, valid)
        cand = torch.nonzero(clip_cov_candidates(cov, valid, ratio_clipped, p.lb, p.ub).reshape(-1), as_tuple=True)[0]
        k = min(max(1, int(p.ratio * int(valid.sum().item()))), int(cand.numel()))
        gen = torch.Generator().manual_seed(draw_seed(self.seed, self.calls))
        picked = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        if k > 0:
            picked[cand[torch.randperm(int(cand.numel()), generator=gen)[:k].to(cand.device)]] = True
        return picked.view_as(valid)

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        valid = batch.mask.bool()
        return {"clip_cov/detach": self._pick(batch.logp, batch.advantages, valid, torch.zeros_like(valid))}

    def apply(self, ctx: LossContext) -> None:
        valid = ctx.pg_mask.bool()
        if self.scope == "micro":
            picked = self._pick(ctx.logp, ctx.advantages, valid, ctx.surrogate.ratio_clipped)
        else:
            picked = self.selection(ctx)["clip_cov/detach"].bool() & valid
        n_valid, k = int(valid.sum().item()), int(picked.sum().item())
        corr = (~picked).to(ctx.pg_loss.dtype).reshape(-1)
        ctx.pg_loss = ctx.surrogate.loss_ratio_clipped
        ctx.clipped = ctx.surrogate.ratio_clipped
        ctx.dual_clipped = None  # the reference's clip-cov mode has no dual clip
        ctx.scale(corr.view_as(ctx.pg_loss))
        ctx.metrics["clip_cov/frac"] = k / max(n_valid, 1)
        ctx.metrics["clip_cov/count"] = float(k)

    def after_loss(self) -> None:
        self.calls += 1  # the next loss draws afresh

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])
