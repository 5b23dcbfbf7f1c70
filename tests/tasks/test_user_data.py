"""The user's words stand: an explicit data.path is read as written or refused naming it (never a hub
download), a data file's problems are said in the user's terms (empty, the line of a bad byte, the
columns read, rows too large to read), and model.path may name a checkpoint or run folder."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from entropyrl.conf import compose
from entropyrl.core.errors import UserError

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def _source(*overrides, tokenizer=None):
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    return build_prompt_source(compose("train", ["data=dapo_math_17k", *overrides]).data, seed=0, tokenizer=tokenizer)


def _rows(path, n=6, big=None):
    lines = [json.dumps({"question": f"What is {i}+{i}?", "answer": str(2 * i)}) for i in range(n)]
    if big is not None:
        lines.insert(2, json.dumps({"question": "x" * big + " 1", "answer": "1"}))  # a digit: something reaches the tiny model
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("make", ["typo", "folder"])
def test_an_explicit_data_path_that_is_not_a_file_is_refused_before_the_run_not_replaced_by_the_hub(make, tmp_path, monkeypatch):
    from entropyrl.trainers.preflight import check_training

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the hub would be reachable: still never used
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    target = tmp_path / ("my_mathh.jsonl" if make == "typo" else "folder")
    if make == "folder":
        target.mkdir()
    cfg = compose("train", ["data=dapo_math_17k", f"data.path={target}", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(UserError) as err:
        check_training(cfg)  # the pre-flight: before any folder or model
    msg = str(err.value)
    assert "\n" not in msg and str(target) in msg
    assert ("no such file (looked for" in msg and "exists" not in msg) if make == "typo" else ("is a folder" in msg)
    assert not (tmp_path / "run").exists()


def test_a_relative_data_path_is_read_from_the_working_folder_and_its_columns_are_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _rows(tmp_path / "mine.jsonl")
    src = _source("data.path=mine.jsonl")
    assert len(src.train_items) == 6 and src.where == str(tmp_path / "mine.jsonl")
    assert "problem from 'question', answer from 'answer'" in src.notes[0] and "guessed" in src.notes[0]
    chosen = _source("data.path=mine.jsonl", "data.fields.problem=question", "data.fields.answer=answer")
    assert "guessed" not in chosen.notes[0]


def test_an_empty_file_says_empty(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    for name in ("empty.jsonl", "blank.jsonl"):
        with pytest.raises(UserError, match="the file is empty") as err:
            _source(f"data.path={tmp_path / name}")
        assert "prompt" not in str(err.value)  # not blamed on prompt length


def test_a_non_utf8_byte_names_its_line_and_says_re_encode(tmp_path):
    path = _rows(tmp_path / "latin1.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"What", b"Caf\xe9 what")  # latin-1 e-acute on line 4
    path.write_bytes(b"".join(lines))
    with pytest.raises(UserError) as err:
        _source(f"data.path={path}")
    msg = str(err.value)
    assert f"{path}:4:" in msg and "0xe9" in msg and "re-encode the file as UTF-8" in msg


def test_rows_over_the_byte_limit_are_skipped_before_tokenising_and_counted(tmp_path):
    calls = []

    class CountingTokenizer:  # records the size of every text it is handed
        def __call__(self, text, add_special_tokens=False):
            calls.append(len(text))
            return {"input_ids": list(range(len(text)))}

    path = _rows(tmp_path / "big.jsonl", big=3_000_000)
    src = _source(
        f"data.path={path}",
        "data.max_row_bytes=100000",
        "data.chat_template=false",
        "data.prompt=boxed",
        tokenizer=CountingTokenizer(),
    )
    assert len(src.train_items) == 6 and max(calls) < 1000  # the 3 MB row never reached the tokenizer
    assert any(n.startswith("data: skipped 1 row(s) over data.max_row_bytes=100000") for n in src.notes)
    only_big = tmp_path / "only_big.jsonl"
    only_big.write_text(json.dumps({"question": "y" * 200_000, "answer": "1"}) + "\n")
    with pytest.raises(UserError, match=r"1 row\(s\) over data.max_row_bytes"):
        _source(f"data.path={only_big}", "data.max_row_bytes=100000")


def test_overlong_prompts_are_counted(tmp_path):
    from entropyrl.models.tiny import build_tokenizer

    path = _rows(tmp_path / "mine.jsonl", big=300)
    src = _source(
        f"data.path={path}",
        "data.max_prompt_length=100",
        "data.chat_template=false",
        "data.prompt=boxed",
        "data.unrepresentable=warn",  # English prompts through the embedded character tokenizer
        tokenizer=build_tokenizer(),
    )
    assert len(src.train_items) == 6
    assert any(n.startswith("data: dropped 1 of 7 prompt(s) longer than data.max_prompt_length=100") for n in src.notes)
    with pytest.raises(UserError, match="all 7 prompt"):
        _source(
            f"data.path={path}",
            "data.max_prompt_length=3",
            "data.chat_template=false",
            "data.unrepresentable=warn",
            tokenizer=build_tokenizer(),
        )


def test_prompts_the_embedded_model_cannot_read_are_refused_naming_rows_characters_and_the_fix(tmp_path):
    """An English word problem through the embedded character tokenizer would reach the model as its
    digits ("Cara has 30 marbles..." -> "30"): refused at load time, or kept and counted when asked."""
    from entropyrl.models.tiny import build_tokenizer

    path = tmp_path / "mine.jsonl"
    rows = [{"question": "1+2=", "answer": "3"}, {"question": "Cara has 30 marbles and gets 12 more.", "answer": "42"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    plain = ("data.chat_template=false", "data.prompt=native", "data.fields.problem=question", "data.fields.answer=answer")
    with pytest.raises(UserError) as err:
        _source(f"data.path={path}", *plain, tokenizer=build_tokenizer())
    msg = str(err.value)
    # the template's instruction is English too: every prompt, each row named, the characters in order
    assert "\n" not in msg and "2 of 2 prompt(s)" in msg and "rows 0, 1;" in msg and "characters '\\nPleas" in msg
    assert "model=smollm2-135m" in msg and "data.unrepresentable=warn" in msg
    kept = _source(f"data.path={path}", *plain, "data.unrepresentable=warn", tokenizer=build_tokenizer())
    assert len(kept.train_items) == 2 and any("warning" in n and "2 of 2 prompt(s)" in n for n in kept.notes)
    with pytest.raises(UserError, match="data.unrepresentable=maybe is not allowed"):
        _source(f"data.path={path}", *plain, "data.unrepresentable=maybe", tokenizer=build_tokenizer())


def test_a_prompt_of_which_nothing_reaches_the_model_is_left_out_and_counted_under_warn(tmp_path):
    """A word problem without a digit reaches the embedded model as nothing at all: no engine can
    generate from an empty prompt, so under warn the row is left out and named in the warning line;
    a file of which no prompt keeps a character is one error, not a run on nothing."""
    from entropyrl.models.tiny import build_tokenizer, nothing_left, representable

    tok = build_tokenizer()
    assert nothing_left(tok, "Cara has some marbles.") and not nothing_left(tok, "Cara has 30 marbles.")
    assert representable(tok, ["a b c", "1+2=", "", "x 7"]) == [1, 3]
    path = tmp_path / "mine.jsonl"
    rows = [
        {"question": "1+2=", "answer": "3"},
        {"question": "How many marbles?", "answer": "4"},
        {"question": "7-5=", "answer": "2"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    plain = ("data.chat_template=false", "data.prompt=native", "data.fields.problem=question", "data.fields.answer=answer")
    kept = _source(f"data.path={path}", *plain, "data.unrepresentable=warn", tokenizer=tok)
    assert sorted({p.answer for p in kept.train_items}) == ["2", "3"]
    assert any("1 of them keep no character at all and are left out (rows 1)" in n for n in kept.notes), kept.notes
    path.write_text(json.dumps(rows[1]) + "\n")
    with pytest.raises(UserError, match="no prompt of .* keeps a character the model can represent"):
        _source(f"data.path={path}", *plain, "data.unrepresentable=warn", tokenizer=tok)


def test_a_tokenizer_that_reads_every_text_has_no_unknown_characters():
    from entropyrl.models.tiny import build_tokenizer, unknown_characters

    assert unknown_characters(build_tokenizer(), "12+30=42") == ""
    assert unknown_characters(build_tokenizer(), "Cara: 30") == "Car"  # each once, in order

    class Bytes:  # a byte-level BPE has no unknown token
        unk_token_id = None

    assert unknown_characters(Bytes(), "anything at all") == ""


def test_the_code_task_refuses_a_folder_as_data_path(tmp_path):
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    with pytest.raises(UserError, match="is a folder"):
        build_prompt_source(compose("train", ["data=humaneval_code", f"data.path={tmp_path}"]).data, seed=0)


def test_data_path_on_a_builtin_task_says_the_way_to_your_own_file():
    out = subprocess.run([*CLI, "train", "data.path=/tmp/mine.jsonl"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "data=dapo_math_17k data.path=FILE" in out.stderr


def test_model_path_may_name_a_checkpoint_or_its_run_folder(tmp_path):
    from entropyrl.models.loading import checkpoint_label, resolve_model_path

    run = tmp_path / "my-run"
    for step in (2, 10):
        model = run / "checkpoints" / f"step_{step:06d}" / "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
    said = []
    step10 = run / "checkpoints" / "step_000010"
    assert resolve_model_path(str(step10), log=said.append) == str(step10 / "model")
    assert resolve_model_path(str(run), log=said.append) == str(step10 / "model")  # the latest checkpoint
    assert resolve_model_path(str(step10 / "model")) == str(step10 / "model")  # a model folder: as is
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a hub id: as is
    assert len(said) == 2 and all("loading" in s or "latest" in s for s in said)
    lora = run / "checkpoints" / "step_000010"
    (lora / "model" / "config.json").unlink()
    (lora / "model" / "adapter_config.json").write_text("{}")
    (lora / "merged").mkdir()
    (lora / "merged" / "config.json").write_text("{}")
    assert resolve_model_path(str(lora)) == str(lora / "merged")  # LoRA: the merged model
    # eval runs are named after the run and the step they evaluate
    assert checkpoint_label(str(step10 / "model")) == "my-run-step10"
    assert checkpoint_label(str(run / "checkpoints" / "step_000002" / "model")) == "my-run-step2"
    assert checkpoint_label("/models/Qwen2.5-0.5B") == "Qwen2.5-0.5B"
    with pytest.raises(UserError, match="without a checkpoint"):
        (tmp_path / "empty-run" / "checkpoints").mkdir(parents=True)
        resolve_model_path(str(tmp_path / "empty-run"))


def test_prompts_past_the_models_context_are_refused_naming_rows_and_the_fix_and_leave_no_run_folder(tmp_path):
    """The embedded model has 64 positions: a prompt that leaves no room for the response would be
    generated past the positions the model was built for; refused at set-up, naming the rows."""
    rows = [("1+2=", "3")] * 3 + [("1+" * 30 + "1=", "31"), ("2+" * 29 + "2=", "60")]
    path = tmp_path / "mine.jsonl"
    lines = [json.dumps({"prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": a}}) for q, a in rows]
    path.write_text("\n".join(lines) + "\n")
    base = [*CLI, "train", "data=dapo_math_17k", f"data.path={path}", "data.chat_template=false", "tracking.enabled=false"]
    base += ["trainer.total_steps=1", "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2", "val.prompts=0"]
    run = subprocess.run(base, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
    assert run.returncode == 2 and "Traceback" not in run.stderr and len(errors) == 1, run.stderr[-2000:]
    assert "2 prompt(s) do not leave rollout.max_new_tokens=6 in the model's context of 64 positions" in errors[0]
    assert "(rows 3, 4; longest 62 tokens)" in errors[0] and "data.max_prompt_length=58 leaves them out" in errors[0]
    assert list((tmp_path / "outputs" / "train").iterdir()) == []  # the run folder it had made is gone
    no_room = subprocess.run([*base, "rollout.max_new_tokens=64"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert no_room.returncode == 2 and "rollout.max_new_tokens=64 leaves no room for a prompt" in no_room.stderr
    fits = subprocess.run([*base, "data.max_prompt_length=58"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert "dropped 2 of 3 prompt(s) longer than data.max_prompt_length=58" in fits.stderr
