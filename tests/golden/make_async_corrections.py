"""Regenerate the golden vectors of the staleness corrections (``decoupled``, ``m2po``): plain numpy
float64, independent of entropyrl's torch code.

- ``decoupled``: the arithmetic of AReaL's ``ppo_actor_loss_fn`` (the commit is stored in the
  file): ratio against the proximal log-probs (here ``old_logp``), clipped and dual-clipped
  surrogate, multiplied by ``exp(prox - behav)`` zeroed where it exceeds the cap, token mean over
  the mask; ``grad`` is the analytic derivative of that loss with respect to ``logp``.
- ``m2po``: Algorithm 1 of the M2PO paper (arXiv 2510.01161) taken literally: while the mean of
  ``(log r)^2`` over the kept tokens exceeds tau, mask the kept token with the largest one. (The
  public M2PO code bounds the ratio of harmful tokens by a tau found from the same budget instead;
  the paper's masking is what ``rollout.tis.mode=m2po`` implements.)

    python tests/golden/make_async_corrections.py tests/golden
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from make_entropy_methods import batch

AREAL = "inclusionAI/AReaL@072480e26a1dc2ac1692164e504315d7e508478b areal/utils/functional.py ppo_actor_loss_fn"
M2PO = "M2PO (Zheng et al. 2025, arXiv 2510.01161) Algorithm 1; Infini-AI-Lab/M2PO@4514ce22 read for comparison"


def stale_batch(seed: int = 7) -> dict:
    """The shared batch with behaviour log-probs several steps away (larger log-ratios)."""
    x = batch()
    rng = np.random.default_rng(seed)
    x["sampling_logp"] = x["old_logp"] + rng.normal(0.0, 0.5, size=x["old_logp"].shape)
    return x


def decoupled(x: dict, cap: float, eps: float = 0.2, dual_c: float = 3.0) -> dict:
    m = x["mask"] > 0
    adv, logp, prox, behav = x["advantages"], x["logp"], x["old_logp"], x["sampling_logp"]
    weight = np.exp(prox - behav)
    weight = np.where(m & (weight <= cap), weight, 0.0)
    ratio = np.exp(logp - prox)
    loss1, loss2 = -adv * ratio, -adv * np.clip(ratio, 1 - eps, 1 + eps)
    pg = np.maximum(loss1, loss2)
    first = loss1 >= loss2  # the unclipped term is the one taken
    loss3 = np.sign(adv) * dual_c * adv
    dual = loss3 < pg
    pg = np.minimum(pg, loss3)
    count = max(int(m.sum()), 1)
    loss = float(np.where(m, pg * weight, 0.0).sum() / count)
    grad = np.where(m & first & ~dual, -adv * ratio * weight, 0.0) / count
    return {"cap": cap, "weight": weight.tolist(), "loss": loss, "grad": grad.tolist()}


def m2po(x: dict, tau: float) -> dict:
    m = x["mask"] > 0
    d = x["old_logp"] - x["sampling_logp"]
    keep = m.copy()
    sq = d**2
    while keep.any() and sq[keep].mean() > tau:
        flat = np.where(keep, sq, -np.inf)
        keep[np.unravel_index(np.argmax(flat), flat.shape)] = False
    second_moment = float(sq[keep].mean()) if keep.any() else 0.0
    return {
        "tau": tau,
        "keep": keep.astype(float).tolist(),
        "weight": np.where(keep, np.exp(d), 0.0).tolist(),
        "second_moment_before": float(sq[m].mean()),
        "second_moment_kept": second_moment,
    }


def main(folder: str) -> None:
    cases = {}
    for name, x in (("fresh", batch()), ("stale", stale_batch())):
        cases[name] = {
            "inputs": {k: x[k].tolist() for k in ("logp", "old_logp", "sampling_logp", "advantages", "mask")},
            "decoupled": [decoupled(x, 2.0), decoupled(x, 1.2)],
            "m2po": [m2po(x, 0.04), m2po(x, 0.01)],
        }
    doc = {
        "about": "golden vectors for the staleness corrections; numpy float64 (tests/golden/make_async_corrections.py)",
        "source": f"{AREAL}; {M2PO}",
        "cases": cases,
    }
    (Path(folder) / "async_corrections.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
