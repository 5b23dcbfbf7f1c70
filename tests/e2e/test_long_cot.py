"""The long-CoT preset's shape on CPU: `experiment=stare_32b_long_cot` with the embedded model in
place of Qwen2.5-32B and every length scaled down (a response budget the tiny task's answers reach,
an overlong buffer, token-budget micro-batches, overlong filtering on): one short run logs every
long-CoT metric to metrics.jsonl and MLflow and writes the figure."""

from __future__ import annotations

import json

import pytest
import torch

from entropyrl.trainers.stats.tool_stats import overlong_filter

NUMBERS = "[" + ",".join(str(i) for i in range(200)) + "]"  # the tiny model writes numbers: let them "reflect"
SHORTENED = [
    "experiment=stare_32b_long_cot",
    "model=tiny",
    "data=toy",
    "rollout=hf",
    "trainer.dtype=float32",
    "trainer.gradient_checkpointing=false",
    "trainer.total_steps=2",
    "trainer.prompts_per_step=4",
    "trainer.mini_batch_prompts=2",
    "rollout.n=4",
    "rollout.max_new_tokens=3",  # the toy answers are 2-4 tokens: some reach the budget
    "algo.overlong.buffer=1",
    "algo.overlong.filter=true",
    "trainer.micro_batch_tokens=24",
    "val.benchmarks=[]",
    "trainer.val_every=0",
    "trainer.save_every=0",
    "trainer.progress=false",
    f"diagnostics.reflection.words={NUMBERS}",
    "output_dir=run",
]


def test_overlong_filter_zeroes_the_rows_cut_at_the_budget():
    mask = torch.ones(3, 4)
    out, share = overlong_filter(mask, torch.tensor([False, True, False]))
    assert out.tolist() == [[1.0] * 4, [0.0] * 4, [1.0] * 4] and share == pytest.approx(1 / 3)
    assert mask.sum() == 12  # the caller's mask is not changed


@pytest.mark.slow
def test_the_long_cot_preset_shape_logs_every_metric_and_the_figure(in_tmp):
    from mlflow.tracking import MlflowClient

    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import train

    cfg = compose("train", SHORTENED)
    assert cfg.trainer.micro_batch_tokens == 24 and cfg.algo.overlong.enabled and cfg.algo.interventions == ["stare"]
    summary = train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        for key in (
            "reflection/density",
            "reflection/frac",
            "reflection/entropy_at",
            "reflection/entropy_all",
            "repetition/score/mean",
            "response_length/correct/mean",
            "response_length/incorrect/mean",
            "response_length/clip_frac",
            "overlong/filtered_frac",
            "stare/gate_on",
        ):
            assert key in row, key
        # overlong filtering takes out responses cut at the budget (clip_frac counts every generated
        # response, dynamic sampling's dropped groups too; the filter sees the trained batch)
        assert 0 <= row["overlong/filtered_frac"] <= 1
        if row["response_length/clip_frac"] == 0:
            assert row["overlong/filtered_frac"] == 0
    assert any(r["overlong/filtered_frac"] > 0 for r in rows), [r["response_length/clip_frac"] for r in rows]
    assert (in_tmp / "run" / "reflection.png").stat().st_size > 5000
    client = MlflowClient(summary["tracking_uri"])
    run = client.get_run(summary["mlflow_run_id"])
    assert {"reflection/density", "reflection/entropy_at", "overlong/filtered_frac", "response_length/clip_frac"} <= set(
        run.data.metrics
    )
    assert "reflection.png" in {a.path for a in client.list_artifacts(run.info.run_id)}
