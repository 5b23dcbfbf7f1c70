"""Regenerate the golden vectors of the newer methods (ce_gppo, archer, entropy_adv, entropic,
aent, lp_reg, siren, gspo, gmpo, cispo, sapo, tis_modes, vocab_stats): plain numpy float64,
independent of entropyrl's torch code.

Each reference re-derives the arithmetic of the authors' code (the commit is stored in the file)
or, where none was readable, of the paper; losses are the aggregated scalar and ``grad`` is its
analytic derivative with respect to ``logp`` (the stop-gradients of the reference code decide
which factors are differentiated). The random batch is stored with the outputs.

    python tests/golden/make_entropy_methods.py tests/golden

The full-distribution methods (aent, siren, lp_reg, vocab_stats) live in make_vocab_methods.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

VERL = "volcengine/verl@b178a3cd56f58b2d502255daba591e92833930a7 verl/trainer/ppo/core_algos.py"
CE_GPPO = (
    "Kwai-Klear/CE-GPPO@10558fe017ac776773fd7f29753d8353a11c0813 verl/trainer/ppo/core_algos.py compute_gppo_loss_general_beta"
)
ENTROPIC = (
    "yk7333/EntroPIC@2470730c345806e15a1b235c7a2c17decc0dcd5e core_algos.py compute_policy_loss_entropic "
    "+ dp_actor.py (PI signal, per micro-batch integral; README of the same repository)"
)
AENT = (
    "inclusionAI/AReaL@a0ec9ceece6cb81cf58bb439587e466d74bf494f recipe/AEnt/functional.py "
    "clamped_softmax_entropy + actor.py (coefficient update) + configs/gsm8k_aent_grpo.yaml"
)
LP_REG = (
    "CarlanLark/Lp-Reg-dev@33b27e273b14f8eeb14c8a52209fca568b4bd718 verl/trainer/ppo/core_algos.py "
    "compute_policy_loss_lp_reg + verl/workers/actor/dp_actor.py apply_min_p"
)
SIREN = (
    "Linn3a/siren@fa59a8dfbecf5c3936ed905d5902a06c0ca425ee verl/verl/workers/actor/dp_actor.py "
    "efficient_top_p_sampling + mask_by_quantile + the siren branch; ray_trainer.py (anchor)"
)
ARCHER = (
    "wizard-III/ArcherCodeR@8a1785beff0749a5b5b7f3d8751cd19c1d0e570a verl/trainer/ppo/core_algos.py "
    "compute_policy_loss + verl/workers/actor/dp_actor.py (token entropy split, two-part KL)"
)


def batch(seed: int = 22, b: int = 6, t: int = 8) -> dict:
    rng = np.random.default_rng(seed)
    lengths = np.array([8, 5, 7, 3, 8, 6])[:b]
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(float)
    logp = -rng.gamma(1.0, 0.8, size=(b, t))
    old = logp + rng.normal(0.0, 0.3, size=(b, t))
    sampling = old + rng.normal(0.0, 0.2, size=(b, t))
    ref = logp + rng.normal(0.0, 0.5, size=(b, t))
    entropy = rng.gamma(2.0, 0.4, size=(b, t))
    adv_seq = rng.normal(0.0, 1.0, size=b)
    adv = adv_seq[:, None] * mask
    return {
        "mask": mask,
        "logp": logp,
        "old_logp": old,
        "sampling_logp": sampling,
        "ref_logp": ref,
        "entropy": entropy,
        "advantages": adv,
    }


# --- aggregation and its derivative -------------------------------------------------------------


def agg(x, m, mode):
    x = np.where(m > 0, x, 0.0)
    if mode == "token-mean":
        return float((x * m).sum() / max(m.sum(), 1.0))
    n = m.sum(-1)
    has = n > 0
    return float(((x * m).sum(-1)[has] / n[has]).mean())


def agg_grad(g, m, mode):
    """d agg(L) / d logp from the per-token derivative ``g`` of ``L``."""
    if mode == "token-mean":
        return g * m / max(m.sum(), 1.0)
    n = m.sum(-1, keepdims=True)
    rows = max(int((n[:, 0] > 0).sum()), 1)
    return np.where(n > 0, g * m / np.maximum(n, 1.0) / rows, 0.0)


def out(loss, grad, **extra):
    return {"loss": float(loss), "grad": grad.tolist(), **{k: np.asarray(v).tolist() for k, v in extra.items()}}


# --- PPO clip pieces (value, d value / d logp) -----------------------------------------------------


def ppo(rho, a, lo, hi, c):
    """Per-token dual-clip PPO: value and derivative w.r.t. logp (``lo``/``hi`` may be arrays)."""
    l1, l2 = -a * rho, -a * np.clip(rho, 1 - lo, 1 + hi)
    val = np.maximum(l1, l2)
    g = np.where(l2 > l1, 0.0, -a * rho)
    if c is not None:
        bound = -a * c
        dual = (a < 0) & (val > bound)
        val = np.where(dual, bound, val)
        g = np.where(dual, 0.0, g)
    return val, g


def ce_gppo(x, lo, hi, c, b1, b2):
    a, rho = x["advantages"], np.exp(x["logp"] - x["old_logp"])
    low = (rho < 1 - lo) & (a < 0)
    high = (rho > 1 + hi) & (a > 0)
    val = np.where(low, -b1 * (1 - lo) * a, np.where(high, -b2 * (1 + hi) * a, -rho * a))
    g = np.where(low, -b1 * (1 - lo) * a, np.where(high, -b2 * (1 + hi) * a, -rho * a))
    bound = -a * c
    dual = (a < 0) & (val > bound)
    val, g = np.where(dual, bound, val), np.where(dual, 0.0, g)
    m = x["mask"]
    return out(agg(val, m, "token-mean"), agg_grad(g, m, "token-mean"), low=low & (m > 0), high=high & (m > 0))


def archer(x, q, clips, c, kl_low, kl_high):
    m, a = x["mask"], x["advantages"]
    high = np.zeros_like(m, dtype=bool)
    for i in range(m.shape[0]):
        v = m[i] > 0
        thr = np.quantile(x["entropy"][i][v], q)  # linear interpolation, as torch.nanquantile
        high[i] = v & (x["entropy"][i] > thr)
    low = (m > 0) & ~high
    lo = np.where(high, clips["high_clip_low"], clips["low_clip_low"])
    hi = np.where(high, clips["high_clip_high"], clips["low_clip_high"])
    rho = np.exp(x["logp"] - x["old_logp"])
    val, g = ppo(rho, a, lo, hi, c)
    loss = agg(val, m, "token-mean")
    grad = agg_grad(g, m, "token-mean")
    d = x["ref_logp"] - x["logp"]
    k3, dk3 = np.exp(d) - d - 1.0, 1.0 - np.exp(d)
    for coef, part in ((kl_low, low), (kl_high, high)):
        pm = part.astype(float)
        loss += coef * agg(k3, pm, "token-mean")
        grad = grad + coef * agg_grad(dk3, pm, "token-mean")
    return out(loss, grad, high=high)


def entropy_adv(x, alpha, kappa, lo, hi, c):
    m, a = x["mask"], x["advantages"]
    psi = np.minimum(alpha * x["entropy"], np.abs(a) / kappa) * m
    val, g = ppo(np.exp(x["logp"] - x["old_logp"]), a + psi, lo, hi, c)
    return out(agg(val, m, "token-mean"), agg_grad(g, m, "token-mean"), psi=psi)


def entropic(x, p, calls, integral0, lo, hi, c):
    """EntroPIC per micro-batch loss (yk7333/EntroPIC): the PI signal from the integral before the
    call, then the dual-clip PPO token mean plus alpha times the token mean of -rho |A| over the
    valid tokens with pi > prob_threshold; the integral then grows by (H - target) * rows / mini_rows."""
    integral, out_calls = integral0, []
    for call in calls:
        rows = np.array(call["rows"])
        xm = {k: v[rows] for k, v in x.items()}
        xm["entropy"] = xm["entropy"] * call["entropy_scale"]
        m, a = xm["mask"], xm["advantages"]
        h = agg(xm["entropy"], m, "token-mean")
        e = h - p["target"]
        alpha = min(max(p["kp"] * e + p["ki"] * integral, -p["alpha_max"]), p["alpha_max"])
        rho = np.exp(np.clip(xm["logp"] - xm["old_logp"], -20, 20))
        val, g = ppo(rho, a, lo, hi, c)
        high = ((m > 0) & (xm["logp"] > np.log(p["prob_threshold"]))).astype(float)
        loss = agg(val, m, "token-mean") + alpha * agg(-rho * np.abs(a), high, "token-mean")
        grad = agg_grad(g, m, "token-mean") + alpha * agg_grad(-rho * np.abs(a), high, "token-mean")
        integral = integral + e * len(rows) / call["mini_rows"]
        out_calls.append(
            {**call, "entropy_mean": h, "alpha": alpha, "integral": integral, "high": high.tolist(), **out(loss, grad)}
        )
    return {"params": p, "clip": [lo, hi, c], "integral0": integral0, "calls": out_calls}


def gspo(x, lo, hi):
    m, a = x["mask"], x["advantages"]
    n = np.maximum(m.sum(-1), 1.0)
    s = np.exp(np.minimum(((x["logp"] - x["old_logp"]) * m).sum(-1) / n, 10.0))[:, None] * np.ones_like(m)
    l1, l2 = -a * s, -a * np.clip(s, 1 - lo, 1 + hi)
    val = np.maximum(l1, l2)
    capped = (((x["logp"] - x["old_logp"]) * m).sum(-1) / n > 10.0)[:, None]
    g = np.where((l2 > l1) | capped, 0.0, -a * s)
    return out(agg(val, m, "seq-mean-token-mean"), agg_grad(g, m, "seq-mean-token-mean"), seq_ratio=s[:, 0])


def gmpo(x, lo, hi):
    m, a = x["mask"], x["advantages"]
    d = x["logp"] - x["old_logp"]
    sgn = np.sign(a)
    dc = np.clip(d, -lo, hi)
    take_clip = sgn * dc < sgn * d
    dmin = np.where(take_clip, dc, d) * (sgn != 0)
    n = m.sum(-1)
    ratio = np.exp((dmin * m).sum(-1) / (n + 1e-8))
    aseq = (a * m).sum(-1) / (n + 1e-8)
    per_seq = -aseq * ratio
    loss = per_seq.mean()  # verl: torch.mean over responses
    live = (~take_clip) & (sgn != 0) & (m > 0)
    grad = (-aseq * ratio / (n + 1e-8))[:, None] * live / m.shape[0]
    return out(loss, grad, seq_ratio=ratio)


def cispo(x, lo, hi):
    m, a = x["mask"], x["advantages"]
    w = np.clip(np.exp(x["logp"] - x["old_logp"]), 1 - lo, 1 + hi)
    val, g = -w * a * x["logp"], -w * a
    return out(agg(val, m, "token-mean"), agg_grad(g, m, "token-mean"), weight=w * m)


def sapo(x, tau_pos, tau_neg):
    m, a = x["mask"], x["advantages"]
    rho = np.exp(x["logp"] - x["old_logp"])
    tau = np.where(a > 0, tau_pos, tau_neg)
    sig = 1.0 / (1.0 + np.exp(-tau * (rho - 1.0)))
    val = -a * sig * 4.0 / tau
    g = -a * 4.0 * sig * (1.0 - sig) * rho
    return out(agg(val, m, "seq-mean-token-mean"), agg_grad(g, m, "seq-mean-token-mean"))


def gtpo(x, groups, a1, a2):
    m, a, h = x["mask"], x["advantages"], np.maximum(x["entropy"], 1e-6)
    shaped = a.copy()
    b, t = m.shape
    for g in set(groups):
        for s in (1.0, -1.0):
            for pos in range(t):
                rows = [i for i in range(b) if groups[i] == g and m[i, pos] > 0 and np.sign(a[i, pos]) == s]
                if not rows:
                    continue
                xs = [h[i, pos] if s > 0 else 1.0 / h[i, pos] for i in rows]
                for i, xi in zip(rows, xs):
                    shaped[i, pos] = a[i, pos] * (a1 + a2 * len(rows) * xi / sum(xs))
    return {"groups": list(groups), "alpha": [a1, a2], "advantages": shaped.tolist()}


def tis_modes(x, p):
    m = x["mask"] > 0
    d = x["old_logp"] - x["sampling_logp"]
    r = np.exp(d)
    n = np.maximum(m.sum(-1), 1)
    geo = np.exp((d * m).sum(-1) / n)
    res = {
        "token": np.minimum(r, p["cap"]) * m,
        "mis": np.where(r <= p["cap"], r, 0.0) * m,
        "icepop": np.where((r >= p["icepop_low"]) & (r <= p["icepop_high"]), r, 0.0) * m,
        "seq_mask": (((geo >= p["seq_low"]) & (geo <= p["seq_high"]))[:, None] * m).astype(float),
    }
    return {"params": p, **{k: v.tolist() for k, v in res.items()}}


def main(folder: str) -> None:
    x = batch()
    inputs = {k: v.tolist() for k, v in x.items()}
    neg = {**x, "advantages": -x["advantages"]}  # the other side of every clip
    folder = Path(folder)

    def write(name, source, cases):
        doc = {
            "about": f"golden vectors for {name}; numpy float64 re-derivation (tests/golden/make_entropy_methods.py)",
            "source": source,
            "inputs": inputs,
            **cases,
        }
        (folder / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")

    write(
        "ce_gppo",
        CE_GPPO,
        {
            "cases": {
                "published_7b": {"clip": [0.2, 0.2, 10.0], "beta": [0.75, 1.0], **ce_gppo(x, 0.2, 0.2, 10.0, 0.75, 1.0)},
                "default_yaml": {"clip": [0.2, 0.2, 10.0], "beta": [0.25, 1.0], **ce_gppo(x, 0.2, 0.2, 10.0, 0.25, 1.0)},
                "tight": {"clip": [0.1, 0.1, 3.0], "beta": [0.5, 0.8], **ce_gppo(x, 0.1, 0.1, 3.0, 0.5, 0.8)},
            }
        },
    )
    clips = {"low_clip_low": 0.2, "low_clip_high": 0.2, "high_clip_low": 0.5, "high_clip_high": 0.5}
    write(
        "archer",
        ARCHER,
        {
            "cases": {
                "published": {
                    "params": {"quantile": 0.8, **clips, "low_kl_coef": 0.001, "high_kl_coef": 0.0},
                    "dual_c": 10.0,
                    **archer(x, 0.8, clips, 10.0, 0.001, 0.0),
                },
                "both_kl": {
                    "params": {"quantile": 0.6, **clips, "low_kl_coef": 0.01, "high_kl_coef": 0.005},
                    "dual_c": 3.0,
                    **archer(x, 0.6, clips, 3.0, 0.01, 0.005),
                },
            }
        },
    )
    write(
        "entropy_adv",
        "Cheng et al. 2025 (2506.14758), from the paper: no public code read",
        {
            "cases": {
                "published": {
                    "params": {"alpha": 0.4, "kappa": 2.0},
                    "clip": [0.2, 0.2, 3.0],
                    **entropy_adv(x, 0.4, 2.0, 0.2, 0.2, 3.0),
                },
                "strong": {
                    "params": {"alpha": 2.0, "kappa": 1.5},
                    "clip": [0.2, 0.28, 10.0],
                    **entropy_adv(x, 2.0, 1.5, 0.2, 0.28, 10.0),
                },
            }
        },
    )
    pic = {"target": 0.1, "kp": 1.0, "ki": 0.01, "alpha_max": 1.0, "prob_threshold": 0.95}
    halves = [{"rows": [0, 1, 2], "mini_rows": 6}, {"rows": [3, 4, 5], "mini_rows": 6}]
    write(
        "entropic",
        ENTROPIC,
        {
            "cases": {
                "published": entropic(x, pic, [{**c, "entropy_scale": 1.0} for c in halves] * 2, 0.0, 0.2, 0.2, 3.0),
                "below_target": entropic(
                    x,
                    {**pic, "target": 1.5, "prob_threshold": 0.5},
                    [{**c, "entropy_scale": s} for s, c in zip((1.0, 0.8, 0.6), halves * 2)],
                    0.3,
                    0.2,
                    0.28,
                    10.0,
                ),
                "saturated": entropic(
                    x,
                    {**pic, "kp": 5.0, "ki": 0.5, "alpha_max": 0.5, "prob_threshold": 0.3},
                    [{"rows": [0, 1, 2, 3, 4, 5], "mini_rows": 6, "entropy_scale": 1.0}] * 3,
                    -0.2,
                    0.2,
                    0.2,
                    3.0,
                ),
            }
        },
    )
    write(
        "gspo",
        VERL + " compute_policy_loss_gspo",
        {
            "cases": {
                "published": {"clip": [3e-4, 4e-4], **gspo(x, 3e-4, 4e-4)},
                "wide": {"clip": [0.05, 0.08], **gspo(x, 0.05, 0.08)},
                "negated_adv": {"clip": [3e-4, 4e-4], "adv_scale": -1.0, **gspo(neg, 3e-4, 4e-4)},
            }
        },
    )
    write(
        "gmpo",
        VERL + " compute_policy_loss_geo_mean",
        {
            "cases": {
                "published": {"clip": [0.4, 0.4], **gmpo(x, 0.4, 0.4)},
                "tight": {"clip": [0.1, 0.2], **gmpo(x, 0.1, 0.2)},
                "negated_adv": {"clip": [0.1, 0.2], "adv_scale": -1.0, **gmpo(neg, 0.1, 0.2)},
            }
        },
    )
    write(
        "cispo",
        VERL + " compute_policy_loss_cispo",
        {
            "cases": {
                "published": {"clip": [1.0, 0.2], **cispo(x, 1.0, 0.2)},
                "two_sided": {"clip": [0.2, 0.28], **cispo(x, 0.2, 0.28)},
            }
        },
    )
    write(
        "sapo",
        VERL + " compute_policy_loss_sapo",
        {"cases": {"published": {"tau": [1.0, 1.05], **sapo(x, 1.0, 1.05)}, "sharp": {"tau": [4.0, 8.0], **sapo(x, 4.0, 8.0)}}},
    )
    write(
        "gtpo",
        "GTPO (2508.04349), our reading of the paper: no public code read",
        {"cases": {"ours": gtpo(x, [0, 0, 0, 1, 1, 1], 1.0, 0.5), "pure_share": gtpo(x, [0, 1, 0, 1, 0, 1], 0.0, 1.0)}},
    )
    tis_p = {"cap": 1.2, "icepop_low": 0.8, "icepop_high": 1.25, "seq_low": 0.95, "seq_high": 1.05}
    write(
        "tis_modes",
        "Yao et al. 2025 (token); masked IS; IcePop; "
        + VERL.split()[0]
        + " verl/trainer/ppo/rollout_corr_helper.py seq_mean_k1 (seq_mask)",
        {
            "cases": {
                "narrow": tis_modes(x, tis_p),
                "published": tis_modes(
                    x, {"cap": 2.0, "icepop_low": 0.5, "icepop_high": 5.0, "seq_low": 0.999, "seq_high": 1.001}
                ),
            }
        },
    )
    from make_vocab_methods import write_vocab_methods  # its module imports this one

    write_vocab_methods(folder)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
