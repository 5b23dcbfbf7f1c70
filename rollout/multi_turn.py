"""Multi-turn rollouts with a tool (``tools=code_interpreter``): a driver over any engine that can
continue token sequences (``generate_ids``), so ``hf`` and ``vllm`` share it.

Per sample: generate until a tool call closes (the call format's ``closed``), EOS, or the
budget; run every sample's pending call at once (the executor: ``evals/code/tool_executor.py``);
append the tool's output; generate again with the samples still running, batched together.
Token in, token out: the response holds exactly the ids that were sampled and the ids of the
appended outputs (each output tokenized alone), never a re-tokenisation of decoded text.

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

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..conf import cfg_get
from ..core.errors import UserError
from .base import TOKEN_KINDS, Rollout, ToolTrace, concat, stop_token_ids
from .tool_formats import ToolFormat, build_tool_format, middle_cut

__all__ = ["SESSIONS", "ToolResult", "ToolRollout", "TokenEngine", "answer_pattern", "label_kinds"]

#: ``tools.session`` values: each call alone, or with the earlier calls of its response replayed first.
SESSIONS = ("stateless", "trajectory")

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
    can test each step (hf), ``stop_strings`` for one that matches strings (vllm). Each row comes
    back as ``(new ids, their sampler log-probs or None)``."""

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


def label_kinds(ids: list[int], text_kind: int, code_start: int | None, decode: Callable[[list[int]], str]) -> list[int]:
    """The kind of each token of one turn: ``text_kind`` before the call opens, ``CODE`` from the token
    whose decoded prefix first reaches past character ``code_start`` (binary search over prefixes:
    a few decodes per turn)."""
    if code_start is None:
        return [text_kind] * len(ids)
    lo, hi = 0, len(ids)  # first k with len(decode(ids[:k+1])) > code_start
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[: mid + 1])) > code_start:
            hi = mid
        else:
            lo = mid + 1
    return [text_kind] * lo + [CODE] * (len(ids) - lo)


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
    )

    def __init__(self, prompt: list[int]):
        self.prompt, self.ids, self.kind, self.turn, self.logp = prompt, [], [], [], []
        self.turns = self.calls = self.errors = self.malformed = 0
        self.done, self.truncated, self.pending = False, False, None
        self.history: list[str] = []  # the code of this sample's calls that ran without error, in order
        self.codes: set[str] = set()  # the stripped code of every call run so far (repeats are counted)
        self.repeated = self.void = 0


