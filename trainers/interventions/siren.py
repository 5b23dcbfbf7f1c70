"""SIREN ("Rethinking Entropy Regularization in Large Reasoning Models", 2509.25133): selective,
self-anchored entropy regularisation.

docs/algorithms.md §5. The regulated entropy is restricted twice. (1) Top-p: each token's entropy
is that of its re-normalised nucleus, the tokens whose cumulative probability stays below
``top_p`` (``vocab_stats.topp_entropy``), so the tail does not drive it. (2) Peak entropy: per
response, only tokens above the ``quantile`` of that response's top-p entropies count; the
reference applies this mask twice (once to the entropies, then again to the masked entropies, the
zeros included), and so does this module. The masked entropies are aggregated seq-mean-token-mean
(every response in the mean, one without a peak token as 0) into ``H``. Self-anchored: the first
loss's value ``H_0`` (one mask pass, as the reference's anchor) is kept, and the loss gains
``coef * (H - H_0)^2``. Cross-checked against the authors' code (Linn3a/siren@fa59a8df
verl/workers/actor/dp_actor.py: efficient_top_p_sampling, mask_by_quantile, the "siren" branch;
ray_trainer.py: the anchor); tests/trainers/test_entropy_methods.py reproduces it. The anchor is taken as
the reference takes it: on the first step's whole batch under the sampling policy, before any
update (``observe_sampling``: the loop computes the batch's top-p entropies once, at the scoring
pass, and the per-response values are summed over ranks), so 1 or N ranks and any micro-batch size
anchor on the same value. Without that pass (a loss computed alone, as in the golden test) the
first loss's own value is the anchor. The peak mask is each response's own quantile (a response
never straddles ranks or micro-batches), so it needs no ``scope``: 1 or N ranks regulate the same
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ..algos.lab_claim import LabClaim, Lever
from .base import Intervention, LossContext, register_intervention

KEY = "siren/topp_entropy"


def peak_mask(h: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """Bool ``[B, T]``: valid tokens above their response's ``q``-quantile of ``h`` (linear, as
    ``torch.nanquantile``; a response without valid tokens has none)."""
    valid = mask.bool()
    x = h.detach()
    thr = torch.nanquantile(torch.where(valid, x, torch.full_like(x, float("nan"))), q, dim=-1, keepdim=True)
    return valid & (x > thr)


def response_means(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``[B]``: each response's token mean of ``x`` over ``m`` (0 for a response with none)."""
    n = m.sum(-1)
    return torch.where(n > 0, (x * m).sum(-1) / n.clamp(min=1.0), torch.zeros_like(n))


def seq_mean_token_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Mean over *all* responses of each one's token mean over ``m`` (0 for a response with none)."""
    return response_means(x, m).mean()


def siren_entropy(h: torch.Tensor, mask: torch.Tensor, q: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(H, H_one_pass, m2)``: the regulated entropy (two mask passes), the one-pass value the
    anchor is taken from, and the final bool mask."""
    m1 = peak_mask(h, mask, q)
    masked = torch.where(m1, h, torch.zeros_like(h))
    m2 = peak_mask(masked, mask, q)
    one = seq_mean_token_mean(masked, m1.to(h.dtype))
    return seq_mean_token_mean(masked, m2.to(h.dtype)), one, m2


@register_intervention("siren")
class Siren(Intervention):
    logged_metrics = ("siren/anchor", "siren/regulated_entropy", "loss/siren")
    lab_claim = LabClaim(
        "above_grpo",
        "SIREN's masked, anchored regulariser keeps entropy from collapsing: ends above GRPO",
        levers=(
            Lever("siren/regulated_entropy", "regulated entropy"),
            Lever("siren/anchor", "anchor"),
            Lever("siren/peak_frac", "peak tokens", "frac"),
        ),
        added_term="loss/siren",
    )
    needs_entropy_grad = False

    @dataclass
    class Params:
        """Names and types; the published values: conf/intervention/siren.yaml."""

        top_p: float  # nucleus of the top-p mask
        top_k: int  # candidates of the nucleus (highest logits)
        quantile: float  # per-response entropy quantile above which a token is regulated
        coef: float  # weight of the anchored term

        def validate(self, name: str) -> None:
            if not 0 < self.top_p <= 1 or self.top_k < 1 or not 0 <= self.quantile < 1 or self.coef < 0:
                raise UserError(f"algo.{name}: need 0 < top_p <= 1, top_k >= 1, 0 <= quantile < 1, coef >= 0")

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.anchor: float | None = None

    def vocab_stats(self) -> dict:
        return {KEY: ("topp_entropy", {"p": float(self.params.top_p), "k": int(self.params.top_k)})}

    def sampling_vocab_stats(self) -> dict:
        return self.vocab_stats() if self.anchor is None else {}  # the first step's batch, once

    def observe_sampling(self, stats: dict[str, torch.Tensor], mask: torch.Tensor, reduce=None) -> None:
        """The anchor: the one-pass value over the whole batch, every rank's responses (the sum of
        the per-response values over the number of responses, each summed over ranks)."""
        h = stats[KEY].detach().double()
        m1 = peak_mask(h, mask, self.params.quantile)
        per = response_means(torch.where(m1, h, torch.zeros_like(h)), m1.to(h.dtype))
        total = torch.stack([per.sum().cpu(), torch.tensor(float(per.numel()), dtype=torch.float64)])
        if reduce is not None:
            total = reduce(total)
        if float(total[1]) > 0:
            self.anchor = float(total[0] / total[1])

    def apply(self, ctx: LossContext) -> None:
        h = ctx.extras.get(KEY)
        if h is None:
            raise RuntimeError(f"siren: extras['{KEY}'] missing; compute Algorithm.vocab_stats() in the loss loop")
        regulated, one_pass, m2 = siren_entropy(h, ctx.mask, self.params.quantile)
        anchor = float(one_pass.detach().item()) if self.anchor is None else self.anchor  # kept by record
        ctx.extra_terms["siren"] = self.params.coef * (regulated - anchor) ** 2
        ctx.metrics["siren/anchor"] = anchor
        ctx.metrics["siren/regulated_entropy"] = float(regulated.detach().item())
        ctx.metrics["siren/peak_frac"] = float(m2.sum().item()) / max(float(ctx.mask.sum().item()), 1.0)

    def record(self, ctx: LossContext) -> None:
        if self.anchor is None and "siren/anchor" in ctx.metrics:
            self.anchor = float(ctx.metrics["siren/anchor"])

    def step_metrics(self) -> dict[str, float]:
        return {} if self.anchor is None else {"siren/anchor": self.anchor}

    def state_dict(self) -> dict:
        return {"anchor": self.anchor}

    def load_state_dict(self, state: dict) -> None:
        self.anchor = None if state.get("anchor") is None else float(state["anchor"])
