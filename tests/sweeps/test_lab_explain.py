"""The lab's claims explained with the attribution, on synthetic metric rows:
the sentences carry the measured parts, and the quadrant table compares the network's prediction
and the tabular formula with the realised change."""

from __future__ import annotations

import math

import pytest

from entropyrl.sweeps.lab.explain import explain_claims, variant_attribution
from entropyrl.sweeps.lab.report import quadrant_comparison


def _rows(parts_by_step: list[dict], first_step: int = 10, **extra) -> list[dict]:
    """Rows measured every 10 steps: the parts (trapezoid), the first order 1.2 times them, and a
    realised change 0.9 times the net."""
    rows = []
    for i, parts in enumerate(parts_by_step):
        net = sum(parts.values())
        row = {
            "step": first_step + 10 * i,
            "entropy_change/predicted_net": net,
            "entropy_change/realized": 0.9 * net,
            "entropy_change/predicted_net_1st": 1.2 * net,
            **{f"attribution/{k}": v for k, v in parts.items()},
            **{f"attribution_1st/{k}": 1.2 * v for k, v in parts.items()},
        }
        row.update({k: (v[i] if isinstance(v, list) else v) for k, v in extra.items()})
        rows.append(row)
    return rows


def test_stares_sentence_splits_its_part_by_the_gate():
    steps = [
        {"q1": -0.02, "q3": -0.01, "stare": 0.0},
        {"q1": -0.01, "q3": -0.01, "stare": 0.025},
        {"q1": -0.01, "q3": 0.0, "stare": 0.015},
    ]
    runs = {"stare": {0: _rows(steps, **{"stare/gate_on": [0.0, 1.0, 1.0]})}}
    claims = explain_claims([{"id": "stare_holds_target"}, {"id": "grpo_collapses"}], runs)
    text = claims[0]["attribution"]["stare"][0]
    assert "stare's own part +0.04" in text and "gate open on 2 of 3 measured steps: there its part +0.04" in text
    assert "the quadrants' -0.03)" in text  # q1 + q3 over the two open steps
    assert "attribution" not in claims[1]  # no grpo runs: nothing to explain


def test_clip_covs_sentence_says_what_the_detach_removed_with_its_sign():
    up = explain_claims([{"id": "cov_keeps_entropy"}], {"clip_cov": {0: _rows([{"q1": -0.03, "clip_cov": 0.01}] * 3)}})
    down = explain_claims([{"id": "cov_keeps_entropy"}], {"clip_cov": {0: _rows([{"q1": -0.03, "clip_cov": -0.01}] * 3)}})
    assert "moved the probe entropy by -0.03 more: the intervention raises entropy" in up[0]["attribution_text"]
    assert "by +0.03 more" in down[0]["attribution_text"] and "raises" not in down[0]["attribution_text"]


def test_variant_attribution_fits_and_shares_per_seed():
    steps = [{"q1": -0.01 * (i % 3 + 1), "q4": 0.002 * i} for i in range(6)]
    a = variant_attribution({0: _rows(steps), 1: _rows(steps[::-1]), 2: [{"step": 1, "entropy": 1.0}]})
    assert a["seeds"] == [0, 1]  # seed 2 measured nothing
    assert all(abs(s - 0.9) < 1e-9 for s in a["slope"]) and all(r > 0.99 for r in a["r_detrended"])
    assert set(a["share"]) == {"q1", "q4"} and a["share"]["q1"][0] < 0 < a["share"]["q4"][0]
    assert all(s == pytest.approx(0.75) for s in a["slope_1st"]) and all(r > 0.99 for r in a["r_detrended_1st"])
    assert a["total_1st"]["q1"][0] == pytest.approx(1.2 * a["total"]["q1"][0])
    assert a["share_1st"]["q4"][0] == pytest.approx(a["share"]["q4"][0])
    assert variant_attribution({0: [{"step": 1}]}) == {}


def test_the_quadrant_comparison_puts_the_predictions_beside_the_realised_change():
    quadrants = {
        0: {
            "q1": [-2.0, -1.0],
            "q2": [0.5, 0.5],
            "q3": [-1.0, -1.0],
            "q4": [0.1, -0.1],
            "predicted": {"q1": [-1.8, -1.1], "q2": [0.4, 0.6], "q3": [-0.9, 0.1], "q4": [0.1, 0.1]},
            "tabular": {"q1": [-4.0, -4.0], "q2": [1.0, 1.0], "q3": [-0.5, -0.5], "q4": [2.0, 2.0]},
        }
    }
    c = quadrant_comparison(quadrants)
    assert c["q1"]["realised"] == -1.5 and c["q1"]["predicted_sign_agreement"] == 1.0
    assert c["q3"]["predicted_sign_agreement"] == 0.5 and c["q4"]["predicted_sign_agreement"] == 0.5
    assert abs(sum(c[q]["tabular_share"] for q in c) - 1.0) < 1e-12
    assert c["q1"]["tabular_share"] > c["q3"]["tabular_share"] and c["q3"]["realised_share"] > c["q4"]["realised_share"]
    old = quadrant_comparison({0: {"q1": [-1.0], "q2": [1.0], "q3": [-1.0], "q4": [1.0]}})  # before the predictions
    assert math.isnan(old["q1"]["predicted"]) and old["q1"]["realised_share"] == 0.25


def test_the_sentences_read_the_parts_of_predicted_net_and_give_the_first_order_beside_it():
    rows = _rows([{"q1": -0.02, "clip_cov": 0.01}] * 3)
    for r in rows:  # first-order parts that differ from the trapezoid's
        r.update({"attribution_1st/q1": -0.05, "attribution_1st/clip_cov": 0.0})
    text = explain_claims([{"id": "cov_keeps_entropy"}], {"clip_cov": {0: rows}})[0]["attribution_text"]
    assert "predicted -0.03 (-0.036 to first order; realised -0.027)" in text
    assert "clip_cov's own part +0.03 against the quadrants' -0.06" in text
    a = variant_attribution({0: rows})
    assert set(a["total_1st"]) == {"clip_cov", "q1"} and set(a["total"]) == {"clip_cov", "q1"}
    assert abs(a["total_1st"]["q1"][0] + 0.15) < 1e-12 and abs(a["total"]["clip_cov"][0] - 0.03) < 1e-12


def test_adamws_first_step_is_told_apart_from_the_rest_of_the_run():
    # step 1: large parts that cancel (Adam's first step normalises every coordinate); later: small ones
    steps = [{"q3": -0.6, "q4": 0.5, "clip_cov": 0.09}, {"q1": -0.002, "clip_cov": 0.003}, {"q1": -0.002, "clip_cov": 0.001}]
    rows = _rows(steps, first_step=1)
    text = explain_claims([{"id": "cov_keeps_entropy"}], {"clip_cov": {0: rows}})[0]["attribution_text"]
    assert text.startswith("clip_cov seed 0: 2 measured steps after the first: predicted +0")
    assert "clip_cov's own part +0.004 against the quadrants' -0.004" in text  # steps 11 and 21 only
    assert "; step 1 (AdamW's first" in text and "largest parts q3 -0.6, q4 +0.5, clip_cov +0.09" in text
    a = variant_attribution({0: rows})
    assert abs(a["share_after_first"]["clip_cov"][0] - 0.5) < 1e-12 and a["share"]["q3"][0] < -0.5  # whole run: step 1's
    one = explain_claims([{"id": "cov_keeps_entropy"}], {"clip_cov": {0: rows[:1]}})[0]["attribution_text"]
    assert "1 measured steps: predicted" in one and "after the first" not in one  # nothing to set apart