class ToolRollout:
    """A ``RolloutEngine`` that samples multi-turn responses with a tool (see the module docstring).

    ``engine``: an engine with ``generate_ids`` (``hf``, ``vllm``); ``executor(codes) -> [ToolResult]``;
    ``tools_cfg``: the ``tools`` section; ``rollout_cfg``: the engine's settings (temperature, ...)."""

    def __init__(
        self,
        engine,
        tools_cfg,
        executor: Callable[[list[str]], list[ToolResult]],
        rollout_cfg,
        final_answer: Callable[[str], object] | None = None,
    ):
        if not hasattr(engine, "generate_ids"):
            raise UserError(
                f"tools.enabled=true needs a rollout engine that continues token sequences "
                f"(generate_ids: hf, vllm); {type(engine).__name__} has none: use rollout=hf or tools=none"
            )
        self.engine, self.executor, self.cfg = engine, executor, rollout_cfg
        self.tokenizer = engine.tokenizer
        self.fmt: ToolFormat = build_tool_format(tools_cfg)
        self.max_turns = int(tools_cfg.get("max_turns", 4))
        self.max_calls = int(tools_cfg.get("max_calls", 3))
        self.max_output_chars = int(tools_cfg.get("max_output_chars", 1024))
        self.session = str(tools_cfg.get("session", "stateless"))
        if self.session not in SESSIONS:
            raise UserError(f"unknown tools.session={self.session}; valid: {', '.join(SESSIONS)}")
        self.stop_ids = set(stop_token_ids(getattr(engine, "model", None), self.tokenizer))
        self.answer_re = answer_pattern(tools_cfg)
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

    def _closed(self, ids: list[int]) -> bool:
        """Generation of a turn stops here: its text holds a complete call. The cheap look at the last
        tokens first (the closing tag must have just been written), the whole turn only then."""
        close = self.fmt.tags["call_close"]
        if close not in self._decode(ids[-(len(close) + 8) :]):
            return False
        return self.fmt.closed(self._decode(ids))

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
        cfg, tok = self.cfg, self.tokenizer
        temperature = float(cfg_get(cfg, "temperature", 1.0) if temperature is None else temperature)
        top_p = float(cfg_get(cfg, "top_p", 1.0) if top_p is None else top_p)
        budget = int(cfg_get(cfg, "max_new_tokens", 1024) if max_new_tokens is None else max_new_tokens)
        special = bool(cfg_get(cfg, "add_special_tokens", False))
        encoded = [list(tok(p, add_special_tokens=special)["input_ids"]) for p in prompts]
        samples = [_Sample(ids) for ids in encoded for _ in range(int(n))]
        tool_seconds = 0.0
        for turn in range(self.max_turns):
            active = [s for s in samples if not s.done]
            if not active:
                break
            room = [budget - len(s.ids) for s in active]
            outs = self.engine.generate_ids(
                [s.prompt + s.ids for s in active],
                seed=int(seed) * 1_000_003 + turn,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max(room),
                stop=self._closed,
                stop_strings=self.fmt.stop_strings,
            )
            for s, (new, logp), left in zip(active, outs, room):
                self._take_turn(
                    s,
                    list(new)[:left],
                    None if logp is None else list(logp)[:left],
                    turn,
                    left,
                    last_turn=turn == self.max_turns - 1,
                )
                if s.done and progress:
                    progress(1)
            calling = [s for s in active if s.pending is not None]
            if calling:
                tool_seconds += self._run_calls(calling, turn, budget)
        for s in samples:  # turns ran out with a call answered: the response ends unfinished
            if not s.done:
                s.done, s.truncated = True, True
        return self._rollout(samples, tool_seconds, time.perf_counter() - started)

    def _take_turn(self, s: _Sample, new: list[int], logp: list[float] | None, turn: int, left: int, last_turn: bool) -> None:
        """Append one turn's sampled ids (and their sampler log-probs, or None: the engine reports
        none); decide whether the sample ends or calls the tool."""
        eos = next((k for k, t in enumerate(new) if t in self.stop_ids), None)
        if eos is not None:
            new = new[: eos + 1]
        if s.logp is not None:
            s.logp = None if logp is None else s.logp + logp[: len(new)]
        text = self._decode(new)
        call = self.fmt.parse(text) if eos is None else None
        base = TEXT if s.calls == 0 else POST_TOOL
        s.ids += new
        s.kind += label_kinds(new, base, None if call is None else call.start, self._decode)
        s.turn += [turn] * len(new)
        s.turns += 1
        if call is None and not self.fmt.closed(text) and not self.has_answer(text):
            s.void += 1  # neither a closed call nor a final answer
        if eos is not None:
            s.done = True
        elif call is None or len(new) >= left:
            s.done, s.truncated = True, True  # the budget ran out inside the turn
        elif s.calls >= self.max_calls or last_turn:
            s.done, s.truncated = True, True  # a call with no call or turn left to answer it
        else:
            s.pending = call

    def _run_calls(self, calling: list[_Sample], turn: int, budget: int) -> float:
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
            text = self.fmt.wrap_output(middle_cut(result.output.rstrip("\n"), self.max_output_chars))
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[: budget - len(s.ids)]
            s.ids += ids
            s.kind += [TOOL] * len(ids)
            if s.logp is not None:
                s.logp += [0.0] * len(ids)  # placeholders: not sampled, read by nothing (policy_mask 0)
            s.turn += [turn] * len(ids)
            if len(s.ids) >= budget:
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


def answer_pattern(tools_cfg) -> re.Pattern | None:
    """``tools.answer_pattern`` compiled (None: the math grader's final answer); a pattern that does
    not compile is a one-line ``UserError``."""
    pattern = tools_cfg.get("answer_pattern", None)
    if pattern is None:
        return None
    try:
        return re.compile(str(pattern))
    except re.error as exc:
        raise UserError(f"tools.answer_pattern={pattern!r} is not a regular expression: {exc}") from None
