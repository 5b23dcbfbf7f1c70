"""`make bench` key `real_model` (perf/real_model.py): the figures as shares of their limits and
``entropyrl plan --cpu``'s step time beside the measured one, computed by ``limits`` from a decode
step and a study step (synthetic rows here: no model, no timing)."""

from __future__ import annotations

import pytest

from entropyrl.conf import compose
from entropyrl.models.cost import architecture, parameters

from .conftest import load_perf

RATES = {"bandwidth_gbps": 8.0, "matmul_gflops": 40.0, "matmul_rows": 2048, "decode_matmul_gflops": 20.0, "decode_rows": 16}


def _streamed_bytes() -> float:
    arch = architecture(compose("train", ["experiment=smollm2_word_problems"]).model)
    p = parameters(arch)
    return 4 * (p["non_embedding"] + arch.vocab_size * arch.hidden_size)  # tied head: streamed every step


def _rows(decode_step: float, study_step: float, train: float):
    decode = {"rates": RATES, "rows": 16, "steps": 64, "decode_step_seconds": decode_step}
    study = {"rates": RATES, "prompt_len": 70, "response_len": 58.25, "step_seconds": study_step, "train_seconds": train}
    return decode, study


def test_limits_are_the_figures_over_their_floors():
    bench = load_perf("real_model")
    floor = _streamed_bytes() / 8e9
    at_floor = bench.limits(*_rows(floor, 100.0, 80.0))
    assert at_floor["decode_bandwidth_frac"] == pytest.approx(1.0, abs=1e-3)
    assert at_floor["decode_floor_seconds"] == pytest.approx(floor, abs=1e-4)
    slower = bench.limits(*_rows(4 * floor, 100.0, 80.0))
    assert slower["decode_bandwidth_frac"] == pytest.approx(0.25, abs=1e-3)  # 4x the floor: a quarter of the limit
    roofline = max(floor, 16 * 2 * _streamed_bytes() / 4 / 20e9)  # the decode rate's FLOPs or the weights' time
    assert slower["decode_roofline_frac"] == pytest.approx(roofline / (4 * floor), abs=1e-3)
    assert slower["decode_flop_frac"] == pytest.approx(16 * 2 * _streamed_bytes() / 4 / 40e9 / (4 * floor), abs=1e-3)


def test_train_flops_frac_and_the_plan_beside_the_measured_step():
    bench = load_perf("real_model")
    one = bench.limits(*_rows(0.5, 100.0, 80.0))
    half = bench.limits(*_rows(0.5, 200.0, 160.0))
    assert one["train_gflops"] == pytest.approx(2 * half["train_gflops"], rel=1e-2)  # twice the time, half the rate
    assert one["train_flops_frac"] == pytest.approx(one["train_gflops"] / 40.0, abs=2e-3)
    assert one["plan_step_s"] == half["plan_step_s"]  # the plan does not read the measured time
    assert one["plan_over_measured"] == pytest.approx(one["plan_step_s"] / 100.0, abs=2e-3)
    assert one["plan_step_s"] == pytest.approx(one["plan_generate_s"] + one["plan_train_s"], abs=0.02)
    assert one["plan_step_s_at_mean"] < one["plan_step_s"]  # 58 tokens a response against the cap of 64
