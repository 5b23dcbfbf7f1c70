"""Long chain-of-thought metrics (docs/long-cot.md): reflection words, repetition, lengths by
verdict, entropy at reflection tokens, the grade/eval reflection blocks, the samples table, and a
short training run that logs them."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from entropyrl.core.errors import UserError
from entropyrl.evals.reflection import (
    WORD_LISTS,
    ReflectionMatcher,
    TokenPieces,
    density,
    reflection_block,
    reflection_eval_metrics,
    reflection_token_positions,
    repetition_score,
    resolve_words,
    response_text_metrics,
)
from entropyrl.trainers.run import samples as run_samples
from entropyrl.trainers.stats.reflection import reflection_entropy_metrics, reflection_settings, reflection_token_masks

DEFAULT = ReflectionMatcher(WORD_LISTS["default"])


# -- words ----------------------------------------------------------------------------------------
def test_counts_are_case_insensitive_on_word_boundaries():
    text = "Wait, let me recheck. I await the waiting. Let me try   again.\nHOWEVER it holds; wait."
    spans = DEFAULT.spans(text)
    assert [text[a:b] for a, b in spans] == ["Wait", "recheck", "try   again", "HOWEVER", "wait"]
    assert DEFAULT.count(text) == 5
    # a letter whose lower-casing changes the text's length: matched case-insensitively, spans still index the text
    odd = "\u0130 WAIT now"
    assert [odd[a:b] for a, b in DEFAULT.spans(odd)] == ["WAIT"]


def test_the_built_in_lists_and_a_configured_one():
    assert resolve_words("orz") == ("wait", "recheck", "retry", "alternatively", "however")
    assert "rethink" in resolve_words("oat_zero") and "go over the steps" in resolve_words("oat_zero")
    assert set(resolve_words("default")) == set(WORD_LISTS["orz"]) | set(WORD_LISTS["oat_zero"])
    hmm = ReflectionMatcher(resolve_words(["hmm", "on second thought"]))
    assert hmm.count("Hmm. On second  thought, hmm!") == 3 and hmm.count("Wait, recheck") == 0
    assert resolve_words([42]) == ("42",)  # a command line's [42] arrives as a number
    with pytest.raises(UserError, match="is not a word list"):
        resolve_words("nope")
    with pytest.raises(UserError, match="not a word or phrase"):
        resolve_words(["wait", ""])


def test_an_empty_list_turns_reflection_metrics_off():
    off = ReflectionMatcher(resolve_words([]))
    assert not off.enabled and off.count("wait wait") == 0 and off.spans("wait") == []
    assert resolve_words(None) == ()
    out = response_text_metrics(["wait, a b c d a b c d"], [10], [1.0], off)
    assert not any(k.startswith("reflection/") for k in out)
    assert out["repetition/score/mean"] == pytest.approx(1 - 5 / 6)  # repetition and lengths stay
    assert out["response_length/correct/mean"] == 10


def test_density_and_repetition_by_hand():
    assert density(3, 600) == pytest.approx(5.0) and density(2, 0) == 0.0
    assert repetition_score("a b c d a b c d") == pytest.approx(1 - 4 / 5)  # 5 four-grams, 4 distinct
    assert repetition_score("go go go go go go") == pytest.approx(1 - 1 / 3)
    assert repetition_score("x y z") == 0.0 and repetition_score("A b c d e") == 0.0
    assert repetition_score("a b a b", n=2) == pytest.approx(1 - 2 / 3)
    block = reflection_block("Wait, one two three wait", DEFAULT)
    assert block == {"count": 2, "density": pytest.approx(2000 / 5), "tokens": 5, "unit": "words"}
    assert reflection_block("wait", DEFAULT, tokens=250)["density"] == pytest.approx(4.0)


def test_step_text_metrics_by_hand():
    texts = ["Wait, no. Wait.", "fine", "Recheck it"]
    out = response_text_metrics(texts, [10, 20, 10], [1.0, 0.0, 0.0], DEFAULT)
    assert out["reflection/count/mean"] == pytest.approx(1.0)  # counts 2, 0, 1
    assert out["reflection/density"] == pytest.approx(1000 * 3 / 40)
    assert out["reflection/frac"] == pytest.approx(2 / 3)
    assert out["reflection/frac/correct"] == 1.0 and out["reflection/frac/incorrect"] == pytest.approx(0.5)
    assert out["response_length/correct/mean"] == 10 and out["response_length/incorrect/mean"] == 15
    only_wrong = response_text_metrics(["x"], [4], [0.0], DEFAULT)
    assert "response_length/correct/mean" not in only_wrong and "reflection/frac/correct" not in only_wrong


# -- tokens ---------------------------------------------------------------------------------------
def test_token_positions_follow_the_pieces():
    assert reflection_token_positions(["Let", " me", " wa", "it", ",", " ok"], DEFAULT) == ([2, 3], [2])
    assert reflection_token_positions(["Wait", ",", "wait"], DEFAULT) == ([0, 2], [0, 2])
    assert reflection_token_positions(["try", " ag", "ain wait"], DEFAULT) == ([0, 1, 2], [0, 2])
    assert reflection_token_positions(["x", "", "wait", "", "!"], DEFAULT) == ([], [])  # "xwait": no boundary
    assert reflection_token_positions(["so", "", " wait"], DEFAULT) == ([2], [2])  # an empty piece is skipped


def _char_tokenizer():
    """A Hugging Face fast tokenizer with one token per printable character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>"] + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def test_token_pieces_of_a_real_tokenizer_rebuild_the_text():
    tok = _char_tokenizer()
    text = "12+3=15 wait, 15"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = TokenPieces.for_tokenizer(tok)
    assert "".join(pieces.pieces(ids)) == text
    at, first = reflection_token_positions(pieces.pieces(ids), DEFAULT)
    assert first == [text.index("wait")] and at == list(range(8, 12))  # one character a token


