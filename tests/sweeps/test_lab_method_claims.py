"""The newer methods' lab claims (sweeps/lab/method_claims.py) on small synthetic metric rows: each claim
reproduced when the effect is there and not when it is absent, the measured reason naming the
method's lever when it was inert, and every method's status (yes / no / no claim) in lab.json
and report.md."""

from __future__ import annotations

import json
import math

import pytest

from entropyrl.sweeps.lab.method_claims import method_claims, method_levers, registered_lab_claims
from entropyrl.sweeps.lab.report import write_lab_outputs

CLAIMS = registered_lab_claims()  # read from the registries: a new method with a claim is tested here
HIGHER_THAN_GRPO = sorted(m for m, c in CLAIMS.items() if c.kind == "above_grpo")
NO_CLAIM = sorted(m for m, c in CLAIMS.items() if c.kind == "none")
HOLDS_TARGET = sorted(m for m, c in CLAIMS.items() if c.kind == "holds_target")


def rows(entropy, n=40, **extra):
    return [
        {"step": i + 1, "entropy": entropy(i), **{k: (v(i) if callable(v) else v) for k, v in extra.items()}} for i in range(n)
    ]


def falling(i):  # GRPO's collapse: 1.0 -> ~0.14
    return math.exp(-0.05 * i)


def held(i):  # a method that keeps entropy: 1.0 -> ~0.7
    return 1.0 - 0.0075 * i


def by_id(claims):
    return {c["id"]: c for c in claims}


# each method's lever, acting (a real selection / a moving coefficient)
ACTING = {
    "ce_gppo/low_frac": 0.01,
    "ce_gppo/high_frac": 0.004,
    "aent/coef": lambda i: 0.001 + 1e-4 * i,
    "loss/aent": -0.002,
    "siren/regulated_entropy": 0.8,
    "siren/anchor": 0.9,
    "siren/peak_frac": 0.2,
    "loss/siren": 0.002,
    "archer/high_frac": 0.2,
    "gtpo/share_max": 5.0,
    "lp_reg/frac": 0.06,
    "loss/lp_reg": 0.003,
    "clip/frac": 0.004,
    "loss/policy": 0.01,
}


@pytest.mark.parametrize("method", HIGHER_THAN_GRPO)
def test_keeps_entropy_claims_fail_both_ways(method):
    grpo = {s: rows(falling) for s in (0, 1, 2)}
    up = by_id(method_claims({"grpo": grpo, method: {s: rows(held, **ACTING) for s in (0, 1, 2)}}))
    claim = up[f"{method}_keeps_entropy"]
    assert claim["reproduced"] is True and [p["seed"] for p in claim["per_seed"]] == [0, 1, 2]
    assert "reason" not in claim
    # seed 2 ends below GRPO: not reproduced, and the reason is the method's measured lever
    mixed = {0: rows(held, **ACTING), 1: rows(held, **ACTING), 2: rows(lambda i: 0.5 * falling(i), **ACTING)}
    down = by_id(method_claims({"grpo": grpo, method: mixed}))[f"{method}_keeps_entropy"]
    assert down["reproduced"] is False and [p["ok"] for p in down["per_seed"]] == [True, True, False]
    assert f"{method}: mean over steps per seed" in down["reason"]
    assert "_selects_nothing" not in down["reason"] and "never_moved" not in down["reason"]


def test_inert_levers_are_named_in_the_reason():
    grpo = {0: rows(falling)}
    cfgs = {"aent": {"aent": {"coef_max": 0.02, "coef_min": 0.0, "low": 0.2, "high": 0.6}}}
    runs = {
        "grpo": grpo,
        "lp_reg": {0: rows(falling, **{"lp_reg/frac": 0.0, "loss/lp_reg": 0.0, "loss/policy": 0.01})},
        "aent": {0: rows(falling, **{"aent/coef": lambda i: 0.02 if i > 5 else 0.001 + 0.003 * i})},
        "siren": {0: rows(falling, **{"loss/siren": 1e-6, "loss/policy": -0.01, "siren/peak_frac": 0.2})},
        "gtpo": {0: rows(falling)},
    }  # logs no lever: only the regime findings
    c = by_id(method_claims(runs, cfgs))
    assert "lp_reg_selects_nothing" in c["lp_reg_keeps_entropy"]["reason"]
    assert "protected tokens 0.00%" in c["lp_reg_keeps_entropy"]["reason"]
    assert "loss/lp_reg size over loss/policy size (mean abs) 0" in c["lp_reg_keeps_entropy"]["reason"]
    assert "aent_coef_at_max (coef = 0.02 on 85% of steps)" in c["aent_keeps_entropy"]["reason"]
    assert "(final 0.02)" in c["aent_keeps_entropy"]["reason"]
    assert "siren_term_negligible" in c["siren_keeps_entropy"]["reason"]
    assert "collapse" in c["gtpo_keeps_entropy"]["reason"]  # the regime flag (claims._reasons)
    still = {"grpo": grpo, "aent": {0: rows(falling, **{"aent/coef": 0.001})}}
    assert "aent_coef_never_moved" in method_claims(still, cfgs)[0]["reason"]
    assert method_levers({"grpo": grpo}, "aent", cfgs) == ""


