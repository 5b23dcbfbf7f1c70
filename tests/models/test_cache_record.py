"""Every cache entry the project builds (the embedded model's warm start, a GGUF conversion) is whole
or absent: its builder writes a completion record (size and SHA-256 of each file) last, every read
checks it, and a damaged entry is built again with a line saying why -- never believed forever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entropyrl.conf import compose
from entropyrl.models import tiny
from entropyrl.models.folders import RECORD, build_cached_folder, folder_damage, save_model_folder, write_record
from entropyrl.models.loading import load_policy


def _small_build(calls: list):
    """A cheap cache build: a randomly initialised tiny model and its tokenizer."""

    def build(staging: Path) -> None:
        calls.append(staging)
        tok = tiny.build_tokenizer()
        save_model_folder(tiny.build_model(compose("train").model.arch, tok, seed=0), staging, tok)

    return build


def _entry(tmp_path, calls, lines) -> Path:
    return build_cached_folder(tmp_path / "cache" / "entry", _small_build(calls), waiting="waiting", log=lines.append)


def test_a_new_entry_has_a_record_of_every_file(tmp_path):
    calls, lines = [], []
    folder = _entry(tmp_path, calls, lines)
    record = json.loads((folder / RECORD).read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(record["files"])
    assert record["files"]["model.safetensors"]["size"] == (folder / "model.safetensors").stat().st_size
    assert folder_damage(folder) is None
    assert _entry(tmp_path, calls, lines) == folder and len(calls) == 1  # read, not built again


@pytest.mark.parametrize("damage", ["cut", "flipped", "deleted"])
def test_a_damaged_entry_is_built_again_with_a_line(tmp_path, damage):
    calls, lines = [], []
    folder = _entry(tmp_path, calls, lines)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    if damage == "cut":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":  # same size, one byte changed: only the hash sees it
        weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    else:
        weights.unlink()
    assert folder_damage(folder) is not None
    again = _entry(tmp_path, calls, lines)
    assert again == folder and len(calls) == 2
    said = [m for m in lines if "is damaged" in m]
    assert len(said) == 1 and str(folder) in said[0] and "building it again" in said[0], lines
    assert weights.read_bytes() == data and folder_damage(folder) is None


def test_an_entry_from_before_records_is_adopted_when_whole_and_rebuilt_when_cut(tmp_path):
    calls, lines = [], []
    folder = _entry(tmp_path, calls, lines)
    (folder / RECORD).unlink()  # as an older version left it
    assert folder_damage(folder) is None
    assert _entry(tmp_path, calls, lines) == folder and len(calls) == 1 and (folder / RECORD).is_file()
    (folder / RECORD).unlink()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert "model.safetensors holds" in folder_damage(folder)
    _entry(tmp_path, calls, lines)
    assert len(calls) == 2 and folder_damage(folder) is None and (folder / RECORD).is_file()


def test_write_record_then_an_unreadable_record_is_damage(tmp_path):
    calls, lines = [], []
    folder = _entry(tmp_path, calls, lines)
    (folder / RECORD).write_text("{not json")
    assert "completion record" in folder_damage(folder)
    write_record(folder)
    assert folder_damage(folder) is None


def test_the_embedded_models_cut_weights_are_rebuilt_not_a_loader_traceback(tmp_path, monkeypatch):
    """The warm-start cache whose weights file was cut short (a full disk) loaded as complete
    before: every later run ended in a SafetensorError traceback."""
    monkeypatch.setenv("ENTROPYRL_CACHE", str(tmp_path / "cache"))
    cfg = compose("train", ["model.warm_start.steps=20"])
    folder = tiny.embedded_model_dir(cfg.model, cfg.data, log=lambda *_: None)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    lines: list[str] = []
    model, _tok = load_policy(cfg.model, cfg.data, log=lines.append)
    assert model.config.model_type == "qwen2"
    assert any("is damaged (model.safetensors holds 1000 bytes" in m for m in lines), lines


def test_a_model_path_folder_with_cut_weights_is_one_line_not_a_safetensors_traceback(tmp_path):
    from omegaconf import OmegaConf

    from entropyrl.core.errors import UserError

    calls, lines = [], []
    folder = tmp_path / "saved"
    _small_build(calls)(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    cfg = OmegaConf.create({"name": "x", "path": str(folder), "dtype": "float32"})
    with pytest.raises(UserError, match=r"cannot load model '.*saved': model.safetensors holds 5000 bytes, its header describes"):
        load_policy(cfg, log=lines.append)
