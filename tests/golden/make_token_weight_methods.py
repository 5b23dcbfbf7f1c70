"""Regenerate the golden vectors of the token-weighting and entropy-term methods that are not in
the other generators: ``high_entropy_mask`` (Wang et al. 2025, "Beyond the 80/20 Rule"),
``sample_reweight`` (W-REINFORCE, Zhu et al. 2025) and ``adaptive_entropy`` (an entropy bonus
whose coefficient steps toward a target entropy). Plain numpy float64, independent of entropyrl's
torch code; same batch, aggregation and PPO pieces as make_entropy_methods.py.

    python tests/golden/make_token_weight_methods.py tests/golden
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from make_entropy_methods import agg, agg_grad, batch, out, ppo  # noqa: E402

CLIP = (0.2, 0.2, 3.0)


def high_entropy_mask(x, rho):
    """The top ``k = max(1, ceil(rho * n))`` valid tokens by entropy (n valid tokens) keep their
    PPO loss; the others weigh 0; the token-mean denominator stays all valid tokens."""
    m = x["mask"]
    valid = np.flatnonzero(m.reshape(-1) > 0)
    k = min(len(valid), max(1, math.ceil(rho * len(valid) - 1e-9)))
    order = valid[np.argsort(-x["entropy"].reshape(-1)[valid], kind="stable")]
    keep = np.zeros(m.size, dtype=bool)
    keep[order[:k]] = True
    keep = keep.reshape(m.shape)
    val, g = ppo(np.exp(x["logp"] - x["old_logp"]), x["advantages"], *CLIP)
    w = keep.astype(float)
    return out(agg(val * w, m, "token-mean"), agg_grad(g * w, m, "token-mean"), keep=keep)


def sample_reweight(x, pos, neg):
    """Tokens of positive-advantage responses weigh ``pos``, of negative ones ``neg``, zero-advantage 1."""
    a, m = x["advantages"], x["mask"]
    w = np.where(a > 0, pos, np.where(a < 0, neg, 1.0))
    val, g = ppo(np.exp(x["logp"] - x["old_logp"]), a, *CLIP)
    return out(agg(val * w, m, "token-mean"), agg_grad(g * w, m, "token-mean"))


def adaptive_coefficients(entropies, init, target, delta, lo, hi):
    """beta after each step's reading: +delta below target, -delta above, unchanged at it or on a
    non-finite reading, clipped to [lo, hi]."""
    beta, seen = init, []
    for h in entropies:
        if math.isfinite(h):
            beta = min(max(beta + (delta if h < target else -delta if h > target else 0.0), lo), hi)
        seen.append(beta)
    return seen


def main(folder: str) -> None:
    x = batch()
    inputs = {k: v.tolist() for k, v in x.items()}
    folder = Path(folder)

    def write(name, source, cases):
        doc = {
            "about": f"golden vectors for {name}; numpy float64 re-derivation (tests/golden/make_token_weight_methods.py)",
            "source": source,
            "clip": list(CLIP),
            "inputs": inputs,
            **cases,
        }
        (folder / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")

    write(
        "high_entropy_mask",
        "Wang et al. 2025 (2506.01939), top-rho entropy tokens keep the policy gradient",
        {
            "cases": {
                "published": {"params": {"rho": 0.2}, **high_entropy_mask(x, 0.2)},
                "half": {"params": {"rho": 0.5}, **high_entropy_mask(x, 0.5)},
                "all": {"params": {"rho": 1.0}, **high_entropy_mask(x, 1.0)},
            }
        },
    )
    write(
        "sample_reweight",
        "Zhu et al. 2025 (2506.01347), W-REINFORCE sample weights",
        {
            "cases": {
                "published": {"params": {"pos_weight": 0.1, "neg_weight": 1.0}, **sample_reweight(x, 0.1, 1.0)},
                "both": {"params": {"pos_weight": 0.5, "neg_weight": 2.0}, **sample_reweight(x, 0.5, 2.0)},
            }
        },
    )
    readings = [0.5, 0.31, 0.3, 0.2, 0.1, float("nan"), 0.05, 0.02, 0.4, 0.6, 0.25]
    p = {"init_coef": 0.01, "target": 0.3, "delta": 0.005, "coef_min": 0.0, "coef_max": 0.02}
    beta = adaptive_coefficients(readings, 0.01, 0.3, 0.005, 0.0, 0.02)
    m = x["mask"]
    # the loss term -beta * token-mean(H) at the last coefficient; d/dH = -beta * m / n
    write(
        "adaptive_entropy",
        "entropy bonus with a coefficient stepped toward a target (Skywork-OR1's adaptive "
        "entropy control, as docs/algorithms.md §5 states it)",
        {
            "cases": {
                "stepped": {
                    "params": p,
                    "readings": [None if not math.isfinite(h) else h for h in readings],
                    "coef": beta,
                    "term": -beta[-1] * agg(x["entropy"], m, "token-mean"),
                    "term_grad_entropy": (-beta[-1] * agg_grad(np.ones_like(m), m, "token-mean")).tolist(),
                }
            }
        },
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
