"""Lp-Reg ("Low-probability Tokens Sustain Exploration in Reinforcement Learning with Verifiable
Reward", Huang et al. 2025, 2510.03222).

docs/algorithms.md §5. Negative updates wipe out low-probability "reasoning spark" tokens. Lp-Reg
builds a proxy of the policy with the presumed noise removed: a min-p filter drops every token
with ``pi < kappa * max pi`` and re-normalises the rest, so a kept token ``y`` has the detached
proxy log-prob ``q(y) = log pi(y) - log M`` (``M``: the kept mass, ``vocab_stats.minp_log_mass``);
a dropped one has none. In each micro-batch, among the valid tokens with ``A < 0``, the
``k = max(1, floor(n_neg * rho))`` of lowest ``log pi(y)`` are candidates (none when ``k = 1``, as
the reference); those with ``log pi(y) < q(y)`` (kept by the filter) lose the ratio clip and gain a
KL pull towards the proxy:

    L_t = -A_t rho_t + coef * clip(exp(q - logp) - (q - logp) - 1, -10, 10)     (k3, "low_var_kl")

and every other token keeps ``max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))`` (no dual clip
in this mode). ``rho_pos`` does the same for ``A > 0`` (0 in the published runs). The proxy is taken
from the policy being updated (the reference's ``minp_old_log_prob=False`` path; its scripts set
True, which reads it from the sampling policy: the same on an on-policy step's first update).
The candidates rank a token against the others of the micro-batch, so they have a ``scope``: micro
(each micro-batch, the current log-probs: the reference) or mini / batch / global (taken before the
update from the sampling log-probs; global: over all ranks' mini-batch, the same tokens on 1 or N
ranks); the filter check stays per token, in the loss. Cross-checked against the authors' code
(CarlanLark/Lp-Reg-dev@33b27e27 compute_policy_loss_lp_reg, dp_actor.py apply_min_p);
tests/trainers/test_entropy_methods.py reproduces it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.core_algos import agg_loss
from ..algos.lab_claim import LabClaim, Lever
from .base import Intervention, LossContext, TokenBatch, register_intervention

MASS_KEY, MAX_KEY = "lp_reg/minp_log_mass", "lp_reg/max_logp"


def lowest_fraction(lp: torch.Tensor, pool: torch.Tensor, frac: float) -> torch.Tensor:
    """Bool ``[b, T]``: the ``max(1, floor(n * frac))`` tokens of ``pool`` with the lowest ``lp``
    (none when that count is 1 or ``frac`` is 0, as the reference)."""
    n = int(pool.sum().item())
    k = max(1, int(n * frac)) if n else 0
    out = torch.zeros_like(pool)
    if frac <= 0 or k <= 1:
        return out
    idx = pool.reshape(-1).nonzero(as_tuple=True)[0]
    low = torch.topk(lp.reshape(-1)[idx], k, largest=False).indices
    return out.reshape(-1).index_fill(0, idx[low], True).view_as(pool)


def lp_reg_candidates(
    logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, rho: float, rho_pos: float = 0.0
) -> torch.Tensor:
    """Bool ``[b, T]``: the lowest-probability fractions of the valid A < 0 (``rho``) and A > 0
    (``rho_pos``) tokens."""
    lp, valid = logp.detach(), mask.bool()
    return lowest_fraction(lp, valid & (advantages < 0), rho) | lowest_fraction(lp, valid & (advantages > 0), rho_pos)


def lp_reg_selection(
    logp: torch.Tensor,
    proxy_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rho: float,
    rho_pos: float = 0.0,
    cand: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bool ``[b, T]``: the regularised tokens (see the module docstring); ``cand``: the candidates
    of a wider scope, else this micro-batch's."""
    if cand is None:
        cand = lp_reg_candidates(logp, advantages, mask, rho, rho_pos)
    return cand.bool() & mask.bool() & (logp.detach() < proxy_logp)


def proxy_logp(logp: torch.Tensor, max_logp: torch.Tensor, log_mass: torch.Tensor, kappa: float) -> torch.Tensor:
    """``[b, T]`` the sampled token's detached proxy log-prob; ``-inf`` where the filter drops it."""
    lp = logp.detach()
    kept = lp >= max_logp.detach() + math.log(kappa)
    return torch.where(kept, lp - log_mass.detach(), torch.full_like(lp, float("-inf")))


@register_intervention("lp_reg")
class LpReg(Intervention):
    logged_metrics = ("lp_reg/frac", "loss/lp_reg")
    lab_claim = LabClaim(
        "above_grpo",
        "Lp-Reg protects low-probability tokens: entropy ends above GRPO",
        levers=(Lever("lp_reg/frac", "protected tokens", "frac"),),
        added_term="loss/lp_reg",
    )

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/lp_reg.yaml."""

        coef: float  # beta of the k3 pull towards the proxy (ppo_kl_coef)
        kappa: float  # min-p filter: tokens below kappa * max prob are noise (minp_p_threshold)
        rho: float  # fraction of the A < 0 tokens (lowest prob) that are candidates (logp_neg_k_percent)
        rho_pos: float  # the same for A > 0 (logp_pos_k_percent)
        scope: str  # where the candidates are ranked: micro (reference) | mini | batch | global

        def validate(self, name: str) -> None:
            if self.coef < 0 or not 0 < self.kappa < 1 or not 0 <= self.rho <= 1 or not 0 <= self.rho_pos <= 1:
                raise UserError(f"algo.{name}: need coef >= 0, 0 < kappa < 1, 0 <= rho <= 1, 0 <= rho_pos <= 1")

    def vocab_stats(self) -> dict:
        return {MASS_KEY: ("minp_log_mass", {"kappa": float(self.params.kappa)}), MAX_KEY: ("max_logp", {})}

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        """The candidates of a wider scope (``[b, T]`` bool) from the sampling log-probs."""
        p = self.params
        return {"lp_reg/cand": lp_reg_candidates(batch.logp, batch.advantages, batch.mask, p.rho, p.rho_pos)}

    def apply(self, ctx: LossContext) -> None:
        mass, mx = ctx.extras.get(MASS_KEY), ctx.extras.get(MAX_KEY)
        if mass is None or mx is None:
            raise RuntimeError("lp_reg: proxy statistics missing; compute Algorithm.vocab_stats() in the loss loop")
        p = self.params
        q = proxy_logp(ctx.logp, mx, mass, p.kappa)
        cand = None if self.scope == "micro" else self.selection(ctx)["lp_reg/cand"]
        sel = lp_reg_selection(ctx.logp, q, ctx.advantages, ctx.pg_mask, p.rho, p.rho_pos, cand=cand)
        surr = ctx.surrogate
        ctx.pg_loss = torch.where(sel, surr.loss_unclipped, surr.loss_ratio_clipped)
        ctx.clipped = surr.ratio_clipped & ~sel
        ctx.dual_clipped = None  # the reference's lp_reg mode has no dual clip
        d = torch.where(sel, q, ctx.logp.detach()) - ctx.logp
        k3 = torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)
        ctx.extra_terms["lp_reg"] = p.coef * agg_loss(
            torch.where(sel, k3, torch.zeros_like(k3)), ctx.pg_mask, ctx.loss_agg, ctx.loss_agg_norm
        )
        n = max(int(ctx.pg_mask.bool().sum().item()), 1)
        ctx.metrics["lp_reg/frac"] = float(sel.sum().item()) / n
