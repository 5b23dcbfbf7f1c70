"""Long chain-of-thought metrics of a tool run read the policy's own writing
(``trainers/collect.py``, ``trainers/stats/tool_stats.py``, ``docs/long-cot.md``): an interpreter's
output that says "Wait" or repeats itself is not the policy reflecting or repeating, and the
lengths by verdict count the tokens the policy sampled."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from entropyrl.conf import compose
from entropyrl.evals.generation import policy_texts
from entropyrl.evals.reflection import WORD_LISTS, matcher_for, repetition_score
from entropyrl.rollout.base import TOKEN_KINDS, Rollout, ToolTrace, concat
from entropyrl.trainers import components
from entropyrl.trainers.collect import collect_rollouts
from entropyrl.trainers.parallel import distributed
from entropyrl.trainers.stats.tool_stats import policy_lengths

TEXT, CODE, TOOL, POST = (TOKEN_KINDS.index(k) for k in ("text", "code", "tool", "post_tool"))

# one response: the policy's call, the interpreter's output (reflection words, the same line three
# times), and the policy's answer after it
CALL = "M=4821+9377=M"
OUTPUT = ":Wait, however, recheck this\nWait, however, recheck this\nWait, however, recheck this:"
ANSWER = "14198"


def _char_tokenizer() -> PreTrainedTokenizerFast:
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>"] + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


class ScriptedToolEngine:
    """Every response is CALL, OUTPUT (a tool's tokens), ANSWER: a tool run's rollout, scripted."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, *, n, seed, **_):
        tok = self.tokenizer
        ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        call, out, answer = ids(CALL), ids(OUTPUT), ids(ANSWER) + [tok.eos_token_id]
        row = call + out + answer
        kind = [TEXT] * 2 + [CODE] * (len(call) - 2) + [TOOL] * len(out) + [POST] * len(answer)
        rows = len(prompts) * n
        long = lambda r: torch.tensor(r, dtype=torch.long)  # noqa: E731
        prompt = [long(ids(p)) for p in prompts for _ in range(n)]
        width = max(len(p) for p in prompt)
        one = lambda v: torch.ones(rows, dtype=torch.long) * v  # noqa: E731
        trace = ToolTrace(
            long([kind] * rows),
            long([[0] * (len(call) + len(out)) + [1] * len(answer)] * rows),
            one(2),
            one(1),
            one(0),
            malformed=one(0),
            repeated=one(0),
            void=one(0),
        )
        return Rollout(
            concat(prompt, tok.pad_token_id, width, left=True),
            concat([torch.ones(len(p), dtype=torch.long) for p in prompt], 0, width, left=True),
            long([row] * rows),
            torch.ones(rows, len(row), dtype=torch.long),
            [tok.decode(row, skip_special_tokens=True)] * rows,
            torch.zeros(rows, dtype=torch.bool),
            None,
            trace,
        )


@pytest.fixture(scope="module")
def tool_batch():
    cfg = compose(
        "train",
        ["data=tool_arith", "tools=code_interpreter", "trainer.prompts_per_step=2", "rollout.n=2", "output_dir=never"],
    )
    tok = _char_tokenizer()
    dist = distributed.setup(cfg.trainer)
    source = components.build_source(cfg, tok)
    engine = ScriptedToolEngine(tok)
    batch, metrics = collect_rollouts(
        cfg, source=source, rollout=engine, algo=components.build_algorithm(cfg), dist=dist, pad_token_id=0, step=0
    )
    return tok, engine, batch, metrics


def test_policy_texts_leave_the_tools_output_out(tool_batch):
    tok, engine, batch, _ = tool_batch
    roll = batch.responses
    assert roll.texts[0] == CALL + OUTPUT + ANSWER  # the whole response: what the reward reads
    assert policy_texts(roll, tok) == [CALL + ANSWER] * len(roll.texts)
    assert policy_lengths(roll).tolist() == [len(CALL) + len(ANSWER) + 1] * len(roll.texts)  # + EOS


def test_text_metrics_of_a_tool_run_read_only_the_policys_writing(tool_batch):
    tok, engine, batch, metrics = tool_batch
    matcher = matcher_for(WORD_LISTS["default"])
    assert matcher.count(CALL + OUTPUT + ANSWER) == 9 and repetition_score(CALL + OUTPUT + ANSWER) > 0.3  # the tool's
    assert batch.facts.counts.tolist() == [0] * 4 and batch.facts.chars.tolist() == [len(CALL + ANSWER)] * 4
    assert metrics["reflection/count/mean"] == 0.0 and metrics["reflection/frac"] == 0.0
    assert metrics["reflection/density"] == 0.0
    assert metrics["repetition/score/mean"] == pytest.approx(repetition_score(CALL + ANSWER))
    own = len(CALL) + len(ANSWER) + 1
    lengths = [metrics[k] for k in ("response_length/correct/mean", "response_length/incorrect/mean") if k in metrics]
    assert lengths and all(v == own for v in lengths)
    assert metrics["response_length/mean"] == len(CALL) + len(OUTPUT) + len(ANSWER) + 1  # the budget's count: all tokens
    assert metrics["tools/calls/mean"] == 1.0


def test_eval_reflection_of_a_tool_run_reads_only_the_policys_writing(tmp_path):
    """``entropyrl eval`` and training-time validation: each sample's reflection block and the
    benchmark's reflection figures count the policy's words, not the interpreter's."""
    from entropyrl.evals.benchmarks import load_benchmark
    from entropyrl.evals.runner import EvalSettings, evaluate

    bench = tmp_path / "arith.jsonl"
    bench.write_text('{"problem": "4821+9377=", "answer": "14198"}\n')
    tok = _char_tokenizer()
    settings = EvalSettings(n_samples=2, temperature=1.0, top_p=1.0, max_new_tokens=200, workers=1)
    results, samples = evaluate(ScriptedToolEngine(tok), tok, {str(bench): load_benchmark(str(bench))}, settings)
    assert [s["response"] for s in samples] == [CALL + OUTPUT + ANSWER] * 2  # the record keeps the whole response
    assert [s["reflection"]["count"] for s in samples] == [0, 0]
    assert [s["reflection"]["tokens"] for s in samples] == [len(CALL + ANSWER)] * 2
    assert results["arith"]["reflection"]["reflection/frac"] == 0.0
    assert results["arith"]["metrics"]["tools/calls/mean"] == 1.0
