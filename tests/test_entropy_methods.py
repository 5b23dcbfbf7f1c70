"""Issue 22's methods reproduce their golden vectors (tests/golden/<name>.json, numpy float64
re-derivations of the authors' code or paper, tests/golden/make_entropy_methods.py): the loss
and its gradient with respect to ``logp`` through ``Algorithm.loss``, to 1e-6 in float64."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from entropyrl.cli.lab_cmd import ALL_VARIANTS, NEW_VARIANTS, VARIANTS, lab_variants
from entropyrl.conf import CONF_DIR
from entropyrl.core.errors import UserError
from entropyrl.sweeps.lab.method_claims import NO_CLAIM, method_claims
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.interventions.tis import mismatch_weight
from entropyrl.trainers.stats.vocab_stats import VOCAB_STATS, chunked_vocab_stat

GOLDEN = Path(__file__).parent / "golden"
TOL = dict(rtol=1e-6, atol=1e-6)
FILES = ("gtpo", "ce_gppo", "archer", "entropy_adv", "entropic", "gspo", "gmpo", "cispo", "sapo", "tis_modes",
         "vocab_stats")


def load(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def run(cfg: dict, inputs: dict, *, begin: list[float] = (), extras: dict | None = None, adv_scale: float = 1.0,
        sampler_logp=None):
    """(algorithm, loss output, d loss / d logp) of the stored batch under ``cfg``."""
    a = Algorithm.from_config(cfg, max_response_length=8)
    for h in begin:
        a.begin_step(h)
    logp = t64(inputs["logp"]).requires_grad_(True)
    out = a.loss(logp=logp, old_logp=t64(inputs["old_logp"]), entropy=t64(inputs["entropy"]),
                 advantages=adv_scale * t64(inputs["advantages"]), mask=t64(inputs["mask"]),
                 ref_logp=t64(inputs["ref_logp"]) if a.needs_ref else None, extras=extras, sampler_logp=sampler_logp)
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
        if name in ("ce_gppo", "archer", "gspo", "gmpo", "cispo", "sapo"):
            assert "@" in doc["source"], f"{name}: the commit of the reference code read"


@pytest.mark.parametrize("case", load("ce_gppo")["cases"])
def test_ce_gppo(case):
    g = load("ce_gppo")
    want = g["cases"][case]
    lo, hi, c = want["clip"]
    cfg = {"clip": {"low": lo, "high": hi, "dual_c": c}, "interventions": ["ce_gppo"],
           "ce_gppo": {"beta1": want["beta"][0], "beta2": want["beta"][1]}}
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


@pytest.mark.parametrize("case", load("gtpo")["cases"])
def test_gtpo_advantages(case):
    g = load("gtpo")
    want = g["cases"][case]
    inp = g["inputs"]
    a1, a2 = want["alpha"]
    algo = Algorithm.from_config({"interventions": ["gtpo"], "gtpo": {"alpha1": a1, "alpha2": a2}}, max_response_length=8)
    mask = t64(inp["mask"])
    shaped = algo.interventions[0].shape_advantages(t64(inp["advantages"]), t64(inp["entropy"]),
                                                     torch.tensor(want["groups"]), mask)
    torch.testing.assert_close(shaped, t64(want["advantages"]), **TOL)
    assert algo.step_metrics()["gtpo/share_max"] > 1.0
    with pytest.raises(ValueError, match="entropy"):
        algo.advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 3))


@pytest.mark.parametrize("case", load("entropic")["cases"])
def test_entropic_controller_and_weights(case):
    g = load("entropic")
    want = g["cases"][case]
    cfg = {"interventions": ["entropic"], "entropic": want["params"]}
    a = Algorithm.from_config(cfg, max_response_length=8)
    for h, alpha, integral in zip(want["entropies"], want["alpha"], want["integral"]):
        a.begin_step(h)
        assert a.step_metrics()["entropic/alpha"] == pytest.approx(alpha, abs=1e-12)
        assert a.step_metrics()["entropic/integral"] == pytest.approx(integral, abs=1e-12)
    _, out, grad = run(cfg, g["inputs"], begin=want["entropies"])
    check(out, grad, want)
    # the integral state survives a checkpoint round trip
    fresh = Algorithm.from_config(cfg, max_response_length=8)
    fresh.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert fresh.step_metrics() == a.step_metrics()
    a.begin_step(0.2), fresh.begin_step(0.2)
    assert fresh.step_metrics() == a.step_metrics()


@pytest.mark.parametrize("name,case", cases("gspo") + cases("gmpo") + cases("cispo"))
def test_clipped_objectives(name, case):
    g = load(name)
    want = g["cases"][case]
    lo, hi = want["clip"]
    agg = "token-mean" if name == "cispo" else "seq-mean-token-mean"
    _, out, grad = run({"objective": name, "clip": {"low": lo, "high": hi}, "loss_agg": agg}, g["inputs"],
                       adv_scale=want.get("adv_scale", 1.0))
    check(out, grad, want)


@pytest.mark.parametrize("case", load("sapo")["cases"])
def test_sapo(case):
    g = load("sapo")
    want = g["cases"][case]
    tau_pos, tau_neg = want["tau"]
    _, out, grad = run({"objective": "sapo", "objective_args": {"tau_pos": tau_pos, "tau_neg": tau_neg},
                        "loss_agg": "seq-mean-token-mean"}, g["inputs"])
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
    assert out.metrics["rollout/tis_weight_mean"] == pytest.approx(float(t64(want[mode]).sum() / t64(inp["mask"]).sum()),
                                                                  rel=1e-6)
    assert (out.loss != plain.loss) or torch.all(t64(want[mode])[t64(inp["mask"]) > 0] == 1.0)


def test_default_objective_is_bit_identical_to_the_clipped_surrogate():
    g = load("gspo")
    _, default, gd = run({}, g["inputs"])
    _, named, gn = run({"objective": "ppo_clip"}, g["inputs"])
    assert torch.equal(default.loss, named.loss) and torch.equal(gd, gn)


def test_bad_objective_and_args_are_user_errors():
    with pytest.raises(UserError, match="valid choices"):
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
    got = {"topk_entropy": VOCAB_STATS["topk_entropy"](flat, k=p["k"]),
           "topp_entropy": VOCAB_STATS["topp_entropy"](flat, p=p["top_p"]),
           "proxy_kl": VOCAB_STATS["proxy_kl"](flat, kappa=p["kappa"]),
           "max_logp": VOCAB_STATS["max_logp"](flat)}
    for key, val in got.items():
        torch.testing.assert_close(val.view(z.shape[:2]), t64(want[key]), **TOL)


@pytest.mark.parametrize("name,params", [("topk_entropy", {"k": 4}), ("topp_entropy", {"p": 0.8}),
                                         ("proxy_kl", {"kappa": 0.2})])
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
    # the selection (top-k / nucleus / proxy) is fixed locally: the gradient is the restricted one's
    assert torch.autograd.gradcheck(lambda h: VOCAB_STATS[name](h @ weight.detach().t(), **params),
                                    (hidden.detach().clone().requires_grad_(True),))


@pytest.mark.parametrize("case", load("vocab_stats")["cases"])
def test_aent_and_lp_reg_terms(case):
    want = load("vocab_stats")["cases"][case]
    z, mask, logp, inp = vocab_inputs()
    p = want["params"]
    flat = z.reshape(-1, z.shape[-1])
    shape = z.shape[:2]
    extras = {"aent/topk_entropy": VOCAB_STATS["topk_entropy"](flat, k=p["k"]).view(shape),
              "lp_reg/proxy_kl": VOCAB_STATS["proxy_kl"](flat, kappa=p["kappa"]).view(shape),
              "lp_reg/max_logp": VOCAB_STATS["max_logp"](flat).view(shape)}
    lp = want["lp_reg"]
    cfg = {"interventions": ["aent", "lp_reg"], "aent": {"top_k": p["k"], "init_coef": want["aent_term"]["coef"],
                                                         "coef_max": 0.05},
           "lp_reg": {"coef": lp["coef"], "kappa": p["kappa"], "rho": lp["rho"]}}
    a = Algorithm.from_config(cfg, max_response_length=7)
    assert set(a.vocab_stats()) == set(extras)
    out = a.loss(logp=logp, old_logp=t64(inp["old_logp"]), entropy=t64(inp["entropy"]),
                 advantages=t64(lp["advantages"]), mask=mask, extras=extras)
    assert out.metrics["loss/aent"] == pytest.approx(want["aent_term"]["value"], rel=1e-9)
    assert out.metrics["loss/lp_reg"] == pytest.approx(lp["value"], rel=1e-9, abs=1e-12)
    assert out.metrics["lp_reg/frac"] == pytest.approx(float(t64(lp["selected"]).sum() / mask.sum()))
    # AEnt's coefficient moves once per step from the clamped entropy it saw (above `high`: down),
    # recorded after the loss as the loop does
    a.after_loss(out)
    a.begin_step(0.5)
    assert a.step_metrics()["aent/coef"] == pytest.approx(want["aent_term"]["coef"] - 0.0005)


def test_siren_is_self_anchored():
    z, mask, logp, inp = vocab_inputs()
    h = VOCAB_STATS["topp_entropy"](z.reshape(-1, z.shape[-1]), p=0.8).view(z.shape[:2])
    a = Algorithm.from_config({"interventions": ["siren"], "siren": {"top_p": 0.8, "peak_frac": 0.5, "coef": 2.0}},
                              max_response_length=7)
    kw = dict(logp=logp, old_logp=t64(inp["old_logp"]), entropy=t64(inp["entropy"]),
              advantages=torch.zeros_like(logp), mask=mask)
    first = a.loss(**kw, extras={"siren/topp_entropy": h})
    assert first.metrics["loss/siren"] == 0.0                      # the anchor is the first reading
    anchor = a.step_metrics()["siren/anchor"]
    second = a.loss(**kw, extras={"siren/topp_entropy": h + 0.1})
    assert second.metrics["loss/siren"] == pytest.approx(2.0 * 0.1 ** 2, rel=1e-9)
    assert a.state_dict()["interventions"]["siren"]["anchor"] == anchor


# --- lab claims ---------------------------------------------------------------------------------

def _rows(entropies):
    return [{"step": i, "entropy": h} for i, h in enumerate(entropies)]


def test_method_claims_are_measured_per_seed_and_only_for_present_runs():
    falling = _rows(list(np_linspace(1.0, 0.1, 30)))
    held = _rows([0.3 + 0.01 * (-1) ** i for i in range(30)])
    wobbly = _rows([0.3 + 0.2 * (-1) ** i for i in range(30)])
    assert method_claims({"grpo": {0: falling}}) == []                 # the default lab's table is unchanged
    runs = {"grpo": {0: falling, 1: falling}, "ce_gppo": {0: held, 1: falling}, "entropic": {0: held},
            "stare": {0: wobbly}, "gspo": {0: held}}
    claims = {c["id"]: c for c in method_claims(runs, {"entropic": {"entropic": {"target": 0.3}}})}
    assert claims["ce_gppo_keeps_entropy"]["reproduced"] is False      # seed 1 ends at GRPO's level
    assert [p["ok"] for p in claims["ce_gppo_keeps_entropy"]["per_seed"]] == [True, False]
    assert claims["entropic_holds_target"]["reproduced"] is True
    assert claims["gspo_no_claim"]["reproduced"] is None and "gspo" in NO_CLAIM
    runs["entropic"] = {0: wobbly}
    runs["stare"] = {0: held}
    assert method_claims(runs, {})[0]["reproduced"] is False           # oscillates more than the gate


def np_linspace(a, b, n):
    return [a + (b - a) * i / (n - 1) for i in range(n)]


def test_lab_default_set_is_unchanged_and_all_adds_every_method():
    assert VARIANTS == ("grpo", "stare", "steer", "clip_cov", "kl_cov", "sample_reweight", "high_entropy_mask",
                        "grpo_extreme", "steer_extreme")       # `make lab` keeps its ~30 min
    assert set(NEW_VARIANTS) == {"ce_gppo", "entropic", "aent", "siren", "archer", "entropy_adv", "gtpo", "lp_reg",
                                 "gspo", "gmpo", "cispo", "sapo"}
    assert ALL_VARIANTS == VARIANTS + NEW_VARIANTS
    for name in NEW_VARIANTS:
        assert (CONF_DIR / "experiment" / f"lab_{name}.yaml").is_file()
        assert (CONF_DIR / "algo" / f"{name}.yaml").is_file()
        assert f"algo={name}" in (CONF_DIR / "ablation" / "interventions.yaml").read_text()
    assert set(ALL_VARIANTS) <= set(lab_variants())            # --algos all runs them with the others
