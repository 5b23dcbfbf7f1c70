"""Multi-turn rollouts with a tool (``tools=code_interpreter``): a driver over any engine that can
continue token sequences (``generate_ids``), so ``hf`` and ``vllm`` share it.

Per sample: generate until a tool call closes (the call format's ``closed``), EOS, or the
budget; run every sample's pending call at once (the executor: ``evals/code/tool_executor.py``);
append the tool's output; generate again with the samples still running, batched together.
Token in, token out: the response holds exactly the ids that were sampled and the ids of the
appended outputs (each output tokenized alone), never a re-tokenisation of decoded text.

Every engine ends a turn at the same token: the first one after which the turn's text holds a
complete call. ``hf`` tests each step; ``vllm`` stops on the closing tag as a plain string, which
also matches where it closes nothing (the fence ```` ``` ```` that opens ```` ```python ````, a
closing tag written with no opening one): the driver then continues the same turn from the ids
sampled so far (another engine call), and cuts a turn that ran past its call's closing tag back
to the token that wrote it. So one policy gives the same calls, outputs and masks on both.

How a call turn ends and the output comes back (``tools.tool_turn``):

- ``inline`` (default): the turn stops at the call's closing tag; the output, in the format's
  output tags, is appended in the same assistant message and the policy continues it.
- ``chat``: as verl's ``ToolAgentLoop``: the call turn ends at EOS (the assistant message ends);
  the first call of that turn is run, and its output comes back as a chat-templated ``tool``
  turn (the tokenizer's template renders the message with role ``tool`` and opens the next
  assistant turn; every token of it is a ``tool`` token, mask 0); the system prompt carries the
  tool's JSON function schema (the template renders ``tools``; a template that does not gets a
  system message declaring it in the words of Qwen2.5's template). Needs ``tools.format=hermes``
  and prompts built with the tokenizer's chat template (one user message, no system message of
  their own). Differences from verl: one call per turn (verl runs up to ``max_parallel_calls``),
  and the newline the template writes after the assistant's EOS is kept (verl drops it).

An engine that reports its context length (``context_length()``: vLLM's ``max_model_len``) caps
each response at it as it caps the budget: a sample whose prompt plus response reach the context
ends there, truncated.

Limits: ``rollout.max_new_tokens`` is the budget of the whole response (sampled and appended
tokens together), ``tools.max_turns`` generation turns, ``tools.max_calls`` calls run, a tool
output cut to ``tools.max_output_chars`` in the middle. A sample that closes a call when no
call or turn is left ends there, truncated. A malformed call gets its error as the tool output
and counts as a call and an error.

What the recipe switches read (``trainers/stats/tool_stats.py``): a call whose code, stripped of
the whitespace around it, is that of an earlier call of the same response counts as *repeated*;
a generation turn that ends with neither a closed call nor a final answer is *void* (SimpleTIR's
definition: no code block and no answer). A final answer is what ``tools.answer_pattern`` finds in
the turn's text: null, what the caller's ``final_answer`` finds (the training loop and ``entropyrl
eval`` pass the math grader's extraction: a box or an ``Answer:`` line); else that regular expression.

Sessions (``tools.session``): ``stateless`` runs every call alone; ``trajectory`` hands the
executor, with each call, the code of the same sample's earlier calls that ran without error (its
``histories``), which it replays first so their variables are defined. Samples never share a
history, so two responses never see each other's variables.

The result is an ordinary ``Rollout`` (with the sampler's log-probs when the engine reports them,
0 placeholders on tool outputs) plus a ``ToolTrace``: token kinds (``text``, ``code`` inside
a call, ``tool`` output, ``post_tool`` text after a tool result), turns, calls, errors, tool time.
Its ``policy_mask`` is 0 on tool outputs, so no loss or statistic reads them.
"""

# size: one driver of tool turns for every engine: the turn-end rule and the token bookkeeping it depends on stay side by side
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..core.errors import UserError
from .base import TOKEN_KINDS, Rollout, ToolTrace, check_prompt_lengths, concat, stop_token_ids
from .settings import SamplingSettings, ToolSettings
from .tool_formats import ToolFormat, build_tool_format, hermes_tools_prompt, middle_cut, tool_schema

