"""STARE: surprisal-guided token-level advantage reweighting with a closed-loop entropy gate.

docs/algorithms.md §5. Plain GRPO credits every token of a response with the same advantage, but a
token's effect on entropy depends on its surprisal ``s = -logp``: confident tokens of positive
responses (the majority) drive entropy down, the rare high-surprisal ones hold it up. STARE
up-weights (W > 1) the top-P surprisal tokens of positive responses (``L+``) and, in variant C2,
down-weights (M < 1) the top-P surprisal tokens of negative responses (``L-``), but only while the
sampling policy's batch entropy is below the target (the gate), so healthy runs stay plain GRPO.
Weights are positive, so no token's gradient changes sign.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ...core.registry import unknown_choice
from ...core.validation import OPEN_PROB, check_value
from ..algos.core_algos import select_top_fraction
from .base import Intervention, LossContext, TokenBatch, finding, register_intervention

VARIANTS = ("O1", "C2")


@register_intervention("stare")
class Stare(Intervention):
    logged_metrics = ("stare/gate_on", "stare/w", "stare/m", "stare/l_plus_frac", "stare/l_minus_frac")
    acted_metric = "stare/gate_on"  # the share of steps its gate was open
    target_param = "h_tgt"

    @classmethod
    def regime_warnings(cls, series, params: dict) -> list[dict]:
        gate = series("stare/gate_on")
        if not params.get("gate", True) or len(gate) < 2:
            return []
        h_tgt = params.get("h_tgt")
        if all(v == 0 for _, v in gate):
            return [
                finding(
                    "stare_gate_never_opens",
                    f"stare's gate never opened (entropy stayed above h_tgt={h_tgt}): the run is plain GRPO",
                    gate[0][0],
                )
            ]
        out = []
        if all(v == 1 for _, v in gate):
            out.append(
                finding(
                    "stare_gate_never_closes",
                    f"stare's gate never closed (entropy stayed below h_tgt={h_tgt}): STARE acted open-loop on every step",
                    gate[0][0],
                )
            )
        missed = cls.target_missed(series("entropy"), gate, h_tgt)
        if missed is not None:
            tail_mean, open_share, first = missed
            out.append(
                finding(
                    "stare_target_not_held",
                    f"entropy ended at {tail_mean:.3f} (last tenth), {1 - tail_mean / h_tgt:.0%} below h_tgt={h_tgt}, "
                    f"with the gate open on {open_share:.0%} of the second half's steps: STARE did not hold its "
                    f"target here (stare/w and stare/m: how far its weights went; stronger levers: variant C2 with "
                    f"the adaptive schedule and its bounds w_max, m_min)",
                    first,
                )
            )
        return out

    #: ``stare_target_not_held``: the last tenth's entropy this far below ``h_tgt`` ...
    TARGET_MISS = 0.2
    #: ... while the gate was open on at least this share of the second half's steps
    OPEN_SHARE = 0.8

    @classmethod
    def target_missed(cls, entropy, gate, h_tgt) -> tuple[float, float, int] | None:
        """``(last-tenth mean entropy, gate-open share of the second half, first step of the second
        half)`` when the gate stayed (mostly) open and entropy still ended more than ``TARGET_MISS``
        below ``h_tgt``: the closed loop did not hold its set point. None otherwise. ``entropy`` and
        ``gate``: ``[(step, value)]`` series. Pure."""
        if h_tgt is None or not entropy or len(gate) < 2:
            return None
        tenth = entropy[-max(1, len(entropy) // 10) :]
        tail_mean = sum(v for _, v in tenth) / len(tenth)
        half = gate[len(gate) // 2 :]
        open_share = sum(v for _, v in half) / len(half)
        if tail_mean < (1 - cls.TARGET_MISS) * float(h_tgt) and open_share >= cls.OPEN_SHARE:
            return tail_mean, open_share, half[0][0]
        return None

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/stare.yaml."""

        p: float  # top fraction of each pool by surprisal
        w: float  # weight on L+ (7B; 1.05 for 14B/32B)
        m: float  # weight on L- in C2 (7B; 0.95 for 14B/32B)
        h_tgt: float  # gate opens while batch entropy < h_tgt
        variant: str  # O1: only L+; C2: also L-
        gate: bool  # false: always on (open-loop ablation)
        adaptive: bool  # W/M schedule driven by sign(h_tgt - H)
        alpha: float
        w_max: float
        m_min: float
        scope: str  # where selection happens: micro | mini | batch | global

        def validate(self, name: str) -> None:
            if self.variant not in VARIANTS:
                raise UserError(unknown_choice(f"algo.{name}.variant", self.variant, VARIANTS))
            check_value(f"algo.{name}.p", self.p, OPEN_PROB)  # (0, 1]: a top fraction that selects
            if self.w <= 0 or self.m <= 0:
                raise UserError(f"algo.{name}.w and .m must be > 0 (a weight <= 0 would flip or kill gradients)")
            if self.h_tgt < 0:
                raise UserError(f"algo.{name}.h_tgt must be >= 0 (an entropy in nats), got {self.h_tgt}")
            if self.adaptive and not (self.w_max >= 1.0 and 0.0 < self.m_min <= 1.0 and self.alpha >= 0):
                raise UserError(f"algo.{name}: adaptive needs w_max >= 1, 0 < m_min <= 1, alpha >= 0")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        # closed until the first begin_step has seen an entropy reading (always open without a gate)
        self.gate_on = not params.gate
        self.w = float(params.w)
        self.m = float(params.m)

    def begin_step(self, sampling_entropy: float) -> None:
        h = float(sampling_entropy)
        if not math.isfinite(h):
            return  # a broken entropy reading must not move the controller
        p = self.params
        self.gate_on = (h < p.h_tgt) if p.gate else True
        if p.adaptive:
            sigma = (h < p.h_tgt) - (h > p.h_tgt)  # sign(h_tgt - h)
            self.w = min(max(self.w + p.alpha * sigma, 1.0), p.w_max)
            self.m = min(max(self.m - p.alpha * sigma, p.m_min), 1.0)

    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        valid = batch.mask.bool()
        surprisal = -batch.logp
        l_plus = select_top_fraction(surprisal, valid & (batch.advantages > 0), self.params.p)
        if self.params.variant == "C2":
            l_minus = select_top_fraction(surprisal, valid & (batch.advantages < 0), self.params.p)
        else:
            l_minus = torch.zeros_like(l_plus)
        return {"stare/l_plus": l_plus, "stare/l_minus": l_minus}

    def weights(self, l_plus: torch.Tensor, l_minus: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        """omega ``[b, T]``: W on L+, M on L-, 1 elsewhere (ignores the gate)."""
        w = torch.ones(l_plus.shape, dtype=dtype, device=l_plus.device)
        w = torch.where(l_plus.bool(), torch.full_like(w, self.w), w)
        return torch.where(l_minus.bool(), torch.full_like(w, self.m), w)

    def apply(self, ctx: LossContext) -> None:
        sel = self.selection(ctx)
        l_plus, l_minus = sel["stare/l_plus"].bool(), sel["stare/l_minus"].bool()
        valid = ctx.mask.bool()
        n = max(int(valid.sum().item()), 1)
        ctx.metrics["stare/l_plus_frac"] = float((l_plus & valid).sum().item()) / n
        ctx.metrics["stare/l_minus_frac"] = float((l_minus & valid).sum().item()) / n
        if self.gate_on:  # gate closed: leave the loss untouched (bit-identical to GRPO)
            ctx.scale(self.weights(l_plus, l_minus, ctx.pg_loss.dtype))

    def step_metrics(self) -> dict[str, float]:
        return {"stare/gate_on": float(self.gate_on), "stare/w": self.w, "stare/m": self.m}

    def state_dict(self) -> dict:
        return {"gate_on": bool(self.gate_on), "w": self.w, "m": self.m}

    def load_state_dict(self, state: dict) -> None:
        self.gate_on = bool(state["gate_on"])
        self.w = float(state["w"])
        self.m = float(state["m"])
