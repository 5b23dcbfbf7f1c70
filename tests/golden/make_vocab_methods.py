"""Golden vectors of the newer full-distribution methods (AEnt, SIREN, Lp-Reg; part of
tests/golden/make_entropy_methods.py, which calls ``write_vocab_methods``): plain numpy float64
re-derivations of the authors' code, independent of entropyrl's torch code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from make_entropy_methods import AENT, LP_REG, SIREN, agg, agg_grad, out


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def restricted_entropy(z, keep):
    q = np.where(keep, softmax(np.where(keep, z, -np.inf)), 0.0)
    return -np.where(keep, q * np.log(np.where(keep, q, 1.0)), 0.0).sum(-1)


def clamped_keep(z, clamp):
    """AEnt's token-space clamp (inclusionAI/AReaL recipe/AEnt): the floor(V * clamp) lowest logits out."""
    n_out = int(z.shape[-1] * clamp)
    keep = np.ones_like(z, dtype=bool)
    if n_out > 0:
        np.put_along_axis(keep, np.argsort(z, axis=-1, kind="stable")[..., :n_out], False, axis=-1)
    return keep


def minp_log_mass(z, kappa):
    p = softmax(z)
    keep = p >= kappa * p.max(-1, keepdims=True)
    return np.log(np.where(keep, p, 0.0).sum(-1))


def topp_entropy(z, top_p, k):
    """SIREN (Linn3a/siren efficient_top_p_sampling): among the k highest logits, the tokens whose
    inclusive cumulative probability is below top_p (searchsorted-left cut), re-normalised; 0 if none."""
    p = softmax(z)
    order = np.argsort(-z, axis=-1, kind="stable")[..., : min(k, z.shape[-1])]
    sp = np.take_along_axis(p, order, -1)
    nucleus = np.zeros_like(z, dtype=bool)
    np.put_along_axis(nucleus, order, np.cumsum(sp, -1) < top_p, axis=-1)
    some = nucleus.any(-1)
    return np.where(some, restricted_entropy(z, nucleus | ~some[..., None]), 0.0)


def vocab_stats(folder: Path, clamp: float, top_p: float, kappa: float, k: int = 10000) -> dict:
    inp = json.loads((folder / "inputs.json").read_text())["inputs"]
    z = np.array(inp["logits"], dtype=float)
    p = softmax(z)
    return {
        "params": {"clamp": clamp, "top_p": top_p, "top_k": k, "kappa": kappa},
        "clamped_entropy": restricted_entropy(z, clamped_keep(z, clamp)).tolist(),
        "topp_entropy": topp_entropy(z, top_p, k).tolist(),
        "minp_log_mass": minp_log_mass(z, kappa).tolist(),
        "max_logp": np.log(p.max(-1)).tolist(),
    }


def peak_mask(h, m, q):
    """Valid tokens above their response's q-quantile (numpy's linear method, as torch.nanquantile)."""
    out = np.zeros_like(m, dtype=bool)
    for i in range(m.shape[0]):
        v = m[i] > 0
        if v.any():
            out[i] = v & (h[i] > np.quantile(h[i][v], q))
    return out


def seq_mean_token_mean_all(x, mk):
    n = mk.sum(-1)
    return float(np.where(n > 0, (x * mk).sum(-1) / np.maximum(n, 1.0), 0.0).mean())


def siren(folder: Path, p: dict, second: tuple) -> dict:
    """SIREN (Linn3a/siren dp_actor.py "siren" branch): the quantile mask applied to the top-p
    entropies, then again to the masked entropies; seq-mean-token-mean over all responses; the
    anchor is the first loss's one-pass value; term coef * (H - anchor)^2 and its gradient w.r.t. h."""
    inp = json.loads((folder / "inputs.json").read_text())["inputs"]
    z, m = np.array(inp["logits"], dtype=float), np.array(inp["mask"], dtype=float)
    h0 = topp_entropy(z, p["top_p"], p["top_k"])
    calls, anchor = [], None
    for h in (h0, h0 * second[0] + second[1]):
        m1 = peak_mask(h, m, p["quantile"])
        masked = np.where(m1, h, 0.0)
        m2 = peak_mask(masked, m, p["quantile"])
        big_h = seq_mean_token_mean_all(masked, m2.astype(float))
        if anchor is None:
            anchor = seq_mean_token_mean_all(masked, m1.astype(float))
        n2 = m2.sum(-1, keepdims=True)
        dh = np.where(m2, 1.0 / np.maximum(n2, 1.0), 0.0) / m.shape[0]
        calls.append(
            {
                "h": h.tolist(),
                "regulated": big_h,
                "anchor": anchor,
                "mask": m2.tolist(),
                "value": p["coef"] * (big_h - anchor) ** 2,
                "grad_h": (2.0 * p["coef"] * (big_h - anchor) * dh).tolist(),
            }
        )
    return {"params": p, "calls": calls}


