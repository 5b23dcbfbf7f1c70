"""Regenerate lab_fixes.json: golden vectors for the lab's fidelity fixes, computed in plain
numpy float64 from the shared golden inputs (an implementation independent of entropyrl's torch code).

    python tests/golden/make_lab_fixes.py path/to/golden/inputs.json path/to/golden/advantages.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def agg(x, m, mode, norm=7.0):
    x = np.where(m > 0, x, 0.0)
    if mode == "token-mean":
        return float((x * m).sum() / max(m.sum(), 1.0))
    if mode == "seq-mean-token-mean":
        tok = m.sum(-1)
        seq = (x * m).sum(-1) / np.maximum(tok, 1.0)
        has = tok > 0
        return float(seq[has].mean())
    return float((x * m).sum() / norm)


def surrogate(logp, old, adv, lo, hi, c):
    rho = np.exp(np.clip(logp - old, -20, 20))
    l1, l2 = -adv * rho, -adv * np.clip(rho, 1 - lo, 1 + hi)
    lclip = np.maximum(l1, l2)
    ratio_clipped = l2 > l1
    dual = (adv < 0) & (lclip > -adv * c)
    return ratio_clipped, dual


def steer_exp(omega, m, lmin, floor=0.02):
    a = np.abs(omega)
    k = -np.log(lmin) / max(a[m > 0].max(), floor)
    return np.where(m > 0, np.clip(np.exp(-k * a), lmin, 1.0), 0.0)


def main(inputs_path: str, adv_path: str) -> None:
    inp = json.loads(Path(inputs_path).read_text())["inputs"]
    m = np.array(inp["mask"], dtype=float)
    logp, old, ent = (np.array(inp[k], dtype=float) for k in ("logp", "old_logp", "entropy"))
    adv = np.array(json.loads(Path(adv_path).read_text())["grpo"], dtype=float)[:, None] * m
    out: dict = {"about": "fidelity fixes; from tests/golden/inputs.json (grpo advantages), numpy float64"}
    out["entropy_bonus"] = {
        "coef": 0.01,
        "norm": 7.0,
        **{mode: -0.01 * agg(ent, m, mode) for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")},
    }
    fr = {}
    cases = {
        "grpo": (0.2, 0.2, 3.0, 0.0),
        "dapo": (0.2, 0.28, 10.0, 0.0),
        "tight": (0.05, 0.05, 1.5, 0.0),
        "stale_old_logp": (0.2, 0.2, 3.0, 1.2),
    }  # old_logp - 1.2: rho ~ 3.3, the dual clip binds
    for name, (lo, hi, c, shift) in cases.items():
        rc, dual = surrogate(logp, old - shift, adv, lo, hi, c)
        fr[name] = {
            "clip": [lo, hi, c],
            "old_logp_shift": shift,
            "ratio_frac": float((rc * m).sum() / m.sum()),
            "dual_frac": float((dual * m).sum() / m.sum()),
            "frac": float(((rc | dual) * m).sum() / m.sum()),
        }
    out["clip_fractions"] = fr
    # STEER with entropy_source=old: Omega from the current policy's q and the sampling policy's H.
    current_entropy = ent * 0.5 + 0.05
    q = np.clip(np.exp(logp), 1e-8, 1 - 1e-8)
    q_old = np.clip(np.exp(old), 1e-8, 1.0)
    for source, h in (("old", ent), ("current", current_entropy)):
        omega = np.where(m > 0, adv / q_old * q * (1 - q) * (np.log(q) + h), 0.0)
        out[f"steer_{source}"] = {
            "current_entropy": current_entropy.tolist(),
            "weights_exp_min0.5": steer_exp(omega, m, 0.5).tolist(),
        }
    Path(__file__).with_name("lab_fixes.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
