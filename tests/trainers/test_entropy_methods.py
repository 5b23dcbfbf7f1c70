"""The newer methods reproduce their golden vectors (tests/golden/<name>.json, numpy float64
re-derivations of the authors' code or paper, tests/golden/make_entropy_methods.py): the loss
and its gradient with respect to ``logp`` through ``Algorithm.loss``, to 1e-6 in float64."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from entropyrl.conf import CONF_DIR
from entropyrl.core.errors import UserError
from entropyrl.sweeps.ablation import default_variants, training_variants
from entropyrl.sweeps.lab.method_claims import method_claims, registered_lab_claims
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.interventions.tis import mismatch_weight
from entropyrl.trainers.stats.vocab_stats import VOCAB_STATS, chunked_vocab_stat

GOLDEN = Path(__file__).parents[1] / "golden"
TOL = dict(rtol=1e-6, atol=1e-6)
FILES = (
    "gtpo",
    "ce_gppo",
    "archer",
    "entropy_adv",
    "entropic",
    "aent",
    "lp_reg",
    "siren",
    "gspo",
    "gmpo",
    "cispo",
    "sapo",
    "tis_modes",
    "vocab_stats",
    "high_entropy_mask",
    "sample_reweight",
    "adaptive_entropy",
)


def load(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def run(
    cfg: dict, inputs: dict, *, begin: list[float] = (), extras: dict | None = None, adv_scale: float = 1.0, sampler_logp=None
):
    """(algorithm, loss output, d loss / d logp) of the stored batch under ``cfg``."""
    a = Algorithm.from_config(cfg, max_response_length=8)
    for h in begin:
        a.begin_step(h)
    logp = t64(inputs["logp"]).requires_grad_(True)
    out = a.loss(
        logp=logp,
        old_logp=t64(inputs["old_logp"]),
        entropy=t64(inputs["entropy"]),
        advantages=adv_scale * t64(inputs["advantages"]),
        mask=t64(inputs["mask"]),
        ref_logp=t64(inputs["ref_logp"]) if a.needs_ref else None,
        extras=extras,
        sampler_logp=sampler_logp,
    )
    (grad,) = torch.autograd.grad(out.loss, logp)
    return a, out, grad


def check(out, grad, want: dict) -> None:
    torch.testing.assert_close(out.loss.detach(), torch.tensor(want["loss"], dtype=torch.float64), **TOL)
    torch.testing.assert_close(grad, t64(want["grad"]), **TOL)


def cases(name: str):
    return [(name, case) for case in load(name)["cases"]]


def test_every_file_names_its_source():
    for name in FILES:
        doc = load(name)
        assert doc["source"] and doc["cases"], name
        if name in ("ce_gppo", "archer", "entropic", "aent", "lp_reg", "siren", "gspo", "gmpo", "cispo", "sapo"):
            assert "@" in doc["source"], f"{name}: the commit of the reference code read"


@pytest.mark.parametrize("case", load("ce_gppo")["cases"])
def test_ce_gppo(case):
    g = load("ce_gppo")
    want = g["cases"][case]
    lo, hi, c = want["clip"]
    cfg = {
        "clip": {"low": lo, "high": hi, "dual_c": c},
        "interventions": ["ce_gppo"],
        "ce_gppo": {"beta1": want["beta"][0], "beta2": want["beta"][1]},
    }
    _, out, grad = run(cfg, g["inputs"])
    check(out, grad, want)
    n = t64(g["inputs"]["mask"]).sum()
    assert out.metrics["ce_gppo/low_frac"] == pytest.approx(float(t64(want["low"]).sum() / n))
    assert out.metrics["ce_gppo/high_frac"] == pytest.approx(float(t64(want["high"]).sum() / n))


@pytest.mark.parametrize("case", load("archer")["cases"])
def test_archer(case):
    g = load("archer")
    want = g["cases"][case]
    cfg = {"clip": {"dual_c": want["dual_c"]}, "interventions": ["archer"], "archer": want["params"]}
    a, out, grad = run(cfg, g["inputs"])
    assert a.needs_ref
    check(out, grad, want)
    high = t64(want["high"])
    assert out.metrics["archer/high_frac"] == pytest.approx(float(high.sum() / t64(g["inputs"]["mask"]).sum()))


@pytest.mark.parametrize("case", load("entropy_adv")["cases"])
def test_entropy_adv(case):
    g = load("entropy_adv")
    want = g["cases"][case]
    lo, hi, c = want["clip"]
    cfg = {"clip": {"low": lo, "high": hi, "dual_c": c}, "interventions": ["entropy_adv"], "entropy_adv": want["params"]}
    _, out, grad = run(cfg, g["inputs"])
    check(out, grad, want)
    psi = t64(want["psi"])
    assert out.metrics["entropy_adv/psi_mean"] == pytest.approx(float(psi.sum() / t64(g["inputs"]["mask"]).sum()))


@pytest.mark.parametrize("name, case", cases("high_entropy_mask") + cases("sample_reweight"))
def test_token_weights(name, case):
    g = load(name)
    want = g["cases"][case]
    lo, hi, c = g["clip"]
    cfg = {"clip": {"low": lo, "high": hi, "dual_c": c}, "interventions": [name], name: want["params"]}
    _, out, grad = run(cfg, g["inputs"])
    check(out, grad, want)
    if name == "high_entropy_mask":
        keep, mask = t64(want["keep"]), t64(g["inputs"]["mask"])
        assert out.metrics["high_entropy_mask/frac"] == pytest.approx(float(keep.sum() / mask.sum()))


def test_adaptive_entropy_coefficient_and_term():
    g = load("adaptive_entropy")
    want = g["cases"]["stepped"]
    a = Algorithm.from_config({"interventions": ["adaptive_entropy"], "adaptive_entropy": want["params"]}, max_response_length=8)
    for h, coef in zip(want["readings"], want["coef"]):
        a.begin_step(float("nan") if h is None else h)
        assert a.step_metrics()["entropy_bonus/coef"] == pytest.approx(coef, abs=1e-12)
    inp = g["inputs"]
    entropy = t64(inp["entropy"]).requires_grad_(True)
    out = a.loss(
        logp=t64(inp["logp"]),
        old_logp=t64(inp["old_logp"]),
        entropy=entropy,
        advantages=t64(inp["advantages"]),
        mask=t64(inp["mask"]),
    )
    assert out.metrics["loss/entropy_bonus"] == pytest.approx(want["term"], rel=1e-9)
    (grad,) = torch.autograd.grad(out.loss, entropy)
    torch.testing.assert_close(grad, t64(want["term_grad_entropy"]), **TOL)


@pytest.mark.parametrize("case", load("gtpo")["cases"])
def test_gtpo_advantages(case):
    g = load("gtpo")
    want = g["cases"][case]
    inp = g["inputs"]
    a1, a2 = want["alpha"]
    algo = Algorithm.from_config({"interventions": ["gtpo"], "gtpo": {"alpha1": a1, "alpha2": a2}}, max_response_length=8)
    mask = t64(inp["mask"])
    shaped = algo.interventions[0].shape_advantages(
        t64(inp["advantages"]), t64(inp["entropy"]), torch.tensor(want["groups"]), mask
    )
    torch.testing.assert_close(shaped, t64(want["advantages"]), **TOL)
    assert algo.step_metrics()["gtpo/share_max"] > 1.0
    with pytest.raises(ValueError, match="entropy"):
        algo.advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 3))


@pytest.mark.parametrize("case", load("entropic")["cases"])
def test_entropic_matches_reference(case):
    """yk7333/EntroPIC: per micro-batch PI signal, integral by row share, the -rho|A| term on
    high-probability tokens; loss and gradient of every call, alpha and integral after it."""
    g = load("entropic")
    want = g["cases"][case]
    lo, hi, c = want["clip"]
    cfg = {"clip": {"low": lo, "high": hi, "dual_c": c}, "interventions": ["entropic"], "entropic": want["params"]}
    a = Algorithm.from_config(cfg, max_response_length=8)
    a.interventions[0].load_state_dict({"integral": want["integral0"], "alpha": 0.0})
    inp = {k: t64(v) for k, v in g["inputs"].items()}
    for call in want["calls"]:
        rows = torch.tensor(call["rows"])
        logp = inp["logp"][rows].clone().requires_grad_(True)
        mask = inp["mask"][rows]
        extras = {"entropic/mini_rows": torch.full_like(mask, float(call["mini_rows"]))}
        out = a.loss(
            logp=logp,
            old_logp=inp["old_logp"][rows],
            entropy=inp["entropy"][rows] * call["entropy_scale"],
            advantages=inp["advantages"][rows],
            mask=mask,
            extras=extras,
        )
        (grad,) = torch.autograd.grad(out.loss, logp)
        check(out, grad, call)
        assert out.metrics["entropic/alpha"] == pytest.approx(call["alpha"], abs=1e-12)
        a.after_loss(out)
        assert a.step_metrics()["entropic/integral"] == pytest.approx(call["integral"], abs=1e-12)
        assert out.metrics["entropic/high_frac"] == pytest.approx(float(t64(call["high"]).sum() / mask.sum()))
    # the attribution rebuilds a committed micro-batch's loss (the same logp tensor): same alpha, same loss
    again = a.loss(
        logp=logp,
        old_logp=inp["old_logp"][rows],
        entropy=inp["entropy"][rows] * call["entropy_scale"],
        advantages=inp["advantages"][rows],
        mask=mask,
        extras=extras,
    )
    assert again.metrics["entropic/alpha"] == out.metrics["entropic/alpha"]
    torch.testing.assert_close(again.loss, out.loss, rtol=0, atol=0)
    # the integral state survives a checkpoint round trip
    fresh = Algorithm.from_config(cfg, max_response_length=8)
    fresh.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert fresh.step_metrics() == a.step_metrics()


@pytest.mark.parametrize("name,case", cases("gspo") + cases("gmpo") + cases("cispo"))
def test_clipped_objectives(name, case):
    g = load(name)
    want = g["cases"][case]
    lo, hi = want["clip"]
    agg = "token-mean" if name == "cispo" else "seq-mean-token-mean"
    _, out, grad = run(
        {"objective": name, "clip": {"low": lo, "high": hi}, "loss_agg": agg}, g["inputs"], adv_scale=want.get("adv_scale", 1.0)
    )
    check(out, grad, want)


@pytest.mark.parametrize("case", load("sapo")["cases"])
def test_sapo(case):
    g = load("sapo")
    want = g["cases"][case]
    tau_pos, tau_neg = want["tau"]
    _, out, grad = run(
        {"objective": "sapo", "objective_args": {"tau_pos": tau_pos, "tau_neg": tau_neg}, "loss_agg": "seq-mean-token-mean"},
        g["inputs"],
    )
    check(out, grad, want)


@pytest.mark.parametrize("case", load("tis_modes")["cases"])
@pytest.mark.parametrize("mode", ["token", "mis", "icepop", "seq_mask"])
def test_tis_modes(case, mode):
    g = load("tis_modes")
    want = g["cases"][case]
    inp = g["inputs"]
    p = want["params"]
    w, _ = mismatch_weight(mode, t64(inp["old_logp"]), t64(inp["sampling_logp"]), t64(inp["mask"]), **p)
    torch.testing.assert_close(w.double(), t64(want[mode]), rtol=1e-6, atol=1e-6)
    # through the loss: the weights multiply the GRPO per-token loss
    cfg = {"interventions": ["tis"], "tis": {**p, "mode": mode}}
    _, out, _ = run(cfg, inp, sampler_logp=t64(inp["sampling_logp"]))
    _, plain, _ = run({}, inp)
    assert out.metrics["rollout/tis_weight_mean"] == pytest.approx(
        float(t64(want[mode]).sum() / t64(inp["mask"]).sum()), rel=1e-6
    )
    assert (out.loss != plain.loss) or torch.all(t64(want[mode])[t64(inp["mask"]) > 0] == 1.0)


def test_default_objective_is_bit_identical_to_the_clipped_surrogate():
    g = load("gspo")
    _, default, gd = run({}, g["inputs"])
    _, named, gn = run({"objective": "ppo_clip"}, g["inputs"])
    assert torch.equal(default.loss, named.loss) and torch.equal(gd, gn)


def test_bad_objective_and_args_are_user_errors():
    with pytest.raises(UserError, match="unknown algo.objective=nope; valid: "):
        Algorithm.from_config({"objective": "nope"}, max_response_length=4)
    with pytest.raises(UserError, match="tau_pos"):
        Algorithm.from_config({"objective": "sapo", "objective_args": {"tau": 1.0}}, max_response_length=4)
    with pytest.raises(UserError, match="mode"):
        Algorithm.from_config({"interventions": ["tis"], "tis": {"mode": "bogus"}}, max_response_length=4)


# --- full-distribution statistics (AEnt, SIREN, Lp-Reg) -------------------------------------------


def vocab_inputs():
    inp = json.loads((GOLDEN / "inputs.json").read_text())["inputs"]
    return t64(inp["logits"]), t64(inp["mask"]), t64(inp["logp"]), inp


@pytest.mark.parametrize("case", load("vocab_stats")["cases"])
def test_vocab_statistics_match_numpy(case):
    want = load("vocab_stats")["cases"][case]
    z, mask, _, _ = vocab_inputs()
    p = want["params"]
    flat = z.reshape(-1, z.shape[-1])
    got = {
        "clamped_entropy": VOCAB_STATS["clamped_entropy"](flat, clamp=p["clamp"]),
        "topp_entropy": VOCAB_STATS["topp_entropy"](flat, p=p["top_p"], k=p["top_k"]),
        "minp_log_mass": VOCAB_STATS["minp_log_mass"](flat, kappa=p["kappa"]),
        "max_logp": VOCAB_STATS["max_logp"](flat),
    }
    for key, val in got.items():
        torch.testing.assert_close(val.view(z.shape[:2]), t64(want[key]), **TOL)


@pytest.mark.parametrize(
    "name,params", [("clamped_entropy", {"clamp": 0.4}), ("topp_entropy", {"p": 0.8}), ("topp_entropy", {"p": 0.95, "k": 5})]
)
def test_vocab_statistics_are_differentiable_and_chunking_changes_nothing(name, params):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(13, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    direct = VOCAB_STATS[name]((hidden @ weight.t()) / 0.7, **params)
    chunked = chunked_vocab_stat(hidden, weight, name, params, temperature=0.7, chunk_size=4)
    torch.testing.assert_close(chunked, direct, **TOL)
    g1 = torch.autograd.grad(direct.sum(), (hidden, weight))
    g2 = torch.autograd.grad(chunked.sum(), (hidden, weight))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, **TOL)
    assert g1[0].abs().sum() > 0
    # the selection (clamp / nucleus) is fixed locally: the gradient is the restricted one's
    assert torch.autograd.gradcheck(
        lambda h: VOCAB_STATS[name](h @ weight.detach().t(), **params), (hidden.detach().clone().requires_grad_(True),)
    )


def test_minp_log_mass_is_detached_and_chunks():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen)
    direct = VOCAB_STATS["minp_log_mass"]((hidden @ weight.t()) / 0.7, kappa=0.3)
    chunked = chunked_vocab_stat(hidden, weight, "minp_log_mass", {"kappa": 0.3}, temperature=0.7, chunk_size=4)
    torch.testing.assert_close(chunked, direct, **TOL)
    assert not direct.requires_grad and (direct <= 0).all() and (direct < 0).any()


@pytest.mark.parametrize("case", load("aent")["cases"])
def test_aent_matches_reference(case):
    """inclusionAI/AReaL recipe/AEnt: -coef * token-mean of the clamped entropy in every loss, the
    coefficient moved after each step past warm-up by the step's token-mean clamped entropy."""
    want = load("aent")["cases"][case]
    z, mask, logp, inp = vocab_inputs()
    p = want["params"]
    hc = VOCAB_STATS["clamped_entropy"](z.reshape(-1, z.shape[-1]), clamp=p["clamp"]).view(z.shape[:2])
    a = Algorithm.from_config({"interventions": ["aent"], "aent": p}, max_response_length=7)
    assert a.vocab_stats() == {"aent/clamped_entropy": ("clamped_entropy", {"clamp": p["clamp"]})}
    for step in want["steps"]:
        a.begin_step(0.0)
        for part in step["losses"]:
            rows = torch.tensor(part["rows"])
            out = a.loss(
                logp=logp[rows],
                old_logp=t64(inp["old_logp"])[rows],
                entropy=t64(inp["entropy"])[rows],
                advantages=torch.zeros_like(logp[rows]),
                mask=mask[rows],
                extras={"aent/clamped_entropy": hc[rows] * step["scale"]},
            )
            assert out.metrics["loss/aent"] == pytest.approx(part["value"], rel=1e-9, abs=1e-15)
            a.after_loss(out)
    a.begin_step(0.0)  # the last step's update
    coefs = [s["coef_after"] for s in want["steps"]]
    assert a.step_metrics()["aent/coef"] == pytest.approx(coefs[-1], rel=1e-9)
    assert a.step_metrics()["aent/last_clamped_entropy"] == pytest.approx(want["steps"][-1]["step_entropy"], rel=1e-9)
    fresh = Algorithm.from_config({"interventions": ["aent"], "aent": p}, max_response_length=7)
    fresh.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert fresh.step_metrics()["aent/coef"] == a.step_metrics()["aent/coef"]