def aent(folder: Path, p: dict, scales: list, splits: list) -> dict:
    """AEnt (inclusionAI/AReaL recipe/AEnt): per loss -coef * token-mean(H_clamp); after step g
    (0-based) with g > warmup_steps the coefficient moves by -lr * (min(0, H - low) + max(0, H - high)),
    H the step's token-mean clamped entropy, then is boxed. Each step's losses see the stored
    clamped entropy times that step's scale, split in row groups."""
    inp = json.loads((folder / "inputs.json").read_text())["inputs"]
    z, m = np.array(inp["logits"], dtype=float), np.array(inp["mask"], dtype=float)
    hc = restricted_entropy(z, clamped_keep(z, p["clamp"]))
    coef, steps = p["init_coef"], []
    for g, s in enumerate(scales):
        h = hc * s
        losses = [{"rows": rows, "value": -coef * agg(h[rows], m[rows], "token-mean")} for rows in splits]
        hbar = float((h * m).sum() / m.sum())
        if p["adaptive"] and g > p["warmup_steps"]:
            coef = coef - p["lr"] * (min(0.0, hbar - p["low"]) + max(0.0, hbar - p["high"]))
            coef = min(max(coef, p["coef_min"]), p["coef_max"])
        steps.append({"scale": s, "losses": losses, "step_entropy": hbar, "coef_after": coef})
    return {"params": p, "steps": steps}


def lp_reg_batch(seed: int = 7, b: int = 6, t: int = 8, v: int = 16) -> dict:
    rng = np.random.default_rng(seed)
    lengths = np.array([8, 5, 7, 3, 8, 6])[:b]
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(float)
    logits = rng.normal(0.0, 2.5, size=(b, t, v))
    cdf = np.cumsum(softmax(logits), -1)  # tokens sampled from the policy
    tokens = np.minimum((cdf < rng.random(size=(b, t, 1))).sum(-1), v - 1)
    logp = np.take_along_axis(np.log(softmax(logits)), tokens[..., None], -1)[..., 0]
    old = logp + rng.normal(0.0, 0.3, size=(b, t))
    adv = rng.normal(0.0, 1.0, size=b)[:, None] * mask
    return {"mask": mask, "logits": logits, "tokens": tokens, "logp": logp, "old_logp": old, "advantages": adv}


def lp_reg(x: dict, p: dict, lo: float, hi: float) -> dict:
    """Lp-Reg (CarlanLark/Lp-Reg-dev compute_policy_loss_lp_reg + apply_min_p): the proxy target is
    the sampled token's log-prob after the min-p filter (dropped logits set to -1e4); among the valid
    A < 0 tokens the k = max(1, int(n * rho)) lowest-logp ones (none if k == 1) with logp < target
    take -A rho + coef * clip(k3, -10, 10); all others max(-A rho, -A clip(rho)); token-mean."""
    m, a, lp = x["mask"], x["advantages"], x["logp"]
    z = x["logits"].copy()
    pr = softmax(z)
    z[pr < p["kappa"] * pr.max(-1, keepdims=True)] = -1e4
    zmax = z.max(-1, keepdims=True)
    log_sm = z - zmax - np.log(np.exp(z - zmax).sum(-1, keepdims=True))
    tgt = np.take_along_axis(log_sm, x["tokens"][..., None], -1)[..., 0]
    valid = m > 0
    cand = np.zeros_like(valid)
    for sign, frac in ((-1, p["rho"]), (1, p["rho_pos"])):
        pool = valid & (np.sign(a) == sign)
        n = int(pool.sum())
        k = max(1, int(n * frac)) if n else 0
        if frac > 0 and k > 1:
            flat = np.flatnonzero(pool)
            pick = flat[np.argsort(lp.reshape(-1)[flat], kind="stable")[:k]]
            cand.reshape(-1)[pick] = True
    sel = cand & (lp < tgt)
    rho = np.exp(lp - x["old_logp"])
    l1, l2 = -a * rho, -a * np.clip(rho, 1 - lo, 1 + hi)
    base = np.maximum(l1, l2)
    gbase = np.where(l2 > l1, 0.0, -a * rho)
    d = tgt - lp
    k3 = np.exp(d) - d - 1.0
    k3c = np.clip(k3, -10.0, 10.0)
    dk3 = np.where((k3 > 10.0) | (k3 < -10.0), 0.0, 1.0 - np.exp(d))
    val = np.where(sel, -a * rho + p["coef"] * k3c, base)
    g = np.where(sel, -a * rho + p["coef"] * dk3, gbase)
    kl_part = agg(np.where(sel, p["coef"] * k3c, 0.0), m, "token-mean")
    return {
        "params": p,
        "clip": [lo, hi],
        "proxy_logp": tgt.tolist(),
        "selected": sel.tolist(),
        "kl_term": kl_part,
        **out(agg(val, m, "token-mean"), agg_grad(g, m, "token-mean")),
    }


