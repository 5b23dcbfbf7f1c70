"""Validation of a tool run samples as training does: through the multi-turn driver with the
tool (``evals/runner.py: validate``, ``trainers/trainer.py: GRPOTrainer.validate``), and logs the tool
figures (``val/<bench>/tools/calls/mean``, ``val/tools/calls/mean``). A tool-using policy validated
without its interpreter would be measured on a task it was never meant to do alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.evals.runner import validate
from entropyrl.trainers import components
from entropyrl.trainers.trainer import GRPOTrainer

# the tool-using warm start of tests/rollout/test_tools.py (the same cache entry)
TINY_TOOL = [
    "data=tool_arith",
    "tools=code_interpreter",
    "model.warm_start.steps=120",
    "model.warm_start.batch_size=32",
    "model.warm_start.label_noise=0.2",
]
ROWS = '{"problem": "4821+9377=", "answer": "14198"}\n{"problem": "1234+5678=", "answer": "6912"}\n'


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory):
    from entropyrl.models.loading import load_policy

    cfg = compose("train", TINY_TOOL)
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    bench = tmp_path_factory.mktemp("val") / "arith.jsonl"
    bench.write_text(ROWS)
    val = OmegaConf.create(
        {"benchmarks": [str(bench)], "n_samples": 4, "temperature": 1.0, "max_new_tokens": None, "prompt": "boxed"}
    )
    return cfg, model, tok, val


@pytest.mark.slow
def test_benchmark_validation_of_a_tool_run_calls_the_tool(tool_run):
    cfg, model, tok, val = tool_run
    out = validate(model, tok, list(val.benchmarks), val, tools=cfg.tools, max_new_tokens=int(cfg.rollout.max_new_tokens))
    assert out["val/arith/tools/calls/mean"] > 0 and out["val/arith/tools/turns/mean"] >= 1
    assert 0 < out["val/arith/tools/called_frac"] <= 1 and 0 <= out["val/arith/tools/error_frac"] <= 1
    assert {"val/arith/tools/malformed_frac", "val/arith/tools/repeated_frac", "val/arith/tools/void_frac"} <= set(out)
    assert 0 <= out["val/arith/avg@4"] <= 1
    plain = validate(model, tok, list(val.benchmarks), val, max_new_tokens=int(cfg.rollout.max_new_tokens))
    assert "val/arith/avg@4" in plain and not any("/tools/" in k for k in plain)  # no tool section: one turn


@pytest.mark.slow
def test_the_trainers_validation_goes_through_the_tool_driver(tool_run):
    cfg, model, tok, val = tool_run
    engine = components.build_engine(cfg, model, tok)  # the training run's multi-turn driver
    source = components.build_source(cfg, tok)
    ran: list[int] = []
    executor = engine.executor
    engine.executor = lambda codes, **kw: ran.append(len(codes)) or executor(codes, **kw)  # the run's own sandbox
    asked: list[dict] = []
    generate = engine.generate
    engine.generate = lambda prompts, **kw: asked.append(kw) or generate(prompts, **kw)
    val = OmegaConf.merge(val, {"max_new_tokens": 30, "top_p": 0.9})  # read by both parts of validation
    trainer = SimpleNamespace(
        cfg=cfg,
        log=print,
        step=0,
        model=model,
        tokenizer=tok,
        rollout=engine,
        source=source,
        val_problems=source.validation(4),
        settings=SimpleNamespace(
            seed=0,
            val_temperature=1.0,
            val_pass_k=0,
            val_benchmarks=tuple(val.benchmarks),
            val=val,
            tools=cfg.tools,  # StepSettings: the tools section and the rollout's cap, read once at set-up
            rollout_max_new_tokens=int(cfg.rollout.max_new_tokens),
        ),
    )
    out = GRPOTrainer.validate(trainer)
    assert out["val/tools/calls/mean"] > 0 and "val/acc" in out  # the task's held-out prompts, with the tool
    assert out["val/arith/tools/calls/mean"] > 0  # the benchmarks, with the tool
    assert sum(ran) > 2  # both went through the run's executor
    assert asked[0]["max_new_tokens"] == 30 and asked[0]["top_p"] == 0.9  # val.*, not the rollout's


@pytest.mark.slow
def test_benchmark_validation_reads_val_max_new_tokens_else_the_rollouts(tool_run, monkeypatch):
    """``val.max_new_tokens: null`` is documented as ``rollout.max_new_tokens``: the trainer passes
    it, and a value set under ``val`` wins."""
    from entropyrl.evals import runner

    cfg, model, tok, val = tool_run
    seen = []
    monkeypatch.setattr(runner, "evaluate", lambda engine, tok, data, settings: seen.append(settings) or ({}, []))
    validate(model, tok, list(val.benchmarks), val, max_new_tokens=40)
    validate(model, tok, list(val.benchmarks), OmegaConf.merge(val, {"max_new_tokens": 12}), max_new_tokens=40)
    assert [s.max_new_tokens for s in seen] == [40, 12]