def test_entropic_claim_fails_both_ways_and_names_alpha():
    cfg = {"entropic": {"entropic": {"target": 0.3, "alpha_max": 1.0}}}
    steady = rows(lambda i: 0.3 + 0.005 * (-1) ** i, **{"entropic/alpha": 0.1, "entropic/pos_high_frac": 0.3})
    gate = rows(lambda i: 0.3 + 0.05 * (-1) ** i)
    ok = method_claims({"entropic": {0: steady}, "stare": {0: gate}}, cfg)[0]
    assert ok["id"] == "entropic_holds_target" and ok["reproduced"] is True
    # held, but far from the target with weights ~1: not reproduced, alpha named
    far = rows(lambda i: 0.6 + 0.005 * (-1) ** i, **{"entropic/alpha": 0.001})
    c = method_claims({"entropic": {0: far}, "stare": {0: gate}}, cfg)[0]
    assert c["reproduced"] is False and c["per_seed"][0]["near_target"] is False
    assert "entropic_weights_near_1" in c["reason"] and "(+100%)" in c["measured"]
    # near the target but saturated and oscillating more than the gate
    wild = rows(lambda i: 0.3 + 0.1 * (-1) ** i, **{"entropic/alpha": lambda i: (-1) ** i})
    c = method_claims({"entropic": {0: wild}, "stare": {0: gate}}, cfg)[0]
    assert c["reproduced"] is False and c["per_seed"][0]["near_target"] is True
    assert "entropic_alpha_at_bound" in c["reason"]


def test_every_method_has_a_status_in_lab_json_and_report(tmp_path):
    methods = [*HOLDS_TARGET, *HIGHER_THAN_GRPO, *NO_CLAIM]
    runs = {
        "grpo": {0: rows(falling)},
        "stare": {0: rows(held)},
        **{m: {0: rows(held if i % 2 else falling, **ACTING)} for i, m in enumerate(methods)},
    }
    claims = method_claims(runs, {})
    write_lab_outputs(
        tmp_path,
        runs,
        claims,
        algo_cfgs={},
        quadrants=None,
        pass_key="val/pass_at_8",
        command="entropyrl lab --algos all",
        wall_seconds=1.0,
        failed=[],
    )
    doc = {c["id"]: c for c in json.loads((tmp_path / "lab.json").read_text())["claims"]}
    named = {cid.rsplit("_keeps_entropy", 1)[0].rsplit("_no_claim", 1)[0].rsplit("_holds_target", 1)[0] for cid in doc}
    assert named == set(methods)
    assert {doc[f"{m}_no_claim"]["status"] for m in NO_CLAIM} == {"no claim"}
    assert {c["status"] for c in doc.values()} == {"yes", "no", "no claim"}
    assert doc["gspo_no_claim"]["measured"].startswith("last tenth ")
    assert not any("|" in c.get("reason", "") + c["measured"] for c in doc.values())  # report.md table cells
    report = (tmp_path / "report.md").read_text()
    line = next(x for x in report.splitlines() if x.startswith("| `sapo_no_claim`"))
    assert "| no claim |" in line and "not run" not in line


def test_claims_are_read_from_the_registries_and_every_lever_is_a_logged_metric():
    """The lab's claim rows come from the methods' own declarations: the methods the lab has always
    measured are there, and a lever names a metric the method logs (or the shared clip metric)."""
    from entropyrl.trainers.interventions import INTERVENTIONS

    assert {"entropic", "ce_gppo", "aent", "siren", "archer", "gtpo", "lp_reg", "gmpo"} <= set(HIGHER_THAN_GRPO + HOLDS_TARGET)
    assert {"entropy_adv", "gspo", "cispo", "sapo"} <= set(NO_CLAIM)
    for name, claim in CLAIMS.items():
        cls = INTERVENTIONS.get(name)
        for lever in claim.levers:
            assert lever.metric.split("/")[0] in {name, "clip"}, (name, lever)
        if cls is not None and claim.added_term:
            assert claim.added_term in cls.logged_metrics, name


def test_a_new_intervention_with_a_claim_gets_a_lab_row(monkeypatch):
    from dataclasses import dataclass

    from entropyrl.trainers.algos.lab_claim import LabClaim, Lever
    from entropyrl.trainers.interventions import INTERVENTIONS, Intervention

    class Probe(Intervention):
        name = "probe_claim"
        logged_metrics = ("probe_claim/frac",)
        lab_claim = LabClaim(
            "above_grpo", "the probe keeps entropy", levers=(Lever("probe_claim/frac", "probed tokens", "frac"),)
        )

        @dataclass
        class Params:
            pass

    monkeypatch.setitem(INTERVENTIONS, "probe_claim", Probe)
    runs = {"grpo": {0: rows(falling)}, "probe_claim": {0: rows(held, **{"probe_claim/frac": 0.0})}}
    claim = by_id(method_claims(runs))["probe_claim_keeps_entropy"]
    assert claim["claim"] == "the probe keeps entropy" and claim["reproduced"] is True
    assert "probe_claim_selects_nothing" in method_levers(runs, "probe_claim", {})
