"""Evaluation's side of the rollout engines (``entropyrl.rollout``): texts per prompt, checked settings.

    sample_texts(engine, prompts, n=4, temperature=1.0, top_p=1.0, max_new_tokens=1024, seed=0)
    -> one list of ``n`` responses per prompt

Any ``rollout.RolloutEngine`` (``eval.backend=hf|vllm|<registered>``) samples; this module only
checks the ``eval.*`` values first (one-line errors) and groups the engine's decoded texts.
``policy_texts``: each response's own text in a tool run (the interpreter's outputs left out),
what the long-CoT text metrics read in training, validation and evaluation alike.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

from ..core.errors import UserError
from ..rollout.base import Rollout, RolloutEngine

__all__ = ["sample_texts", "policy_texts", "GenerationMeter"]


def policy_texts(roll: Rollout, tokenizer) -> list[str]:
    """Each response's own text: its ``policy_mask`` tokens (a tool's outputs left out) decoded in
    order, special tokens dropped. A rollout without tools gives ``roll.texts`` unchanged."""
    if roll.tools is None:
        return list(roll.texts)
    keep = roll.policy_mask.bool().cpu()
    ids = roll.response_ids.cpu()
    return [tokenizer.decode(ids[b][keep[b]].tolist(), skip_special_tokens=True) for b in range(ids.shape[0])]


def _check_args(n: int, temperature: float, top_p: float, max_new_tokens: int) -> None:
    if int(n) < 1:
        raise UserError(f"eval.n_samples must be >= 1, got {n}")
    if float(temperature) < 0:
        raise UserError(f"eval.temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < float(top_p) <= 1:
        raise UserError(f"eval.top_p must be in (0, 1], got {top_p}")
    if int(max_new_tokens) < 1:
        raise UserError(f"eval.max_new_tokens must be >= 1, got {max_new_tokens}")


def sample_texts(
    engine: RolloutEngine,
    prompts: Sequence[str],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
    traces: list | None = None,
    own_texts: list | None = None,
) -> list[list[str]]:
    """``n`` decoded responses for each prompt (``temperature`` 0 = greedy); same seed, same texts.
    ``traces``: a list that gets the rollout's ``ToolTrace`` (None without tools) appended;
    ``own_texts``: a list that gets each response's own text (``policy_texts``), in order, appended."""
    _check_args(n, temperature, top_p, max_new_tokens)
    roll = engine.generate(
        list(prompts),
        n=int(n),
        seed=int(seed),
        temperature=float(temperature),
        top_p=float(top_p),
        max_new_tokens=int(max_new_tokens),
        progress=progress,
    )
    if traces is not None:
        traces.append(roll.tools)
    if own_texts is not None:
        own_texts.extend(policy_texts(roll, engine.tokenizer) if roll.tools is not None else roll.texts)
    return roll.grouped_texts(int(n))


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


class GenerationMeter:
    """A generation's sign of life: responses done, tokens generated, tokens/s and an ETA.

    ``sequences(k)``: a batch of ``k`` responses ended (the engines' ``progress(k)``); ``tokens(k)``:
    one decoding step made ``k`` more tokens (an engine that reports its steps: the hf engine calls a
    progress callback's ``tokens`` attribute). The ETA is an upper bound: the batch in progress and
    every batch still to run taking all ``max_new_tokens`` steps, at the time per step seen so far
    (without steps reported: the time per response); responses that stop early end sooner, hence
    "ETA <=". ``due()`` tells a caller with no terminal when to print the next heartbeat line (every
    ``every_s`` seconds)."""

    def __init__(
        self, total: int, max_new_tokens: int, batch_size: int, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ):
        self.total, self.max_new_tokens = int(total), max(1, int(max_new_tokens))
        self.rows = max(1, int(batch_size))  # responses per batch: the largest batch seen, else batch_size
        self.every_s, self.clock = float(every_s), clock
        self.started = clock()
        self.last_beat = self.started
        self.done = self.generated = 0
        self.steps = 0  # decoding steps of the batch in progress
        self.all_steps = 0  # decoding steps so far, every batch
        self.seen_rows = 0  # the largest batch that ended

    def sequences(self, k: int) -> None:
        self.done = min(self.total, self.done + int(k))
        self.seen_rows = max(self.seen_rows, int(k))  # an engine may run fewer rows at once than batch_size
        self.rows = self.seen_rows or self.rows
        self.steps = 0  # a batch ended: the next one starts its steps afresh

    def tokens(self, k: int) -> None:
        self.generated += int(k)
        self.steps += 1
        self.all_steps += 1

    def rate(self) -> float:
        """Tokens per second so far (0 before the first step)."""
        elapsed = self.clock() - self.started
        return self.generated / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        """Seconds left at most; None before anything was measured."""
        elapsed = self.clock() - self.started
        left = self.total - self.done
        if left <= 0:
            return 0.0
        if self.all_steps:
            steps_left = math.ceil(left / self.rows) * self.max_new_tokens - self.steps
            return max(0.0, steps_left * elapsed / self.all_steps)
        if self.done:
            return left * elapsed / self.done
        return None

    def line(self) -> str:
        """``3/16 responses, 1204 tokens, 41.2 tokens/s, ETA <= 2m31s`` (what is known so far)."""
        parts = [f"{self.done}/{self.total} responses"]
        if self.generated:
            parts += [f"{self.generated} tokens", f"{self.rate():.1f} tokens/s"]
        eta = self.eta()
        parts.append(f"ETA <= {_clock(eta)}" if eta is not None else f"{_clock(self.clock() - self.started)} in, no estimate yet")
        return ", ".join(parts)

    def due(self) -> bool:
        """Whether a heartbeat line is due (and, if so, the next one counted from now)."""
        now = self.clock()
        if now - self.last_beat < self.every_s:
            return False
        self.last_beat = now
        return True