__all__ = [
    "SESSIONS",
    "TOOL_TURNS",
    "ChatToolTurns",
    "ToolResult",
    "ToolRollout",
    "TokenEngine",
    "answer_pattern",
    "calls_limit_note",
    "check_tool_turn",
    "label_kinds",
]

#: ``tools.session`` values: each call alone, or with the earlier calls of its response replayed first.
SESSIONS = ("stateless", "trajectory")
#: ``tools.tool_turn`` values: the output inline in the assistant's message, or as a chat ``tool`` turn.
TOOL_TURNS = ("inline", "chat")

TEXT, CODE, TOOL, POST_TOOL = (TOKEN_KINDS.index(k) for k in ("text", "code", "tool", "post_tool"))


@dataclass(frozen=True)
class ToolResult:
    """What one call gave back: ``output`` (text shown to the policy), ``error`` (raised, malformed,
    or stopped at a limit), ``reason`` (``ok``, ``raised``, ``malformed``, ``timeout``, ...), ``seconds``."""

    output: str
    error: bool
    reason: str = "ok"
    seconds: float = 0.0


class TokenEngine(Protocol):
    """What the driver needs of an engine: continue each token sequence by one turn, up to EOS (kept),
    ``max_new_tokens``, or where the turn holds a complete call: ``stop(new ids)`` for an engine that
    can test each step (hf), ``stop_strings`` for one that matches strings (vllm; it may stop where a
    string closes no call, and the driver continues the turn). Each row comes back as ``(new ids,
    their sampler log-probs or None)``. Optional: ``context_length()``, the tokens prompt and
    response may hold together."""

    model: object
    tokenizer: object

    def generate_ids(
        self,
        sequences: list[list[int]],
        *,
        seed: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        stop: Callable[[list[int]], bool] | None,
        stop_strings: list[str] | None,
    ) -> list[tuple[list[int], list[float] | None]]: ...

    def sync_weights(self) -> None: ...

    def close(self) -> None: ...


