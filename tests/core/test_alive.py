"""A long set-up step that reports nothing itself shows a sign of life (reading a large data file
printed nothing until it ended)."""

from __future__ import annotations

import time


def test_a_long_block_beats_and_a_short_one_says_nothing():
    from entropyrl.core.alive import still_working

    lines: list[str] = []
    with still_working(lines.append, "data=mine: reading", every_s=0.05):
        time.sleep(0.3)
    assert len(lines) >= 3 and all(line.startswith("data=mine: reading: still working, ") for line in lines)
    count = len(lines)
    time.sleep(0.2)
    assert len(lines) == count  # the beat ends with the block
    quiet: list[str] = []
    with still_working(quiet.append, "fast", every_s=5):
        pass
    assert quiet == []


def test_the_trainers_data_loading_is_watched(monkeypatch):
    from entropyrl.conf import compose
    from entropyrl.trainers import components

    def slow_source(*args, **kwargs):
        time.sleep(0.3)
        return object()

    monkeypatch.setattr(components, "build_prompt_source", slow_source)
    lines: list[str] = []
    real = components.still_working
    monkeypatch.setattr(components, "still_working", lambda log, what, every_s=30.0: real(log, what, every_s=0.05))
    components.build_source(compose("train", ["val.prompts=0"]), None, log=lines.append)
    assert lines and lines[0].startswith("data=countdown: reading and checking the problems: still working, ")


def test_a_long_checkpoint_save_is_watched(monkeypatch, tmp_path):
    """Saving a large model and its optimizer logged nothing until it ended (minutes on a 7B model)."""
    from types import SimpleNamespace

    from entropyrl.trainers.run import checkpointer

    lines: list[str] = []
    saver = checkpointer.Checkpointer.__new__(checkpointer.Checkpointer)
    saver.log, saver.saved_step = lines.append, 0
    monkeypatch.setattr(saver, "_save", lambda step, parts: time.sleep(0.3) or tmp_path, raising=False)
    real = checkpointer.still_working
    monkeypatch.setattr(checkpointer, "still_working", lambda log, what, every_s=30.0: real(log, what, every_s=0.05))
    assert saver.save(7, SimpleNamespace()) == tmp_path and saver.saved_step == 7
    assert lines and lines[0].startswith("checkpoint of step 7: gathering and writing the model and optimizer: still working, ")


def test_checking_a_cached_model_folder_and_converting_a_gguf_file_are_watched(monkeypatch, tmp_path):
    """Hashing a cached 28 GB folder before each run, and a GGUF conversion, printed nothing for minutes."""
    from entropyrl.models import folders, gguf

    watched: list[str] = []

    def watching(log, what, every_s=30.0):
        watched.append(what)
        return real(log, what, every_s)

    real = folders.still_working
    monkeypatch.setattr(folders, "still_working", watching)
    monkeypatch.setattr(folders, "folder_damage", lambda target: None)
    entry = tmp_path / "tiny-abc"
    entry.mkdir()
    (entry / folders.RECORD).write_text("{}")
    assert folders.build_cached_folder(entry, lambda staging: None, waiting="", log=lambda *_: None) == entry
    assert watched == ["checking the cache entry tiny-abc against its record"]
    monkeypatch.setattr(gguf, "still_working", watching)
    monkeypatch.setattr(gguf, "read_layout", lambda path: None)
    monkeypatch.setattr(gguf, "file_hash", lambda path: "0" * 16)
    monkeypatch.setattr(gguf, "_cache_root", lambda: tmp_path)
    monkeypatch.setattr(gguf, "build_cached_folder", lambda target, build, **_: target)
    gguf.converted_dir(tmp_path / "m.gguf", log=lambda *_: None)
    assert watched[-1] == "model.gguf_file m.gguf: reading it whole for its checksum"


def test_a_training_runs_validation_is_watched(monkeypatch):
    """Validation samples every held-out prompt (and benchmark) between two steps: minutes on a
    CPU with nothing on screen until the step's line; now a line every 30 s (here 0.05)."""
    from types import SimpleNamespace

    from entropyrl.trainers import trainer

    def slow_validation(*_args):
        time.sleep(0.3)
        return {"val/acc": 0.5}

    monkeypatch.setattr(trainer, "validation_metrics", slow_validation)
    real = trainer.still_working
    monkeypatch.setattr(trainer, "still_working", lambda log, what, every_s=30.0: real(log, what, every_s=0.05))
    lines: list[str] = []
    run = SimpleNamespace(log=lines.append, step=7, model=None, tokenizer=None, rollout=None, source=None)
    run.val_problems, run.settings = [], None
    assert trainer.GRPOTrainer.validate(run) == {"val/acc": 0.5}
    assert lines and all(line.startswith("validation after step 7: still working, ") for line in lines), lines
