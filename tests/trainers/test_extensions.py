"""Extending entropyrl from outside the package: an intervention, a rollout engine (training and
eval) and a benchmark, each registered from this file alone (no edit to the package, no YAML added)
and run end to end. The intervention's ``Params`` dataclass, stored in Hydra's ConfigStore group
``intervention``, is its published defaults: ``entropyrl.conf.compose`` mounts it at
``algo.<name>`` like a ``conf/intervention/<name>.yaml``.
(The same for a launcher: tests/sweeps/test_launchers.py.)"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from hydra.core.config_store import ConfigStore

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.evals import benchmarks as bench_registry
from entropyrl.evals.runner import run_eval
from entropyrl.rollout import base as rollout_registry
from entropyrl.rollout.base import register_rollout
from entropyrl.rollout.hf_engine import HFRollout
from entropyrl.trainers.interventions import INTERVENTIONS, Intervention, LossContext, register_intervention
from entropyrl.trainers.trainer import train

RUN = [
    "data=toy",
    "trainer.total_steps=2",
    "trainer.prompts_per_step=8",
    "trainer.mini_batch_prompts=4",
    "trainer.val_every=0",
    "trainer.save_every=0",
    "val.prompts=0",
    "trainer.progress=false",
    "trainer.threads=1",
    "tracking.enabled=false",
]


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture()
def negative_damping():
    """Scales the loss of negative-advantage tokens by ``factor`` and reports the share it touched."""

    @register_intervention("test_negative_damping")
    class NegativeDamping(Intervention):
        @dataclass
        class Params:
            factor: float = 0.5
            scope: str = "micro"

        def apply(self, ctx: LossContext) -> None:
            negative = (ctx.advantages < 0) & ctx.pg_mask.bool()
            ctx.scale(torch.where(negative, torch.full_like(ctx.pg_loss, self.params.factor), torch.ones_like(ctx.pg_loss)))
            ctx.metrics["test_negative_damping/frac"] = float(negative.float().sum() / ctx.pg_mask.sum().clamp(min=1))
            ctx.metrics["test_negative_damping/factor"] = float(self.params.factor)

    ConfigStore.instance().store(group="intervention", name="test_negative_damping", node=NegativeDamping.Params)
    yield "test_negative_damping"
    INTERVENTIONS.pop("test_negative_damping")
    ConfigStore.instance().repo["intervention"].pop("test_negative_damping.yaml")


@pytest.mark.slow
def test_an_intervention_registered_here_trains_with_its_own_parameters(in_tmp, negative_damping):
    cfg = compose(
        "train", RUN + ["output_dir=out", f"algo.interventions=[{negative_damping}]", f"algo.{negative_damping}.factor=0.25"]
    )
    assert compose("train", [])["algo"][negative_damping] == {"factor": 0.5, "scope": "micro"}  # its defaults
    with pytest.raises(UserError, match=f"unknown config key 'algo.{negative_damping}.bogus'"):
        compose("train", [f"algo.{negative_damping}.bogus=1"])
    train(cfg, log=lambda *_: None)
    rows = _rows(in_tmp / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["test_negative_damping/factor"] == 0.25 for r in rows)
    assert any(r["test_negative_damping/frac"] > 0 for r in rows)  # it saw negative-advantage tokens


@pytest.fixture()
def counting_engine():
    """An engine that samples like ``hf`` and counts its calls (a stand-in for a new backend)."""

    class CountingRollout(HFRollout):
        calls = 0
        synced = 0
        closed = 0
        requests: list[dict] = []

        def generate(self, prompts, **kw):
            type(self).calls += 1
            type(self).requests.append({"prompts": len(prompts), **{k: v for k, v in kw.items() if k != "progress"}})
            return super().generate(prompts, **kw)

        def sync_weights(self) -> None:
            type(self).synced += 1

        def close(self) -> None:
            type(self).closed += 1

    register_rollout("test_counting", CountingRollout)
    yield CountingRollout
    rollout_registry.ROLLOUT_ENGINES.pop("test_counting")


@pytest.mark.slow
def test_a_rollout_engine_registered_here_samples_the_training_batches(in_tmp, counting_engine):
    cfg = compose("train", RUN + ["output_dir=out", "rollout.name=test_counting"])
    train(cfg, log=lambda *_: None)
    rows = _rows(in_tmp / "out" / "metrics.jsonl")
    assert len(rows) == 2 and all(r["response_length/mean"] > 0 for r in rows)
    assert counting_engine.calls >= 2  # at least one generate call per step
    assert counting_engine.synced >= 2  # told after each optimizer step


@pytest.mark.slow
def test_a_rollout_engine_registered_here_samples_the_eval(in_tmp, counting_engine):
    cfg = compose(
        "eval",
        [
            "model=tiny",
            "output_dir=ev",
            "eval.backend=test_counting",
            "eval.n_samples=3",
            "eval.limit=2",
            "eval.temperature=0.5",
            "eval.seed=7",
            "eval.max_new_tokens=8",
            "eval.workers=1",
            "tracking.enabled=false",
        ],
    )
    cfg.benchmarks = ["math500"]
    summary = run_eval(cfg)
    assert summary["benchmarks"]["math500"]["problems"] == 2
    assert counting_engine.requests == [{"prompts": 2, "n": 3, "seed": 7, "temperature": 0.5, "top_p": 1.0, "max_new_tokens": 8}]
    assert counting_engine.closed == 1  # the eval releases its engine
    assert len(_rows(in_tmp / "ev" / "samples.jsonl")) == 6


@pytest.fixture()
def sums_benchmark(tmp_path):
    data = tmp_path / "sums.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in [(17, 25), (3, 4), (40, 2)])
    )
    bench_registry.register_benchmark(
        "test_sums", local=[str(data)], n_samples=2, fields={"problem": "question", "answer": "answer"}
    )
    yield "test_sums"
    bench_registry.REGISTERED.pop("test_sums")


@pytest.mark.slow
def test_a_benchmark_registered_here_is_evaluated_and_graded(in_tmp, sums_benchmark):
    assert sums_benchmark in bench_registry.available_benchmarks()
    cfg = compose(
        "eval", ["model=tiny", "output_dir=ev", "eval.prompt=native", "eval.max_new_tokens=8", "tracking.enabled=false"]
    )
    cfg.benchmarks = [sums_benchmark]
    summary = run_eval(cfg)
    assert summary["benchmarks"][sums_benchmark]["problems"] == 3
    samples = _rows(in_tmp / "ev" / "samples.jsonl")
    assert len(samples) == 6 and {s["answer"] for s in samples} == {"42", "7"}
    assert all("reason" in s for s in samples)


def test_mlflow_params_hold_only_the_active_interventions():
    from entropyrl.core.tracking import flatten
    from entropyrl.trainers.algos.algorithm import tracked_config

    params = flatten(tracked_config(compose("train", ["algo=stare"])))
    assert params["algo.stare.p"] == "0.1" and params["algo.interventions"] == '["stare"]'
    assert not any(k.startswith(("algo.steer.", "algo.clip_cov.", "algo.kl_cov.", "algo.tis.")) for k in params)
    assert "algo.clip.low" in params and "optim.lr" in params
