"""A training step beyond the memory it has ends in one line naming the knobs to turn (micro-batch,
LoRA, gradient checkpointing, `entropyrl plan`'s estimate) and what was kept, not in the
allocator's traceback; the steps before it stay in metrics.jsonl and the summary."""

from __future__ import annotations

import json

import pytest
import torch

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.trainers.run.oom import is_out_of_memory, memory_error
from entropyrl.trainers.trainer import GRPOTrainer, train

FAST_TINY = ["model.warm_start.steps=3", "model.warm_start.batch_size=8"]


def test_out_of_memory_is_recognised_in_each_of_torchs_forms():
    try:
        torch.empty(1 << 50, dtype=torch.uint8)  # a real allocation the CPU allocator refuses
    except RuntimeError as exc:
        assert is_out_of_memory(exc)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_the_line_names_the_knobs_not_yet_turned_and_what_was_kept():
    cfg = compose("train")
    line = str(memory_error(torch.OutOfMemoryError("CUDA out of memory.\nmore"), cfg, 7, 5, "cuda:0"))
    assert "\n" not in line and line.startswith("out of memory on cuda:0 in training step 7 (CUDA out of memory.)")
    for knob in ("trainer.micro_batch_responses", "model.lora.rank=8", "trainer.gradient_checkpointing=true", "entropyrl plan"):
        assert knob in line, line
    assert "checkpoint at step 5 is intact" in line
    turned = compose("train", ["model.lora.rank=8", "trainer.gradient_checkpointing=true", "trainer.micro_batch_tokens=512"])
    line = str(memory_error(MemoryError(), turned, 1, 0))
    assert "model.lora.rank=8" not in line and "gradient_checkpointing" not in line and "micro_batch_tokens (now 512)" in line
    assert "no step had finished" in line


def test_a_step_that_runs_out_of_memory_ends_the_run_in_one_line_with_its_record_kept(in_tmp, fast_train, monkeypatch):
    cfg = compose("train", fast_train + FAST_TINY + ["trainer.save_every=1", "tracking.enabled=false", "output_dir=run"])
    update = GRPOTrainer._update
    calls = []

    def update_then_exhaust(self, batch, metrics):
        calls.append(self.step)
        if len(calls) == 3:  # step 3 asks for more memory than there is: a real allocator failure
            torch.empty(1 << 50, dtype=torch.uint8)
        return update(self, batch, metrics)

    monkeypatch.setattr(GRPOTrainer, "_update", update_then_exhaust)
    with pytest.raises(UserError) as err:
        train(cfg, log=lambda *_: None)
    line = str(err.value)
    assert line.startswith("out of memory on cpu in training step 3 ([enforce fail") or "can't allocate memory" in line, line
    assert "training step 3" in line and "checkpoint at step 2 is intact" in line and "entropyrl plan" in line
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["status"] == "FAILED" and summary["steps"] == 2
    steps = [json.loads(r)["step"] for r in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines() if r.strip()]
    assert steps == [1, 2]