def write_vocab_methods(folder: Path) -> None:
    doc = {
        "about": "full-distribution statistics of tests/golden/inputs.json's logits (AEnt's "
        "clamped entropy, SIREN's top-p entropy, Lp-Reg's min-p kept mass); numpy float64 "
        "(tests/golden/make_entropy_methods.py)",
        "source": f"clamped_entropy: {AENT}; minp_log_mass: {LP_REG}; topp_entropy: {SIREN}",
        "cases": {
            "published": vocab_stats(folder, 0.4, 0.8, 0.02),
            "small": vocab_stats(folder, 0.2, 0.5, 0.2, 3),
            "wide": vocab_stats(folder, 0.0, 0.95, 0.05),
        },
    }
    (folder / "vocab_stats.json").write_text(json.dumps(doc, indent=1) + "\n")

    aent_p = {
        "clamp": 0.4,
        "init_coef": 0.0002,
        "adaptive": True,
        "lr": 0.001,
        "low": 0.05,
        "high": 0.23,
        "coef_min": 1e-5,
        "coef_max": 0.003,
        "warmup_steps": 1,
    }
    doc = {
        "about": "golden vectors for aent (clamped entropy term, adaptive coefficient) on "
        "tests/golden/inputs.json's logits; numpy float64 (tests/golden/make_entropy_methods.py)",
        "source": AENT,
        "cases": {
            "published": aent(folder, aent_p, [1.0, 1.0, 0.2, 0.01, 0.01, 3.0], [[0, 1, 2], [3, 4, 5]]),
            "fixed": aent(folder, {**aent_p, "adaptive": False, "clamp": 0.2}, [0.01, 5.0], [[0, 1, 2, 3, 4, 5]]),
            "boxed": aent(
                folder, {**aent_p, "lr": 0.5, "warmup_steps": 0, "clamp": 0.0}, [0.001, 0.001, 9.0, 9.0], [[0, 1], [2, 3, 4, 5]]
            ),
        },
    }
    (folder / "aent.json").write_text(json.dumps(doc, indent=1) + "\n")

    siren_p = {"top_p": 0.8, "top_k": 10000, "quantile": 0.8, "coef": 0.005}
    doc = {
        "about": "golden vectors for siren on tests/golden/inputs.json's logits; numpy float64 "
        "(tests/golden/make_entropy_methods.py)",
        "source": SIREN,
        "cases": {
            "published": siren(folder, siren_p, (1.3, 0.05)),
            "half": siren(folder, {**siren_p, "top_p": 0.95, "top_k": 6, "quantile": 0.5, "coef": 2.0}, (0.7, 0.0)),
        },
    }
    (folder / "siren.json").write_text(json.dumps(doc, indent=1) + "\n")

    y = lp_reg_batch()
    doc = {
        "about": "golden vectors for lp_reg; numpy float64 re-derivation (tests/golden/"
        "make_entropy_methods.py); its own batch with logits [6, 8, 16] and sampled tokens",
        "source": LP_REG,
        "inputs": {k: v.tolist() for k, v in y.items()},
        "cases": {
            "published": lp_reg(y, {"coef": 1.0, "kappa": 0.02, "rho": 0.01, "rho_pos": 0.0}, 1.0, 9.0),
            "wide": lp_reg(y, {"coef": 1.0, "kappa": 0.1, "rho": 0.5, "rho_pos": 0.0}, 1.0, 9.0),
            "both_signs": lp_reg(y, {"coef": 0.3, "kappa": 0.3, "rho": 0.6, "rho_pos": 0.4}, 0.2, 0.28),
        },
    }
    (folder / "lp_reg.json").write_text(json.dumps(doc, indent=1) + "\n")
