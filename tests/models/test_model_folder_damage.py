"""A model folder the user names (``model.path``) that would not load whole is one ``error:`` line naming
the file and the fix, before any loader reads it: never a loader's traceback, never an empty prompt, and
never a damaged file silently replaced by defaults (transformers falls back to the config's generation
settings when ``generation_config.json`` does not parse: another end of response)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.evals.engine_setup import make_engine
from entropyrl.models import tiny
from entropyrl.models.folders import loadable_folder_damage, save_model_folder
from entropyrl.models.loading import load_policy, load_tokenizer


@pytest.fixture
def folder(tmp_path) -> Path:
    """A whole, randomly initialised embedded-shape model folder with its tokenizer."""
    tok = tiny.build_tokenizer()
    out = tmp_path / "model"
    save_model_folder(tiny.build_model(compose("train").model.arch, tok, seed=0), out, tok)
    return out


def _model_cfg(path: Path):
    return OmegaConf.create({"name": "x", "path": str(path), "dtype": "float32", "chat_template": None, "stop_tokens": []})


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {
    "tokenizer.json missing": (lambda f: (f / "tokenizer.json").unlink(), "its tokenizer encodes no text"),
    "tokenizer.json cut": (lambda f: _cut(f / "tokenizer.json"), "tokenizer.json is not whole JSON"),
    "tokenizer.json not a tokenizer": (
        lambda f: (f / "tokenizer.json").write_text("{}"),
        "its tokenizer files do not load",
    ),
    "tokenizer_config.json cut": (lambda f: _cut(f / "tokenizer_config.json"), "tokenizer_config.json is not whole JSON"),
    "generation_config.json cut": (lambda f: _cut(f / "generation_config.json"), "generation_config.json is not whole JSON"),
    "config.json missing": (lambda f: (f / "config.json").unlink(), "it has no config.json"),
    "config.json cut": (lambda f: _cut(f / "config.json"), "config.json is not whole JSON"),
    "weights missing": (lambda f: (f / "model.safetensors").unlink(), "it has no weights file"),
    "weights cut": (lambda f: _cut(f / "model.safetensors"), "model.safetensors"),
}


def test_a_whole_folder_loads_and_says_no_damage(folder):
    """The null: the same folder undamaged loads, with the generation settings it was saved with."""
    assert loadable_folder_damage(folder) is None
    model, tok = load_policy(_model_cfg(folder), log=lambda *_: None)
    assert tok("0123", add_special_tokens=False)["input_ids"] and model.generation_config.eos_token_id is not None


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_model_folder_is_one_line_naming_what_is_wrong(folder, damage):
    hurt, says = DAMAGES[damage]
    hurt(folder)
    with pytest.raises(UserError, match=rf"cannot load model '{folder}': .*{says}") as err:
        load_policy(_model_cfg(folder), log=lambda *_: None)
    assert "\n" not in str(err.value)


def test_a_hub_id_is_not_checked_as_a_folder(tmp_path):
    assert loadable_folder_damage(tmp_path / "org" / "model") is None


@pytest.mark.parametrize("given", ["/nonexistent/folder", "./outputs/myrun", "outputs/myrun", "../no/such/model"])
def test_a_missing_local_model_path_says_no_such_folder(tmp_path, monkeypatch, given):
    """A mistyped folder was passed to the hub and came back as "Repo id must be in the form..." or
    "Repository Not Found". Null: a hub id (namespace/name) is left to the hub."""
    from entropyrl.models.loading import model_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    with pytest.raises(UserError, match=rf"model.path={given}: no such folder.*or a hub id \(namespace/name\)"):
        model_dir(compose("train", [f"model.path={given}"]).model)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    lines: list[str] = []  # an id no cache holds: its download is said
    assert model_dir(compose("train", ["model.path=nobody/not-cached"]).model, log=lines.append) == "nobody/not-cached"
    assert lines == [
        "model.path=nobody/not-cached: not in the Hugging Face cache yet: downloading it from the hub (its progress below)"
    ]


def test_the_commands_that_load_a_model_keep_the_hubs_download_bars():
    """transformers' disable_progress_bar turned the hub's off too: a 15 GB first download showed nothing."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    from entropyrl.cli.common import quiet_transformers

    try:
        quiet_transformers()
        assert not are_progress_bars_disabled() and not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_a_tokenizer_of_another_model_is_refused_before_an_index_out_of_range(folder):
    """A tokenizer whose ids the model's embedding table does not hold (its files copied from another
    model) failed at the first forward with an IndexError; the folder's own tokenizer (the null) loads."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rows = load_policy(_model_cfg(folder), log=lambda *_: None)[0].get_input_embeddings().num_embeddings
    symbols = ["<pad>", "<eos>", "<unk>"] + list("0123456789abcdefghijklmnopqrstuvwxyz")
    assert len(symbols) > rows
    inner = Tokenizer(models.WordLevel({s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>").save_pretrained(
        folder
    )
    with pytest.raises(UserError, match=rf"token ids up to {len(symbols) - 1} but the model's embedding table holds {rows}"):
        load_policy(_model_cfg(folder), log=lambda *_: None)


def test_an_engine_that_loads_the_folder_itself_gets_the_same_check(folder):
    """vLLM starts from the folder (``loads_from_path``): its tokenizer is read through the same check,
    before any engine starts."""
    (folder / "tokenizer.json").unlink()
    cfg = compose("eval", [f"model.path={folder}", "eval.backend=vllm"])
    with pytest.raises(UserError, match="its tokenizer encodes no text"):
        make_engine(cfg, log=lambda *_: None)
    with pytest.raises(UserError, match="its tokenizer encodes no text"):
        load_tokenizer(str(folder))


def test_the_cli_says_one_error_line_for_a_folder_without_its_tokenizer(folder, tmp_path):
    (folder / "tokenizer.json").unlink()
    cmd = [sys.executable, "-m", "entropyrl.cli.main", "train", f"model.path={folder}", "data=toy"]
    cmd += ["trainer.total_steps=1", "tracking.enabled=false", f"output_dir={tmp_path / 'run'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "its tokenizer encodes no text" in errors[0] and "Traceback" not in done.stderr
