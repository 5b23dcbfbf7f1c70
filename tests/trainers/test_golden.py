"""Reproduce every golden vector in tests/golden/ (float64, 1e-6) through the project's code.

The golden files were computed by an independent implementation of the math (docs/algorithms.md) and
cross-checked against the STARE, STEER and verl reference code; see tests/golden/README.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from entropyrl.trainers.algos import core_algos
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.interventions import TokenBatch
from entropyrl.trainers.interventions.clip_cov import clip_cov_candidates
from entropyrl.trainers.interventions.kl_cov import kl_cov_loss, kl_cov_selection
from entropyrl.trainers.interventions.steer import steer_weights
from entropyrl.trainers.stats.diagnostics import entropy_change_estimate, quadrant_ids, quadrant_metrics
from entropyrl.trainers.stats.token_stats import chunked_token_stats, logits_token_stats

TOL = dict(rtol=1e-6, atol=1e-6)
DAPO_CLIP = {"low": 0.2, "high": 0.28, "dual_c": 10.0}
# Every golden file and the test that reproduces it (test_every_golden_file_is_checked keeps this honest).
CHECKED = {
    "inputs.json",
    "token_stats.json",
    "advantages.json",
    "surrogate.json",
    "stare.json",
    "stare_controller.json",
    "steer.json",
    "cov.json",
    "overlong.json",
    "quadrants.json",
    "pass_at_k.json",
}


@pytest.fixture(scope="module")
def gdir(golden_dir) -> Path:
    return golden_dir


def load(gdir: Path, name: str):
    return json.loads((gdir / name).read_text())


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def close(actual: torch.Tensor, expected, **kw) -> None:
    torch.testing.assert_close(
        actual.to(torch.float64), t64(expected) if not torch.is_tensor(expected) else expected.to(torch.float64), **(kw or TOL)
    )


@pytest.fixture(scope="module")
def batch(gdir):
    inp = load(gdir, "inputs.json")["inputs"]
    mask = t64(inp["mask"])
    rewards, groups = t64(inp["rewards"]), torch.tensor(inp["groups"], dtype=torch.long)
    return {
        "logits": t64(inp["logits"]),
        "tokens": torch.tensor(inp["tokens"], dtype=torch.long),
        "lengths": torch.tensor(inp["response_lengths"]),
        "mask": mask,
        "logp": t64(inp["logp"]),
        "old_logp": t64(inp["old_logp"]),
        "entropy": t64(inp["entropy"]),
        "rewards": rewards,
        "groups": groups,
        "adv": core_algos.compute_advantages("grpo", rewards, groups, mask),
    }


def algo(cfg: dict, T: int = 7) -> Algorithm:
    return Algorithm.from_config(cfg, max_response_length=T)


def loss_of(a: Algorithm, b) -> torch.Tensor:
    return a.loss(logp=b["logp"], old_logp=b["old_logp"], entropy=b["entropy"], advantages=b["adv"], mask=b["mask"]).loss


# Checked by tests/trainers/test_lab_fixes.py (the lab's fidelity fixes), wherever the golden folder lives.
CHECKED_ELSEWHERE = {
    "lab_fixes.json",
    "async_corrections.json",  # the staleness corrections: tests/trainers/test_async.py
    # the newer methods: tests/trainers/test_entropy_methods.py
    *(
        f"{n}.json"
        for n in (
            "ce_gppo",
            "archer",
            "entropy_adv",
            "entropic",
            "gspo",
            "gmpo",
            "cispo",
            "sapo",
            "tis_modes",
            "vocab_stats",
            "gtpo",
            "aent",
            "lp_reg",
            "siren",
            "high_entropy_mask",
            "sample_reweight",
            "adaptive_entropy",
        )
    ),
}


def test_every_golden_file_is_checked(gdir):
    assert {p.name for p in gdir.glob("*.json")} - CHECKED_ELSEWHERE == CHECKED


def test_inputs_are_consistent(batch):
    assert torch.equal(batch["mask"].sum(-1).long(), batch["lengths"])
    logp, entropy = logits_token_stats(batch["logits"], batch["tokens"])
    close(logp, batch["logp"])
    close(entropy, batch["entropy"])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_stats(gdir, batch, temperature):
    want = load(gdir, "token_stats.json")[f"temperature_{temperature}"]
    logp, entropy = logits_token_stats(batch["logits"], batch["tokens"], temperature)
    close(logp, want["logp"])
    close(entropy, want["entropy"])
    # The chunked path: hidden = logits and an identity projection give the same logits.
    v = batch["logits"].shape[-1]
    logp_c, ent_c = chunked_token_stats(
        batch["logits"].reshape(-1, v),
        torch.eye(v, dtype=torch.float64),
        batch["tokens"].reshape(-1),
        temperature=temperature,
        chunk_size=5,
        vocab_chunk_size=4,
    )
    close(logp_c.view(6, 7), want["logp"])
    close(ent_c.view(6, 7), want["entropy"])


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "opo"])
def test_advantages(gdir, batch, name):
    want = t64(load(gdir, "advantages.json")[name])
    adv = core_algos.compute_advantages(name, batch["rewards"], batch["groups"], batch["mask"])
    close(adv, want.unsqueeze(-1) * batch["mask"])
    a = algo({"advantage": name})
    close(a.advantages(batch["rewards"], batch["groups"], batch["mask"]), want.unsqueeze(-1) * batch["mask"])


def test_reinforce_pp_baseline(gdir, batch):
    want = load(gdir, "advantages.json")["reinforce_pp_baseline_token_level"]
    close(core_algos.compute_advantages("reinforce_pp_baseline", batch["rewards"], batch["groups"], batch["mask"]), want)


@pytest.mark.parametrize("kind", ["grpo", "dapo"])
def test_surrogate_and_aggregations(gdir, batch, kind):
    want = load(gdir, "surrogate.json")[kind]
    out = core_algos.clipped_surrogate(
        batch["logp"], batch["old_logp"], batch["adv"], eps_low=want["eps_low"], eps_high=want["eps_high"], dual_c=want["clip_c"]
    )
    close(out.loss * batch["mask"], want["per_token"])
    clip = {"low": want["eps_low"], "high": want["eps_high"], "dual_c": want["clip_c"]}
    for mode, key in [
        ("token-mean", "token-mean"),
        ("seq-mean-token-mean", "seq-mean-token-mean"),
        ("seq-mean-token-sum-norm", "seq-mean-token-sum-norm(norm=7)"),
    ]:
        close(core_algos.agg_loss(out.loss, batch["mask"], mode, norm=7), want[key])
        # and through the facade (norm = max_response_length = 7)
        close(loss_of(algo({"clip": clip, "loss_agg": mode}), batch), want[key])


@pytest.mark.parametrize(
    "case",
    [
        "O1_gateOn_P0.1",
        "O1_gateOn_P0.3",
        "O1_gateOff_P0.1",
        "O1_gateOff_P0.3",
        "C2_gateOn_P0.1",
        "C2_gateOn_P0.3",
        "C2_gateOff_P0.1",
        "C2_gateOff_P0.3",
    ],
)
def test_stare(gdir, batch, case):
    want = load(gdir, "stare.json")[case]
    variant, gate_on = case.split("_")[0], "gateOn" in case
    a = algo(
        {
            "clip": DAPO_CLIP,
            "interventions": ["stare"],
            "stare": {"p": want["top_p"], "w": want["w"], "m": want["m"], "variant": variant, "h_tgt": 0.3},
        }
    )
    a.begin_step(0.1 if gate_on else 0.5)
    assert a.step_metrics()["stare/gate_on"] == float(gate_on)
    stare = a.interventions[0]
    sel = stare.select(TokenBatch(batch["logp"], batch["old_logp"], batch["entropy"], batch["adv"], batch["mask"]))
    assert sel["stare/l_plus"].long().tolist() == want["l_plus"]
    assert sel["stare/l_minus"].long().tolist() == want["l_minus"]
    weights = (
        stare.weights(sel["stare/l_plus"], sel["stare/l_minus"], torch.float64) if gate_on else torch.ones_like(batch["mask"])
    )
    close(weights, want["weights"])
    close(loss_of(a, batch), want["loss_token-mean(dapo clip)"])


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_stare_controller(gdir, mode):
    g = load(gdir, "stare_controller.json")
    a = algo(
        {
            "interventions": ["stare"],
            "stare": {
                "h_tgt": g["target"],
                "w": g["w"],
                "m": g["m"],
                "alpha": g["alpha"],
                "w_max": g["w_max"],
                "m_min": g["m_min"],
                "adaptive": mode == "adaptive",
                "variant": "C2",
            },
        }
    )
    for h, want in zip(g["entropies"], g[mode]):
        a.begin_step(float(h))  # "nan" -> float('nan')
        m = a.step_metrics()
        assert m["stare/gate_on"] == float(want["gate_on"]), h
        assert math.isclose(m["stare/w"], want["w"], rel_tol=1e-6, abs_tol=1e-6), h
        assert math.isclose(m["stare/m"], want["m"], rel_tol=1e-6, abs_tol=1e-6), h


@pytest.mark.parametrize(
    "case,mapping,lmin,lmax",
    [
        ("exp_min0.8_max1.0", "exp", 0.8, 1.0),
        ("linear_min0.8_max1.2", "linear", 0.8, 1.2),
        ("exp_min0.5_max1.0", "exp", 0.5, 1.0),
    ],
)
def test_steer(gdir, batch, case, mapping, lmin, lmax):
    g = load(gdir, "steer.json")
    omega = entropy_change_estimate(batch["logp"], batch["old_logp"], batch["entropy"], batch["adv"], batch["mask"])
    close(omega, g["omega"])
    close(steer_weights(omega, batch["mask"], mapping=mapping, lambda_min=lmin, lambda_max=lmax), g[case]["weights"])
    a = algo(
        {"clip": DAPO_CLIP, "interventions": ["steer"], "steer": {"mapping": mapping, "lambda_min": lmin, "lambda_max": lmax}}
    )
    close(loss_of(a, batch), g[case]["loss_token-mean(dapo clip)"])


def test_cov(gdir, batch):
    g = load(gdir, "cov.json")
    cov = core_algos.token_covariance(batch["adv"], batch["logp"], batch["mask"])
    close(cov, g["cov"])
    surr = core_algos.clipped_surrogate(batch["logp"], batch["old_logp"], batch["adv"], eps_low=0.2, eps_high=0.28, dual_c=10.0)
    cand = clip_cov_candidates(cov, batch["mask"], surr.ratio_clipped, 0.1, 2.0)
    assert cand.long().tolist() == g["clip_cov_candidates(lb=0.1,ub=2.0,eps=0.2/0.28)"]
    kc = g["kl_cov(ratio=0.1,kappa=1)"]
    sel = kl_cov_selection(cov, batch["mask"], 0.1)
    assert sel.long().tolist() == kc["selected"]
    close(kl_cov_loss(batch["logp"], batch["old_logp"], batch["adv"], surr.ratio, sel, 1.0) * batch["mask"], kc["per_token"])
    a = algo({"interventions": ["kl_cov"], "kl_cov": {"ratio": 0.1, "kappa": 1.0}})
    close(loss_of(a, batch), kc["token-mean"])


def test_overlong(gdir):
    g = load(gdir, "overlong.json")
    lengths = torch.tensor(g["lengths"])
    close(core_algos.overlong_penalty(lengths, g["max_len"], g["cache"]), g["penalty"])
    a = algo({"overlong": {"enabled": True, "buffer": g["cache"]}}, T=g["max_len"])
    close(a.shape_rewards(torch.ones(len(lengths), dtype=torch.float64), lengths), [1.0 + p for p in g["penalty"]])


def test_quadrants(gdir, batch):
    g = load(gdir, "quadrants.json")
    ids = quadrant_ids(batch["logp"], batch["entropy"], batch["adv"], batch["mask"])
    assert ids.tolist() == g["quadrant_id(0=invalid or A=0)"]
    m = quadrant_metrics(batch["logp"], batch["old_logp"], batch["entropy"], batch["adv"], batch["mask"])
    for q in ("q1", "q2", "q3", "q4"):
        assert math.isclose(m[f"quadrant/{q}/share"], g["token_share"][q], rel_tol=1e-6, abs_tol=1e-6)
        assert math.isclose(m[f"quadrant/{q}/pred_dH"], g["predicted_dH_sum(-omega)"][q], rel_tol=1e-6, abs_tol=1e-6)


def test_pass_at_k(gdir):
    from entropyrl.evals.metrics import pass_at_k

    for case in load(gdir, "pass_at_k.json"):
        assert math.isclose(pass_at_k(case["n"], case["c"], case["k"]), case["value"], rel_tol=1e-6, abs_tol=1e-6)
