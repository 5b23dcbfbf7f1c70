"""Damaged files do not stop a resume: a checkpoint that fails to load (truncated trainer_state.pt or
weights) is skipped for the previous intact one, a half-written last line of metrics.jsonl is cut,
a staging folder left by a killed save is removed; checkpoints are fsync'd before they are renamed
into place. Real training runs and real files truncated on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from entropyrl.conf import compose
from entropyrl.core.tracking import read_metrics
from entropyrl.trainers.run import checkpoint as ckpt


def train(workdir: Path, fast_train: list[str], *extra: str, log: list | None = None) -> dict:
    from entropyrl.trainers.trainer import train as run_training

    cfg = compose(
        "train",
        [
            *fast_train,
            "output_dir=run",
            "trainer.threads=1",
            "trainer.val_every=0",
            "val.prompts=0",
            f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}",
            *extra,
        ],
    )
    return run_training(cfg, log=(log.append if log is not None else lambda *_: None))


def rows(run_dir: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
def test_a_truncated_checkpoint_falls_back_to_the_previous_one(in_tmp, fast_train):
    train(in_tmp, fast_train)  # 4 steps, checkpoints at 2 and 4
    run_dir = in_tmp / "run"
    original = rows(run_dir)
    truncate(run_dir / "checkpoints" / "step_000004" / "trainer_state.pt")
    log: list[str] = []
    summary = train(in_tmp, fast_train, log=log)
    warning = next(m for m in log if "cannot be loaded" in m)
    assert "step_000004" in warning and "skipping it and trying the previous one" in warning
    assert any("resumed from" in m and "(step 2)" in m for m in log), log
    assert summary["status"] == "FINISHED" and summary["steps"] == 4
    assert rows(run_dir) == original  # steps 3 and 4 redone bit-exactly
    state = ckpt.load_trainer_state(run_dir / "checkpoints" / "step_000004")
    assert state["step"] == 4  # rewritten, intact

    # a damaged weights file is skipped the same way
    truncate(run_dir / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    warnings: list[str] = []
    path, state, _weights = ckpt.load_latest_intact(run_dir, warn=warnings.append)
    assert path.name == "step_000002" and state["step"] == 2
    assert len(warnings) == 1 and "step_000004" in warnings[0]


@pytest.mark.slow
def test_half_written_metrics_line_and_stale_staging_folder(in_tmp, fast_train):
    train(in_tmp, fast_train, "trainer.total_steps=2")
    run_dir = in_tmp / "run"
    with (run_dir / "metrics.jsonl").open("a") as f:  # killed while writing step 3's line
        f.write('{"step": 3, "entropy": 0.9')
    staging = run_dir / "checkpoints" / ".tmp-killedsave"  # killed while saving step 3's checkpoint
    (staging / "model").mkdir(parents=True)
    (staging / "model" / "model.safetensors").write_bytes(b"\0" * 100)
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]  # readers skip the broken line
    log: list[str] = []
    summary = train(in_tmp, fast_train, "trainer.total_steps=3", log=log)
    assert summary["status"] == "FINISHED"
    assert any("dropped 1 incomplete line" in m for m in log), log
    assert [r["step"] for r in rows(run_dir)] == [1, 2, 3]  # every line complete JSON again
    assert not staging.exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000003"]


def test_checkpoint_files_and_folders_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    """Spy (calling through) on os.fsync and os.replace during a real save of the embedded model."""
    import torch

    from entropyrl.models.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    arch = compose("train", ["model=tiny"]).model.arch
    model = build_model(arch, tokenizer, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst, *a, **k):
        events.append(("replace", os.path.realpath(src)))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    final = ckpt.save_checkpoint(tmp_path, 7, model, tokenizer, optimizer, extra={})
    monkeypatch.undo()
    renames = [i for i, (kind, _) in enumerate(events) if kind == "replace"]
    assert len(renames) == 1
    staging = events[renames[0]][1]
    synced_before = {p for kind, p in events[: renames[0]] if kind == "fsync"}
    files = [p for p in final.rglob("*")]
    assert files and all(os.path.join(staging, p.relative_to(final)) in synced_before for p in files)
    assert staging in synced_before  # the staging folder itself
    assert ("fsync", os.path.realpath(final.parent)) in events[renames[0] :]  # the rename made durable
    assert not list(final.parent.glob(".tmp-*"))
