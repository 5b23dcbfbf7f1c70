"""Four-quadrant entropy diagnostics (docs/algorithms.md §6) and the first-order entropy-change estimate.

A policy-gradient step on token t moves the entropy H_t of its next-token distribution by, to first
order, ``-Omega_t`` with (STEER, "Rethinking Entropy Interventions in RLVR")

    Omega_t = (A / q_old) * q (1 - q) * (log q + H_t),   q = clamp(p, 1e-8, 1 - 1e-8)

so the sign of the change depends on the advantage sign and on whether the token's surprisal
``s = -log p`` is above or below ``H_t``:

    Q1 exploitation      A > 0, s < H   lowers entropy
    Q2 exploration       A > 0, s > H   raises entropy
    Q3 suppression       A < 0, s > H   lowers entropy
    Q4 error-correction  A < 0, s < H   raises entropy
"""

from __future__ import annotations

import torch

__all__ = [
    "entropy_change_estimate",
    "effective_entropy_change",
    "quadrant_ids",
    "quadrant_metrics",
    "QUADRANTS",
    "quantile_key",
    "sorted_quantiles",
    "entropy_quantile_metrics",
]

QUADRANTS = ("q1", "q2", "q3", "q4")
_P_MIN = 1e-8


def entropy_change_estimate(
    logp: torch.Tensor, old_logp: torch.Tensor, entropy: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``Omega [B, T]``: the first-order entropy-change indicator (predicted dH is ``-Omega``).

    All inputs ``[B, T]`` (detached here). Non-finite values and invalid tokens give 0.
    """
    with torch.no_grad():
        q = torch.clamp(torch.exp(logp), _P_MIN, 1.0 - _P_MIN)
        q_old = torch.clamp(torch.exp(old_logp), _P_MIN, 1.0)
        omega = (advantages / q_old) * q * (1.0 - q) * (torch.log(q) + entropy)
        omega = torch.where(torch.isfinite(omega), omega, torch.zeros_like(omega))
        return omega * mask.to(omega.dtype)


def effective_entropy_change(coef: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Predicted first-order entropy change ``[B, T]`` of a step whose per-token gradient on
    ``logp`` has coefficient ``coef`` (``g_t = -dLoss/dlogp_t``, all inputs ``[B, T]``).

    ``-g (1 - q)(log q + H)``: with ``g = A q / q_old`` (plain policy gradient) this is exactly
    ``-Omega`` of :func:`entropy_change_estimate`; with the intervention weights, the clip mask and
    any extra penalty folded into ``g`` it is what the configured loss actually asks for. 0 on
    invalid tokens and where the value is not finite.
    """
    with torch.no_grad():
        q = torch.clamp(torch.exp(logp), _P_MIN, 1.0 - _P_MIN)
        d = -coef * (1.0 - q) * (torch.log(q) + entropy)
        d = torch.where(torch.isfinite(d) & mask.bool(), d, torch.zeros_like(d))
        return d


def quadrant_ids(logp: torch.Tensor, entropy: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` long: 1-4 as in the module docstring, 0 for invalid tokens or ``A == 0``.

    A token with ``s == H`` (Omega = 0) counts as low-surprisal (Q1/Q4).
    """
    with torch.no_grad():
        high = (-logp) > entropy
        pos = advantages > 0
        neg = advantages < 0
        ids = torch.zeros(logp.shape, dtype=torch.long, device=logp.device)
        ids[pos & ~high] = 1
        ids[pos & high] = 2
        ids[neg & high] = 3
        ids[neg & ~high] = 4
        return ids * mask.bool().long()


def quadrant_metrics(
    logp: torch.Tensor, old_logp: torch.Tensor, entropy: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Per quadrant: token share among valid tokens and the summed predicted entropy change.

    Args: all ``[B, T]``. Returns ``{"quadrant/q1/share": float, "quadrant/q1/pred_dH": float, ...}``
    for q1-q4, plus ``"quadrant/pred_dH"`` (the sum over all valid tokens).
    """
    ids = quadrant_ids(logp, entropy, advantages, mask)
    pred = -entropy_change_estimate(logp, old_logp, entropy, advantages, mask)
    n_valid = max(float(mask.bool().sum().item()), 1.0)
    out: dict[str, float] = {}
    for i, q in enumerate(QUADRANTS, start=1):
        sel = ids == i
        out[f"quadrant/{q}/share"] = float(sel.sum().item()) / n_valid
        out[f"quadrant/{q}/pred_dH"] = float(pred[sel].sum().item())
    out["quadrant/pred_dH"] = float(pred.sum().item())
    return out


def quantile_key(q: float) -> str:
    """The metric suffix of quantile ``q``: 0.1 -> ``p10``, 0.99 -> ``p99``, 0.999 -> ``p99.9``."""
    return f"p{round(float(q) * 100, 6):g}"


def sorted_quantiles(values: torch.Tensor, qs) -> list[float]:
    """Quantiles ``qs`` (each in (0, 1)) of the 1-D ``values [N]``, linear interpolation between
    order statistics (``torch.quantile``'s default) from one sort, so any ``N`` works (``torch.quantile``
    refuses more than 2^24 elements); nan for each when ``N == 0``."""
    n = int(values.numel())
    if n == 0:
        return [float("nan")] * len(qs)
    ordered = torch.sort(values.detach().reshape(-1).double()).values
    out = []
    for q in qs:
        pos = float(q) * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        a, b = float(ordered[lo]), float(ordered[hi])
        out.append(a + (pos - lo) * (b - a))
    return out


def entropy_quantile_metrics(values: torch.Tensor, qs) -> dict[str, float]:
    """``{"entropy/p10": float, ...}``: quantiles ``qs`` of the token entropies ``values [N]``
    (the valid response tokens of a step; every rank's, gathered, for a rank-count-free figure)."""
    return {f"entropy/{quantile_key(q)}": v for q, v in zip(qs, sorted_quantiles(values, qs))}