def _first_prefix(n: int, holds: Callable[[int], bool]) -> int:
    """The least ``k`` in ``0..n`` with ``holds(k)`` (``holds`` monotone; ``n`` when none): a binary search."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def label_kinds(
    ids: list[int],
    text_kind: int,
    code_start: int | None,
    decode: Callable[[list[int]], str],
    code_end: int | None = None,
) -> list[int]:
    """The kind of each token of one turn: ``text_kind`` before the call opens, ``CODE`` from the token
    whose decoded prefix first reaches past character ``code_start`` through the token that reaches
    ``code_end`` (the closing tag's end; None: to the turn's end), ``text_kind`` after it (a chat
    turn's text after its call, and its EOS). Binary search over prefixes: a few decodes per turn."""
    if code_start is None:
        return [text_kind] * len(ids)
    lo = _first_prefix(len(ids), lambda k: len(decode(ids[: k + 1])) > code_start)
    hi = len(ids) if code_end is None else _first_prefix(len(ids), lambda k: len(decode(ids[: k + 1])) >= code_end) + 1
    hi = max(lo, min(hi, len(ids)))
    return [text_kind] * lo + [CODE] * (hi - lo) + [text_kind] * (len(ids) - hi)


class ChatToolTurns:
    """``tools.tool_turn=chat``: the tool's schema in the system prompt and its output as a chat
    ``tool`` turn, both rendered by ``tokenizer``'s chat template (see the module docstring).

    ``prompt(text)``: a prompt built with the template (one user message) with the schema put in
    its system prompt; ``wrap(output)``: the text appended after the assistant's EOS: the rest of
    the assistant turn's end as the template writes it, the ``tool`` turn, the next assistant
    turn's opening. Refusals are one-line ``UserError``s."""

    MARK = "@@ENTROPYRL-CONTENT@@"

    def __init__(self, tokenizer, name: str = "code_interpreter"):
        if not getattr(tokenizer, "chat_template", None):
            raise UserError(
                "tools.tool_turn=chat renders the tool's answer with the tokenizer's chat template, and this "
                "tokenizer has none: use tools.tool_turn=inline (or a model with a chat template)"
            )
        mark = self.MARK
        schema = tool_schema(name)
        try:
            user = [{"role": "user", "content": mark}]
            plain = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
            with_tools = tokenizer.apply_chat_template(user, tools=[schema], tokenize=False, add_generation_prompt=True)
            if name not in with_tools:  # the template does not render tools: declare it in a system message
                system = [{"role": "system", "content": hermes_tools_prompt(schema)}]
                with_tools = tokenizer.apply_chat_template(system + user, tokenize=False, add_generation_prompt=True)
            answer = "@@ENTROPYRL-ANSWER@@"
            turns = [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": answer},
                {"role": "tool", "content": mark},
            ]
            rendered = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a template that cannot render these turns is a config problem
            raise UserError(
                f"tools.tool_turn=chat: the tokenizer's chat template cannot render a tool turn ({type(exc).__name__}: "
                f"{str(exc)[:160]}): use tools.tool_turn=inline"
            ) from None
        after = rendered[rendered.find(answer) + len(answer) :] if answer in rendered else ""
        eos = getattr(tokenizer, "eos_token", None) or ""
        if eos and after.startswith(eos):  # the policy samples the EOS itself
            after = after[len(eos) :]
        if mark not in plain or mark not in with_tools or mark not in after:
            raise UserError(
                "tools.tool_turn=chat: the tokenizer's chat template drops message contents: use tools.tool_turn=inline"
            )
        self.plain_prefix = plain[: plain.index(mark)]
        self.tools_prefix = with_tools[: with_tools.index(mark)]
        self.open, self.close = after.split(mark, 1)

    def prompt(self, text: str, index: int = 0) -> str:
        if not text.startswith(self.plain_prefix):
            raise UserError(
                f"tools.tool_turn=chat puts the tool's schema in the system prompt, but prompt {index} does not "
                f"begin as the chat template begins a conversation of one user message ({self.plain_prefix[:60]!r}): "
                f"build prompts with the chat template and no system message (data.chat_template=auto), "
                f"or use tools.tool_turn=inline"
            )
        return self.tools_prefix + text[len(self.plain_prefix) :]

    def wrap(self, output: str) -> str:
        return self.open + output + self.close


class _Sample:
    __slots__ = (
        "prompt",
        "ids",
        "kind",
        "turn",
        "logp",
        "turns",
        "calls",
        "errors",
        "malformed",
        "done",
        "truncated",
        "pending",
        "history",
        "codes",
        "repeated",
        "void",
        "not_run",
        "cap",
    )

    def __init__(self, prompt: list[int]):
        self.prompt, self.ids, self.kind, self.turn, self.logp = prompt, [], [], [], []
        self.turns = self.calls = self.errors = self.malformed = 0
        self.done, self.truncated, self.pending = False, False, None
        self.history: list[str] = []  # the code of this sample's calls that ran without error, in order
        self.codes: set[str] = set()  # the stripped code of every call run so far (repeats are counted)
        self.repeated = self.void = self.not_run = 0
        self.cap = 0  # the response's length limit: the budget, or less where the context ends first


class ToolRollout:
    """A ``RolloutEngine`` that samples multi-turn responses with a tool (see the module docstring).

    ``engine``: an engine with ``generate_ids`` (``hf``, ``vllm``); ``executor(codes) -> [ToolResult]``;
    ``tools``: a ``ToolSettings`` (or the ``tools`` section it is read from); ``sampling``: the
    engine's ``SamplingSettings`` (temperature, budget, ...; or the section they are read from)."""

    def __init__(
        self,
        engine,
        tools: ToolSettings,
        executor: Callable[[list[str]], list[ToolResult]],
        sampling: SamplingSettings,
        final_answer: Callable[[str], object] | None = None,
    ):
        if not hasattr(engine, "generate_ids"):
            raise UserError(
                f"tools.enabled=true needs a rollout engine that continues token sequences "
                f"(generate_ids: hf, vllm); {type(engine).__name__} has none: use rollout=hf or tools=none"
            )
        tools = ToolSettings.from_config(tools)
        self.engine, self.executor, self.tools = engine, executor, tools
        self.sampling = SamplingSettings.from_config(sampling)
        self.tokenizer = engine.tokenizer
        self.fmt: ToolFormat = build_tool_format(tools)
        self.max_turns, self.max_calls, self.max_output_chars = tools.max_turns, tools.max_calls, tools.max_output_chars
        self.session = tools.session
        if self.session not in SESSIONS:
            raise UserError(f"unknown tools.session={self.session}; valid: {', '.join(SESSIONS)}")
        self.tool_turn = check_tool_turn(tools)
        self.chat = ChatToolTurns(self.tokenizer, tools.name) if self.tool_turn == "chat" else None
        self.stop_ids = set(stop_token_ids(getattr(engine, "model", None), self.tokenizer))
        self.answer_re = answer_pattern(tools)
        self.final_answer = final_answer  # text -> the answer or None, read when answer_pattern is null

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def has_answer(self, text: str) -> bool:
        """Whether a turn's ``text`` holds a final answer (``tools.answer_pattern``)."""
        if self.answer_re is None:
            return self.final_answer is not None and self.final_answer(text) is not None
        return self.answer_re.search(text) is not None

    def close(self) -> None:
        self.engine.close()

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _close_written(self, ids: list[int]) -> bool:
        """The closing tag was just written (what an engine that stops on strings tests)."""
        close = self.fmt.tags["call_close"]
        return close in self._decode(ids[-(len(close) + 8) :])

    def _closed(self, ids: list[int]) -> bool:
        """Generation of a turn stops here: its text holds a complete call. The cheap look at the last
        tokens first (the closing tag must have just been written), the whole turn only then."""
        return self._close_written(ids) and self.fmt.closed(self._decode(ids))

    def _context(self) -> int | None:
        """The engine's context length in tokens, when it reports one (vLLM's ``max_model_len``)."""
        length = getattr(self.engine, "context_length", None)
        return int(length()) if callable(length) else None

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        *,
        n: int,
        seed: int,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Rollout:
        started = time.perf_counter()
        sampling, tok = self.sampling, self.tokenizer
        temperature = float(sampling.temperature if temperature is None else temperature)
        top_p = float(sampling.top_p if top_p is None else top_p)
        budget = int(sampling.max_new_tokens if max_new_tokens is None else max_new_tokens)
        special = sampling.add_special_tokens
        if self.chat is not None:
            prompts = [self.chat.prompt(p, i) for i, p in enumerate(prompts)]
        encoded = [list(tok(p, add_special_tokens=special)["input_ids"]) for p in prompts]
        context = self._context()
        if context is not None:
            check_prompt_lengths([len(ids) for ids in encoded], context, sampling.option)
        samples = [_Sample(ids) for ids in encoded for _ in range(int(n))]
        for s in samples:
            s.cap = budget if context is None else min(budget, context - len(s.prompt))
        tool_seconds = 0.0
        for turn in range(self.max_turns):
            active = [s for s in samples if not s.done]
            if not active:
                break
            rows = self._generate_turn(active, turn, seed, temperature, top_p)
            for s, (new, logp) in zip(active, rows):
                self._take_turn(s, new, logp, turn, s.cap - len(s.ids), last_turn=turn == self.max_turns - 1)
                if s.done and progress:
                    progress(1)
            calling = [s for s in active if s.pending is not None]
            if calling:
                tool_seconds += self._run_calls(calling, turn)
        for s in samples:  # turns ran out with a call answered: the response ends unfinished
            if not s.done:
                s.done, s.truncated = True, True
        return self._rollout(samples, tool_seconds, time.perf_counter() - started)

    def _generate_turn(
        self, active: list[_Sample], turn: int, seed: int, temperature: float, top_p: float
    ) -> list[tuple[list[int], list[float] | None]]:
        """One turn of every active sample: ``(ids, sampler log-probs or None)``, each within its
        room. Inline turns end where the turn's text first holds a complete call, whatever the
        engine: a row that stopped at a closing tag that closes no call is continued (another
        engine call, its rows batched), a row that ran past its call is cut back to the token that
        closed it. Chat turns end at EOS or the room."""
        got: dict[int, list[int]] = {id(s): [] for s in active}
        logps: dict[int, list[float] | None] = {id(s): [] for s in active}
        todo, rnd = list(active), 0
        while todo:
            rooms = [s.cap - len(s.ids) - len(got[id(s)]) for s in todo]
            outs = self.engine.generate_ids(
                [s.prompt + s.ids + got[id(s)] for s in todo],
                seed=int(seed) * 1_000_003 + turn + 7_919 * rnd,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max(1, max(rooms)),
                stop=None if self.chat is not None else self._closed if rnd == 0 else self._close_written,
                stop_strings=None if self.chat is not None else self.fmt.stop_strings,
            )
            going = []
            for s, (new, logp), room in zip(todo, outs, rooms):
                new = list(new)[: max(room, 0)]
                got[id(s)] += new
                if logps[id(s)] is not None:
                    logps[id(s)] = None if logp is None else logps[id(s)] + list(logp)[: len(new)]
                ended = not new or len(new) >= room or any(t in self.stop_ids for t in new)
                if not (ended or self.chat is not None or self.fmt.closed(self._decode(got[id(s)]))):
                    going.append(s)  # stopped at a closing tag that closes no call: the turn goes on
            todo, rnd = going, rnd + 1
        rows = []
        for s in active:
            ids, logp = got[id(s)], logps[id(s)]
            if self.chat is None:
                ids = self._cut_at_call(ids)
                logp = None if logp is None else logp[: len(ids)]
            rows.append((ids, logp))
        return rows

    def _cut_at_call(self, ids: list[int]) -> list[int]:
        """``ids`` up to the token that completes the first call (an EOS after it dropped), or as
        they are when no call closes before an EOS: where a per-step test stops."""
        eos = next((k for k, t in enumerate(ids) if t in self.stop_ids), len(ids))
        if not self.fmt.closed(self._decode(ids[:eos])):
            return ids
        return ids[: _first_prefix(eos, lambda k: self.fmt.closed(self._decode(ids[:k])))]

    def _take_turn(self, s: _Sample, new: list[int], logp: list[float] | None, turn: int, left: int, last_turn: bool) -> None:
        """Append one turn's sampled ids (and their sampler log-probs, or None: the engine reports
        none); decide whether the sample ends or calls the tool."""
        eos = next((k for k, t in enumerate(new) if t in self.stop_ids), None)
        if eos is not None:
            new = new[: eos + 1]
        if s.logp is not None:
            s.logp = None if logp is None else s.logp + logp[: len(new)]
        text = self._decode(new)
        call = self.fmt.parse(text) if (eos is None or self.chat is not None) else None
        base = TEXT if s.calls == 0 else POST_TOOL
        s.ids += new
        s.kind += label_kinds(new, base, None if call is None else call.start, self._decode, None if call is None else call.end)
        s.turn += [turn] * len(new)
        s.turns += 1
        if call is None and not self.fmt.closed(text) and not self.has_answer(text):
            s.void += 1  # neither a closed call nor a final answer
        if call is not None:  # a chat message may close more calls after the first: counted, not run
            s.not_run += self.fmt.count_calls(text[call.end :])
        if call is None:
            s.done, s.truncated = True, eos is None  # EOS: the response ended; else its room ran out inside the turn
        elif len(new) >= left or s.calls >= self.max_calls or last_turn:
            s.done, s.truncated = True, True  # a call with no room, call or turn left to answer it
        else:
            s.pending = call

    def _run_calls(self, calling: list[_Sample], turn: int) -> float:
        """Run the pending calls at once; append each output's ids. Returns the tool wall seconds."""
        t0 = time.perf_counter()
        runnable = [s for s in calling if s.pending.error is None]
        codes = [s.pending.code for s in runnable]
        if self.session == "trajectory":  # each call with its own sample's earlier calls, replayed first
            out = self.executor(codes, histories=[list(s.history) for s in runnable]) if codes else []
        else:
            out = self.executor(codes)
        results = dict(zip(map(id, runnable), out))
        seconds = time.perf_counter() - t0
        for s in calling:
            call, s.pending = s.pending, None
            result = results.get(id(s)) or ToolResult(call.error or "", error=True, reason="malformed")
            s.calls += 1
            s.errors += int(result.error)
            s.malformed += int(call.error is not None)
            if call.error is None:
                key = call.code.strip()
                s.repeated += int(key in s.codes)
                s.codes.add(key)
            if not result.error:
                s.history.append(call.code)
            output = middle_cut(result.output.rstrip("\n"), self.max_output_chars)
            text = self.fmt.wrap_output(output) if self.chat is None else self.chat.wrap(output)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[: s.cap - len(s.ids)]
            s.ids += ids
            s.kind += [TOOL] * len(ids)
            if s.logp is not None:
                s.logp += [0.0] * len(ids)  # placeholders: not sampled, read by nothing (policy_mask 0)
            s.turn += [turn] * len(ids)
            if len(s.ids) >= s.cap:
                s.done, s.truncated = True, True
        return seconds

    def _rollout(self, samples: list[_Sample], tool_seconds: float, gen_seconds: float) -> Rollout:
        tok = self.tokenizer
        pad = tok.pad_token_id
        long = lambda rows: [torch.tensor(r, dtype=torch.long) for r in rows]  # noqa: E731
        p_width = max(len(s.prompt) for s in samples)
        r_width = max(max(len(s.ids) for s in samples), 1)
        prompt_ids = concat(long(s.prompt for s in samples), pad, p_width, left=True)
        prompt_mask = concat(long([1] * len(s.prompt) for s in samples), 0, p_width, left=True)
        response_ids = concat(long(s.ids for s in samples), pad, r_width, left=False)
        response_mask = concat(long([1] * len(s.ids) for s in samples), 0, r_width, left=False)
        trace = ToolTrace(
            concat(long(s.kind for s in samples), 0, r_width, left=False),
            concat(long(s.turn for s in samples), 0, r_width, left=False),
            *(torch.tensor([getattr(s, a) for s in samples], dtype=torch.long) for a in ("turns", "calls", "errors")),
            seconds=tool_seconds,
            gen_seconds=gen_seconds,
            **{a: torch.tensor([getattr(s, a) for s in samples], dtype=torch.long) for a in ToolTrace.ROW_COUNTS},
        )
        texts = tok.batch_decode(response_ids, skip_special_tokens=True)
        truncated = torch.tensor([s.truncated for s in samples], dtype=torch.bool)
        sampling_logp = None
        if all(s.logp is not None for s in samples):  # the engine reported them (vLLM)
            sampling_logp = concat([torch.tensor(s.logp, dtype=torch.float32) for s in samples], 0.0, r_width, left=False)
        return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, texts, truncated, sampling_logp, trace)


