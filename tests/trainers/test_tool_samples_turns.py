"""A tool run's samples rows carry ``turns``: the policy's text segments and its calls in order, each
call with its code, the output the policy saw and its status, each policy segment with its own mean
entropy (``trainers/run/samples.py``, ``response_turns``)."""

from __future__ import annotations

import json

import pytest

from entropyrl.conf import compose
from entropyrl.evals.code.tool_executor import LIMIT_NOTES
from entropyrl.rollout.base import TOKEN_KINDS
from entropyrl.rollout.tool_formats import build_tool_format
from entropyrl.trainers.run.samples import CALL_STATUSES, call_status, response_turns

TIR = build_tool_format({"format": "tir"})
HERMES = build_tool_format({"format": "hermes"})
KIND = {k: i for i, k in enumerate(TOKEN_KINDS)}
TOOL_WARM_START = ["model.warm_start.steps=120", "model.warm_start.batch_size=32", "model.warm_start.label_noise=0.2"]


def _decode(ids, keep_special):
    return "".join(chr(i) for i in ids)


def _response(pieces, fmt):
    """``[(kind, turn, text)]`` -> a character-level response: ids, kinds, turns, an entropy per token
    that differs by kind and position, and the policy mask."""
    ids, kind, turn, entropy = [], [], [], []
    for name, t, text in pieces:
        for j, ch in enumerate(text):
            ids.append(ord(ch))
            kind.append(KIND[name])
            turn.append(t)
            entropy.append({"text": 1.0, "code": 0.2, "tool": 9.0, "post_tool": 0.5}[name] + 0.01 * j)
    policy = [k != KIND["tool"] for k in kind]
    return ids, kind, turn, entropy, policy


def _turns(pieces, fmt=TIR, **counts):
    ids, kind, turn, entropy, policy = _response(pieces, fmt)
    wrapper = (fmt.tags["output_open"], fmt.tags["output_close"])
    return response_turns(ids, kind, turn, entropy, policy, decode=_decode, fmt=fmt, output_wrapper=wrapper, **counts), entropy


def _out(text, fmt=TIR):
    return fmt.wrap_output(text)


def test_segments_and_calls_in_order_with_their_own_entropy():
    pieces = [
        ("text", 0, "Let me divide. "),
        ("code", 0, "```python\n1/0\n```"),
        ("tool", 0, _out("Traceback (most recent call last):\nZeroDivisionError: division by zero")),
        ("post_tool", 1, "Again: "),
        ("code", 1, "```python\n2+2\n```"),
        ("tool", 1, _out("4")),
        ("post_tool", 2, "Answer 4"),
    ]
    got, entropy = _turns(pieces, errors=1, malformed=0)
    turns = got["turns"]
    assert [t["type"] for t in turns] == ["text", "call", "text", "call", "text"]
    assert [t.get("kind") for t in turns if t["type"] == "text"] == ["text", "post_tool", "post_tool"]
    first, second = turns[1], turns[3]
    assert first["code"] == "1/0\n" and first["status"] == "error" and first["output"].endswith("division by zero")
    assert second["code"] == "2+2\n" and second["status"] == "ok" and second["output"] == "4"
    assert not first["output_cut"] and turns[4]["text"] == "Answer 4" and turns[4]["turn"] == 2
    # each segment's mean is over its own tokens; the tool's tokens (entropy 9) are in none of them
    offset, items = 0, iter(turns)
    for name, _, text in pieces:
        if name != "tool":
            item = next(items)
            assert item["tokens"] == len(text)
            assert item["entropy_mean"] == pytest.approx(sum(entropy[offset : offset + len(text)]) / len(text))
        offset += len(text)
    kinds = [name for name, _, text in pieces for _ in text]
    by_kind = got["entropy_by_kind"]
    assert set(by_kind) == {"text", "code", "post_tool"}
    for name, value in by_kind.items():
        own = [e for e, k in zip(entropy, kinds) if k == name]
        assert value == pytest.approx(sum(own) / len(own))