def _crafted_batch():
    """Two responses over a five-piece vocabulary; row 0 reflects at token 1, row 1 does not."""
    table = ["So", " wait", ",", " no", "ok", " fine", ".", ""]
    ids = torch.tensor([[0, 1, 2, 3, 7], [4, 5, 6, 7, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    entropy = torch.tensor([[0.1, 0.9, 0.3, 0.4, 5.0], [0.2, 0.2, 0.2, 9.0, 9.0]], dtype=torch.float64)
    logp = torch.tensor([[-1.0, -2.0, -0.5, -0.5, 0.0], [-0.1, -0.1, -0.1, 0.0, 0.0]], dtype=torch.float64)
    return TokenPieces(table.__getitem__), ids, mask, entropy, logp


def test_entropy_at_reflection_tokens_by_hand():
    pieces, ids, mask, entropy, logp = _crafted_batch()
    at, before, first = reflection_token_masks(ids, mask, pieces, DEFAULT)
    assert at.nonzero().tolist() == [[0, 1]] and before.nonzero().tolist() == [[0, 0]]
    assert first.nonzero().tolist() == [[0, 1]]
    out = reflection_entropy_metrics(entropy, logp, mask, at, before, torch.tensor([1.0, -1.0]))
    assert out["reflection/entropy_at"] == pytest.approx(0.9)
    assert out["reflection/entropy_before"] == pytest.approx(0.1)
    assert out["reflection/entropy_all"] == pytest.approx((0.1 + 0.9 + 0.3 + 0.4 + 0.2 * 3) / 7)
    assert out["reflection/surprisal_at"] == pytest.approx(2.0)
    assert out["reflection/surprisal_before"] == pytest.approx(1.0)
    assert out["reflection/surprisal_all"] == pytest.approx((1 + 2 + 0.5 + 0.5 + 0.3) / 7)
    assert out["reflection/token_frac"] == pytest.approx(1 / 7)
    assert out["reflection/frac/adv_pos"] == 1.0 and out["reflection/frac/adv_neg"] == 0.0
    # the reflection token: surprisal 2 > entropy 0.9 under a positive advantage: exploration (Q2)
    assert [out[f"reflection/quadrant/q{k}"] for k in (1, 2, 3, 4)] == [0.0, 1.0, 0.0, 0.0]
    # token-level advantages [B, R]: the sign of each row's sum over its valid tokens
    token_adv = torch.tensor([[-1.0] * 5, [0.5] * 5])
    flipped = reflection_entropy_metrics(entropy, logp, mask, at, before, token_adv)
    assert flipped["reflection/frac/adv_pos"] == 0.0 and flipped["reflection/frac/adv_neg"] == 1.0
    assert [flipped[f"reflection/quadrant/q{k}"] for k in (1, 2, 3, 4)] == [0.0, 0.0, 1.0, 0.0]  # suppression
    none = reflection_entropy_metrics(entropy, logp, mask, torch.zeros_like(at), torch.zeros_like(at))
    assert math.isnan(none["reflection/entropy_at"]) and "reflection/frac/adv_pos" not in none


def test_entropy_first_is_the_decision_and_entropy_at_dilutes_it():
    """A three-token word (" re" "ch" "eck") whose first token, where the policy decides to turn,
    has entropy 2 nats and the rest 0: ``entropy_first`` reads the decision (2.0), ``entropy_at``
    its mean over the word (2/3), ``entropy_before`` the token before it (0.5)."""
    table = ["So", " re", "ch", "eck", " it", ""]
    ids = torch.tensor([[0, 1, 2, 3, 4, 5]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.float32)
    entropy = torch.tensor([[0.5, 2.0, 0.0, 0.0, 0.3, 9.0]], dtype=torch.float64)
    logp = torch.tensor([[-0.2, -3.0, -0.1, -0.1, -0.4, 0.0]], dtype=torch.float64)
    at, before, first = reflection_token_masks(ids, mask, TokenPieces(table.__getitem__), DEFAULT)
    assert at.nonzero().tolist() == [[0, 1], [0, 2], [0, 3]]
    assert first.nonzero().tolist() == [[0, 1]] and before.nonzero().tolist() == [[0, 0]]
    out = reflection_entropy_metrics(entropy, logp, mask, at, before, first=first)
    assert out["reflection/entropy_first"] == pytest.approx(2.0)
    assert out["reflection/entropy_at"] == pytest.approx(2.0 / 3)
    assert out["reflection/entropy_before"] == pytest.approx(0.5)
    assert out["reflection/surprisal_first"] == pytest.approx(3.0)
    assert out["reflection/surprisal_at"] == pytest.approx(3.2 / 3)


def test_reflection_settings_from_a_training_config():
    from entropyrl.conf import compose

    on = reflection_settings(compose("train", []))
    assert on.matcher.words == WORD_LISTS["default"] and on.repetition_n == 4 and on.token_metrics
    off = reflection_settings(compose("train", ["diagnostics.reflection.words=[]"]))
    assert not off.matcher.enabled and not off.token_metrics
    mine = reflection_settings(
        compose("train", ["diagnostics.reflection.words=[hmm,'try again']", "diagnostics.reflection.repetition_n=2"])
    )
    assert mine.matcher.words == ("hmm", "try again") and mine.repetition_n == 2
    with pytest.raises(UserError, match="diagnostics.reflection.words"):
        reflection_settings(compose("train", ["diagnostics.reflection.words=orzz"]))


# -- evaluation -----------------------------------------------------------------------------------
def test_reflection_at_n_and_precision_recall_by_hand():
    reflects = [[True, False], [False, False], [True, True]]
    correct = [[True, False], [True, True], [False, True]]
    out = reflection_eval_metrics(reflects, correct)
    assert out["reflection@2"] == pytest.approx(2 / 3)
    assert out["reflection/frac"] == pytest.approx(3 / 6)
    assert out["reflection/precision"] == pytest.approx(2 / 3)  # of 3 reflecting samples, 2 correct
    assert out["reflection/recall"] == pytest.approx(2 / 4)  # of 4 correct samples, 2 reflect
    empty = reflection_eval_metrics([[False]], [[False]])
    assert math.isnan(empty["reflection/precision"]) and math.isnan(empty["reflection/recall"])


def test_eval_samples_get_a_block_and_the_benchmark_its_figures():
    from entropyrl.evals.runner import _add_reflection, flat_metrics, reflection_lines

    recs = [
        {"problem_id": "a", "response": "wait, 5", "correct": True},
        {"problem_id": "a", "response": "5", "correct": False},
        {"problem_id": "b", "response": "Recheck: 4", "correct": False},
        {"problem_id": "b", "response": "3", "correct": False},
    ]
    result = {"metrics": {"avg@2": 0.25}, "n_samples": 2}
    _add_reflection(result, recs, DEFAULT, _char_tokenizer())
    assert [r["reflection"]["count"] for r in recs] == [1, 0, 1, 0]
    assert recs[0]["reflection"] == {"count": 1, "density": pytest.approx(1000 / 7), "tokens": 7, "unit": "tokens"}
    ref = result["reflection"]
    assert ref["reflection@2"] == 1.0 and ref["reflection/precision"] == 0.5 and ref["reflection/recall"] == 1.0
    assert ref["reflection/density"] == pytest.approx(1000 * 2 / (7 + 1 + 10 + 1))
    flat = flat_metrics({"b1": result})
    assert flat["eval/b1/reflection@2"] == 1.0 and flat["eval/b1/avg@2"] == 0.25
    assert reflection_lines({"b1": result})[0].startswith("b1: reflection@2 1.000")
    untouched = {"metrics": {}}
    _add_reflection(untouched, [{"response": "wait"}], ReflectionMatcher(()), None)
    assert "reflection" not in untouched


def test_grade_output_lines_carry_the_reflection_block(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(r)
            for r in [{"response": "Wait, let me recheck: \\boxed{4}", "answer": "4"}, {"response": "\\boxed{5}", "answer": "4"}]
        )
        + "\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "grade", str(path), "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "r.graded.jsonl").read_text().splitlines()]
    assert rows[0]["reflection"] == {"count": 2, "density": pytest.approx(2000 / 5), "tokens": 5, "unit": "words"}
    assert rows[1]["reflection"]["count"] == 0
    assert "reflection: 1/2 lines hold a reflection word (2 matches)" in out.stdout


def test_grade_reflection_words_option():
    from entropyrl.cli.grade_cmd import reflection_words

    assert reflection_words("none") == () and reflection_words("orz") == WORD_LISTS["orz"]
    assert reflection_words("hmm, try again") == ("hmm", "try again")


# -- samples table --------------------------------------------------------------------------------
def test_samples_table_rows_and_cadence(tmp_path):
    assert [s for s in range(1, 21) if run_samples.samples_due(s, 5)] == [1, 5, 10, 15, 20]
    assert not any(run_samples.samples_due(s, 0) for s in range(1, 5))
    assert run_samples.pick_rows(32, 4, 4) == [0, 8, 16, 24]  # the first response of spread-out groups
    assert run_samples.pick_rows(8, 4, 4) == [0, 1, 2, 4]
    rows = run_samples.sample_rows(3, ["p"], ["wait"], [1.0], [1.0], [0.5], [2], [1])
    assert rows == [
        {
            "step": 3,
            "prompt": "p",
            "response": "wait",
            "reward": 1.0,
            "correct": 1.0,
            "entropy_mean": 0.5,
            "length": 2,
            "reflection": 1,
        }
    ]
    run_samples.append_samples(tmp_path, rows)
    run_samples.append_samples(tmp_path, [{**rows[0], "step": 6}])
    run_samples.drop_after(tmp_path, 4)  # resumed from step 4: step 6 is redone
    assert [json.loads(x)["step"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == [3]


# -- a short training run -------------------------------------------------------------------------
STEP_METRICS = (
    "reflection/density",
    "reflection/frac",
    "reflection/frac/correct",
    "reflection/frac/incorrect",
    "reflection/entropy_first",
    "reflection/entropy_at",
    "reflection/entropy_before",
    "reflection/entropy_all",
    "reflection/surprisal_first",
    "reflection/surprisal_at",
    "reflection/surprisal_all",
    "reflection/frac/adv_pos",
    "repetition/score/mean",
    "response_length/correct/mean",
    "response_length/incorrect/mean",
    "response_length/clip_frac",
)


def cfg_overrides(words: str) -> list[str]:
    return [
        "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=4",
        "rollout.n=4",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "val.prompts=0",
        "trainer.progress=false",
        "output_dir=run",
        "trainer.samples_every=2",
        "trainer.samples_rows=3",
        f"diagnostics.reflection.words={words}",
    ]


@pytest.mark.slow
def test_a_short_training_run_logs_the_metrics_the_samples_and_the_figure(in_tmp):
    """The embedded task's responses are numbers: a word list of numbers makes them reflect."""
    from mlflow.tracking import MlflowClient

    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import train

    numbers = "[" + ",".join(str(i) for i in range(200)) + "]"
    cfg = compose("train", [*cfg_overrides(numbers), "trainer.total_steps=3"])
    summary = train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        for key in STEP_METRICS:
            assert key in row, key
        assert row["reflection/entropy_all"] == pytest.approx(row["entropy"], rel=1e-4)  # the same tokens
        assert row["reflection/frac"] > 0 and row["reflection/entropy_at"] is not None
    samples = [json.loads(line) for line in (in_tmp / "run" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2]
    assert {"prompt", "response", "reward", "correct", "entropy_mean", "length", "reflection"} <= set(samples[0])
    assert (in_tmp / "run" / "reflection.png").stat().st_size > 5000

    client = MlflowClient(summary["tracking_uri"])
    run = client.get_run(summary["mlflow_run_id"])
    assert {
        "reflection/density",
        "reflection/entropy_at",
        "reflection/entropy_all",
        "repetition/score/mean",
        "response_length/correct/mean",
    } <= set(run.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "reflection.png" in artifacts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "samples")] == ["samples/samples.jsonl"]

    # resumed from the step-3 checkpoint: a row of a step past it (written before a crash) is dropped
    with (in_tmp / "run" / "samples.jsonl").open("a") as f:
        f.write(json.dumps({**samples[0], "step": 5}) + "\n")
    train(compose("train", [*cfg_overrides(numbers), "trainer.total_steps=4"]), log=lambda *_: None)
    samples = [json.loads(line) for line in (in_tmp / "run" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2, 4, 4, 4]