def check_tool_turn(tools: ToolSettings) -> str:
    """``tools.tool_turn``, checked: one of ``TOOL_TURNS``; ``chat`` takes the hermes format.
    ``tools``: a ``ToolSettings``, or the ``tools`` section it is read from."""
    tools = ToolSettings.from_config(tools)
    mode = tools.tool_turn
    if mode not in TOOL_TURNS:
        raise UserError(f"unknown tools.tool_turn={mode}; valid: {', '.join(TOOL_TURNS)}")
    if mode == "chat" and tools.format != "hermes":
        raise UserError(
            f"tools.tool_turn=chat takes tools.format=hermes (the calls verl's ToolAgentLoop parses), "
            f"not {tools.format}: set tools.format=hermes or tools.tool_turn=inline"
        )
    return mode


def calls_limit_note(tools: ToolSettings) -> str | None:
    """The line that says ``tools.max_calls`` cannot be reached (None when it can): a response's
    last turn answers and never calls (as verl's ``max_assistant_turns`` ends the loop before its
    tools run), so at most ``max_turns - 1`` calls run. ``tools``: a ``ToolSettings`` or its section."""
    tools = ToolSettings.from_config(tools)
    reachable = max(int(tools.max_turns) - 1, 0)
    if not tools.enabled or int(tools.max_calls) <= reachable:
        return None
    return (
        f"tools: at most {reachable} call(s) run per response, not tools.max_calls={tools.max_calls}: the last of "
        f"tools.max_turns={tools.max_turns} turns cannot call (a call there ends the response truncated); "
        f"tools.max_turns={int(tools.max_calls) + 1} lets {tools.max_calls} run"
    )


def answer_pattern(tools: ToolSettings) -> re.Pattern | None:
    """``tools.answer_pattern`` compiled (None: the math grader's final answer); a pattern that does
    not compile is a one-line ``UserError``. ``tools``: a ``ToolSettings``, or the section."""
    pattern = ToolSettings.from_config(tools).answer_pattern
    if pattern is None:
        return None
    try:
        return re.compile(str(pattern))
    except re.error as exc:
        raise UserError(f"tools.answer_pattern={pattern!r} is not a regular expression: {exc}") from None
