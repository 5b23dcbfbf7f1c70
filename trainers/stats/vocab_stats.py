"""Opt-in per-token statistics of the full next-token distribution (docs/algorithms.md §1b).

Most interventions need only the sampled token's log-prob and the entropy (``token_stats.py``).
A few need more of the distribution: AEnt's entropy with the lowest-logit tokens clamped away,
SIREN's entropy of the top-p nucleus, the mass Lp-Reg's min-p proxy keeps. An intervention asks for one by
returning ``{key: (name, params)}`` from ``vocab_stats()``; the loop then computes it beside
``logp`` and hands it to the loss as ``extras[key]`` (``[b, T]``, differentiable).

Each statistic is a pure function ``fn(z [c, V], **params) -> [c]`` of the scaled logits
``z = (h W^T + b) / temperature``, registered in ``VOCAB_STATS``. ``chunked_vocab_stat`` applies it
``chunk_size`` tokens at a time under activation checkpointing, so only one ``[chunk, V]`` block of
logits is alive at a time in forward and in backward (recomputed): no ``[tokens x V]`` tensor.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from ...core.registry import Registry

__all__ = [
    "VOCAB_STATS",
    "register_vocab_stat",
    "chunked_vocab_stat",
    "clamped_entropy",
    "topp_entropy",
    "minp_log_mass",
    "max_logp",
]

VOCAB_STATS: Registry = Registry("vocabulary statistic")


def register_vocab_stat(name: str):
    def deco(fn):
        VOCAB_STATS[name] = fn
        return fn

    return deco


def _entropy_of(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax`` restricted to ``keep`` (bool, same shape) and re-normalised. ``[c, V] -> [c]``."""
    z = logits.masked_fill(~keep, float("-inf"))
    logq = torch.log_softmax(z, dim=-1)
    q = logq.exp()
    return -(q * torch.where(keep, logq, torch.zeros_like(logq))).sum(-1)


@register_vocab_stat("clamped_entropy")
def clamped_entropy(z: torch.Tensor, *, clamp: float) -> torch.Tensor:
    """AEnt's clamped entropy: the ``floor(V * clamp)`` lowest-logit tokens removed (chosen on
    detached logits), the rest re-normalised; ``clamp = 0`` is the full entropy. ``[c, V] -> [c]``."""
    n_out = int(z.shape[-1] * float(clamp))
    if n_out <= 0:
        return _entropy_of(z, torch.ones_like(z, dtype=torch.bool))
    idx = torch.topk(z.detach(), n_out, dim=-1, largest=False).indices
    keep = torch.ones_like(z, dtype=torch.bool).scatter_(-1, idx, False)
    return _entropy_of(z, keep)


@register_vocab_stat("topp_entropy")
def topp_entropy(z: torch.Tensor, *, p: float, k: int = 10000) -> torch.Tensor:
    """SIREN's top-p entropy: among the ``k`` highest logits, the tokens whose cumulative probability
    (sorted, themselves included) stays below ``p`` (the token that reaches ``p`` is out), chosen on
    detached probabilities and re-normalised; 0 where none is (the top token alone reaches ``p``).
    ``[c, V] -> [c]``."""
    probs = torch.softmax(z.detach(), dim=-1)
    k = min(int(k), z.shape[-1])
    top_p, order = torch.topk(probs, k, dim=-1)
    keep_sorted = torch.cumsum(top_p, dim=-1) < p
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, keep_sorted)
    some = keep.any(-1, keepdim=True)
    h = _entropy_of(z, keep | ~some)  # rows with nothing kept: any finite value, zeroed
    return torch.where(some[..., 0], h, torch.zeros_like(h))


@register_vocab_stat("minp_log_mass")
def minp_log_mass(z: torch.Tensor, *, kappa: float) -> torch.Tensor:
    """Log of the probability mass that a min-p filter keeps (tokens with ``p >= kappa * max p``),
    detached; ``<= 0``. Lp-Reg's proxy of a kept token ``y`` is ``log pi(y) - this`` (the filtered
    distribution re-normalised). ``[c, V] -> [c]``."""
    z = z.detach()
    logp = torch.log_softmax(z, dim=-1)
    keep = logp >= logp.amax(-1, keepdim=True) + math.log(kappa)
    return torch.logsumexp(logp.masked_fill(~keep, float("-inf")), dim=-1)


@register_vocab_stat("max_logp")
def max_logp(z: torch.Tensor) -> torch.Tensor:
    """Log-probability of the most probable token (detached). ``[c, V] -> [c]``."""
    return torch.log_softmax(z.detach(), dim=-1).amax(-1)


def _block(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    fn: Callable[..., torch.Tensor],
    params: dict,
) -> torch.Tensor:
    z = torch.mm(hidden, weight.t()) if bias is None else torch.addmm(bias, hidden, weight.t())
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()
    return fn(z / temperature, **params)


def chunked_vocab_stat(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    name: str,
    params: dict,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Statistic ``name`` of every token's distribution: ``hidden [N, D]``, ``weight [V, D]`` -> ``[N]``,
    differentiable w.r.t. ``hidden``/``weight``/``bias`` when grad is enabled."""
    fn = VOCAB_STATS.lookup(name)
    outs = []
    for s in range(0, hidden.shape[0], chunk_size):
        h = hidden[s : s + chunk_size]
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            outs.append(checkpoint(_block, h, weight, bias, temperature, fn, params, use_reentrant=False))
        else:
            outs.append(_block(h, weight, bias, temperature, fn, params))
    if not outs:
        return hidden.new_zeros(0, dtype=torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype)
    return torch.cat(outs)