def test_the_error_count_settles_what_the_text_cannot():
    """An ok call that prints an exception's name is ok when the response has no error; a call whose
    output shows nothing of its failure (a tokenizer that cannot spell the traceback) is an error
    when the response's only call errored."""
    looks_failed = [("code", 0, "```python\nprint('ValueError: on purpose')\n```"), ("tool", 0, _out("ValueError: on purpose"))]
    assert call_status("ValueError: on purpose") == "error"
    assert _turns(looks_failed, errors=0, malformed=0)[0]["turns"][0]["status"] == "ok"
    looks_fine = [("code", 0, "```python\nx\n```"), ("tool", 0, _out("::"))]
    assert _turns(looks_fine, errors=1, malformed=0)[0]["turns"][0]["status"] == "error"


def test_timeouts_invalid_calls_unanswered_calls_and_cut_outputs():
    timeout = LIMIT_NOTES["timeout"].format(wall=5)
    pieces = [
        ("code", 0, '<tool_call>{"name": "code_interpreter", "arguments": {"code": 1</tool_call>'),
        ("tool", 0, _out("invalid tool call JSON: Expecting ','", HERMES)),
        ("code", 1, '<tool_call>{"name": "code_interpreter", "arguments": {"code": "while True: pass"}}</tool_call>'),
        ("tool", 1, _out(timeout, HERMES)),
        ("code", 2, '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(7)"}}</tool_call>'),
    ]
    turns = _turns(pieces, HERMES, errors=2, malformed=1)[0]["turns"]
    assert [t["status"] for t in turns] == ["invalid", "timeout", "not_run"]
    assert turns[0]["error"].startswith("invalid tool call JSON") and turns[0]["output"].startswith("invalid tool call JSON")
    assert turns[1]["code"] == "while True: pass" and turns[1]["output"] == timeout
    assert turns[2]["code"] == "print(7)" and turns[2]["output"] is None
    assert all(t["status"] in CALL_STATUSES for t in turns)
    cut = [("code", 0, "```python\nprint('x' * 99)\n```"), ("tool", 0, TIR.tags["output_open"] + "xxxx")]
    call = _turns(cut, errors=0, malformed=0)[0]["turns"][0]
    assert call["output_cut"] and call["output"] == "xxxx" and call["status"] == "ok"


@pytest.mark.slow
def test_a_short_tool_run_writes_turns_a_plain_run_does_not(fast_train, in_tmp):
    from entropyrl.trainers.trainer import train

    base = [
        "trainer.total_steps=1",
        "trainer.prompts_per_step=4",
        "rollout.n=2",
        "trainer.mini_batch_prompts=4",
        "trainer.progress=false",
        "trainer.threads=1",
        "trainer.val_every=0",
        "val.prompts=0",
        "trainer.save_every=0",
        "tracking.enabled=false",
    ]
    # the short tool-using warm start of tests/rollout/test_tools.py (one cache entry for the session)
    tool = ["data=tool_arith", "tools=code_interpreter", *TOOL_WARM_START, "output_dir=tool"]
    train(compose("train", [*base, *tool]), log=lambda *_: None)
    rows = [json.loads(line) for line in (in_tmp / "tool" / "samples.jsonl").read_text().splitlines()]
    assert rows and all("turns" in r and set(r["entropy_by_kind"]) == {"text", "code", "post_tool"} for r in rows)
    calls = [t for r in rows for t in r["turns"] if t["type"] == "call"]
    assert calls, "the warm-started policy calls the tool on data=tool_arith"
    for r in rows:
        for t in r["turns"]:
            assert t["status"] in CALL_STATUSES if t["type"] == "call" else t["type"] in ("text", "tool_output")
            if t["type"] == "call":
                assert t["code"] in r["response"] and (t["output"] is None or t["output"] in r["response"])
    for call in calls:  # the sum the sandbox printed, as the policy saw it (never run here: summed)
        terms = call["code"].split("+")
        if call["status"] == "ok" and len(terms) == 2 and all(x.strip().isdigit() for x in terms):
            assert call["output"] == str(sum(int(x) for x in terms))
    train(compose("train", [*base, "data=toy", "output_dir=plain"]), log=lambda *_: None)
    plain = [json.loads(line) for line in (in_tmp / "plain" / "samples.jsonl").read_text().splitlines()]
    assert plain and not any("turns" in r or "entropy_by_kind" in r for r in plain)