@pytest.mark.parametrize("case", load("lp_reg")["cases"])
def test_lp_reg_matches_reference(case):
    """CarlanLark/Lp-Reg-dev: the min-p proxy of the sampled token, the lowest-probability A < 0
    candidates, the unclipped -A rho + coef * k3 on those kept by the filter."""
    g = load("lp_reg")
    want = g["cases"][case]
    inp = {k: torch.tensor(v) if k == "tokens" else t64(v) for k, v in g["inputs"].items()}
    p = want["params"]
    lo, hi = want["clip"]
    flat = inp["logits"].reshape(-1, inp["logits"].shape[-1])
    shape = inp["mask"].shape
    extras = {
        "lp_reg/minp_log_mass": VOCAB_STATS["minp_log_mass"](flat, kappa=p["kappa"]).view(shape),
        "lp_reg/max_logp": VOCAB_STATS["max_logp"](flat).view(shape),
    }
    a = Algorithm.from_config(
        {"clip": {"low": lo, "high": hi, "dual_c": None}, "interventions": ["lp_reg"], "lp_reg": p}, max_response_length=8
    )
    assert set(a.vocab_stats()) == set(extras)
    logp = inp["logp"].clone().requires_grad_(True)
    out = a.loss(
        logp=logp,
        old_logp=inp["old_logp"],
        entropy=torch.zeros_like(logp),
        advantages=inp["advantages"],
        mask=inp["mask"],
        extras=extras,
    )
    (grad,) = torch.autograd.grad(out.loss, logp)
    check(out, grad, want)
    sel = t64(want["selected"])
    assert out.metrics["lp_reg/frac"] == pytest.approx(float(sel.sum() / inp["mask"].sum()))
    assert out.metrics["loss/lp_reg"] == pytest.approx(want["kl_term"], rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("case", load("siren")["cases"])
def test_siren_matches_reference(case):
    """Linn3a/siren: top-p entropy, the per-response quantile mask (twice), the anchor from the first
    loss, coef * (H - anchor)^2 and its gradient with respect to the top-p entropies."""
    want = load("siren")["cases"][case]
    z, mask, logp, inp = vocab_inputs()
    p = want["params"]
    a = Algorithm.from_config({"interventions": ["siren"], "siren": p}, max_response_length=7)
    assert a.vocab_stats() == {"siren/topp_entropy": ("topp_entropy", {"p": p["top_p"], "k": p["top_k"]})}
    torch.testing.assert_close(
        VOCAB_STATS["topp_entropy"](z.reshape(-1, z.shape[-1]), p=p["top_p"], k=p["top_k"]).view(z.shape[:2]),
        t64(want["calls"][0]["h"]),
        **TOL,
    )
    kw = dict(logp=logp, old_logp=t64(inp["old_logp"]), entropy=t64(inp["entropy"]), advantages=torch.zeros_like(logp), mask=mask)
    for call in want["calls"]:
        h = t64(call["h"]).requires_grad_(True)
        out = a.loss(**kw, extras={"siren/topp_entropy": h})
        (grad,) = torch.autograd.grad(out.loss, h)  # the policy loss does not depend on h
        assert out.metrics["loss/siren"] == pytest.approx(call["value"], rel=1e-9, abs=1e-15)
        assert out.metrics["siren/anchor"] == pytest.approx(call["anchor"], rel=1e-12)
        assert out.metrics["siren/regulated_entropy"] == pytest.approx(call["regulated"], rel=1e-12)
        torch.testing.assert_close(grad, t64(call["grad_h"]), **TOL)
        a.after_loss(out)
    assert a.state_dict()["interventions"]["siren"]["anchor"] == pytest.approx(want["calls"][0]["anchor"])


# --- lab claims ---------------------------------------------------------------------------------


def _rows(entropies):
    return [{"step": i, "entropy": h} for i, h in enumerate(entropies)]


def test_method_claims_are_measured_per_seed_and_only_for_present_runs():
    falling = _rows(list(np_linspace(1.0, 0.1, 30)))
    held = _rows([0.3 + 0.01 * (-1) ** i for i in range(30)])
    wobbly = _rows([0.3 + 0.2 * (-1) ** i for i in range(30)])
    assert method_claims({"grpo": {0: falling}}) == []  # the default lab's table is unchanged
    runs = {
        "grpo": {0: falling, 1: falling},
        "ce_gppo": {0: held, 1: falling},
        # EntroPIC acting (alpha non-zero): a held curve with the controller idle is the claim's null
        # control and no longer holds (sweeps/lab/null_controls.py)
        "entropic": {0: [{**r, "entropic/alpha": 0.1} for r in held]},
        "stare": {0: wobbly},
        "gspo": {0: held},
    }
    claims = {c["id"]: c for c in method_claims(runs, {"entropic": {"entropic": {"target": 0.3}}})}
    assert claims["ce_gppo_keeps_entropy"]["reproduced"] is False  # seed 1 ends at GRPO's level
    assert [p["ok"] for p in claims["ce_gppo_keeps_entropy"]["per_seed"]] == [True, False]
    assert claims["entropic_holds_target"]["reproduced"] is True
    assert claims["gspo_no_claim"]["reproduced"] is None and registered_lab_claims()["gspo"].kind == "none"
    runs["entropic"] = {0: wobbly}
    runs["stare"] = {0: held}
    assert method_claims(runs, {})[0]["reproduced"] is False  # oscillates more than the gate


def np_linspace(a, b, n):
    return [a + (b - a) * i / (n - 1) for i in range(n)]


def test_lab_default_set_is_unchanged_and_all_adds_every_method():
    default = default_variants("lab")
    assert default == [
        "grpo",
        "stare",
        "steer",
        "clip_cov",
        "kl_cov",
        "sample_reweight",
        "high_entropy_mask",
        "grpo_extreme",
        "steer_extreme",
    ]  # `make lab` keeps its ~30 min
    newer = [v for v in training_variants("lab") if v not in default]
    assert set(newer) >= {
        "ce_gppo",
        "entropic",
        "aent",
        "siren",
        "archer",
        "entropy_adv",
        "gtpo",
        "lp_reg",
        "gspo",
        "gmpo",
        "cispo",
        "sapo",
    }
    for name in newer:
        assert (CONF_DIR / "experiment" / f"lab_{name}.yaml").is_file()
        assert (CONF_DIR / "algo" / f"{name}.yaml").is_file()
        assert f"algo={name}" in (CONF_DIR / "ablation" / "interventions.yaml").read_text()
