"""The samples table of a training run: every ``trainer.samples_every`` steps (and at step 1) a few
of the step's responses with their prompt, reward, verdict and mean token entropy, appended to
``<output_dir>/samples.jsonl`` (one JSON object a row, with its ``step``) and sent to MLflow as the
artifact ``samples/samples.jsonl`` through the tracker's queue (the trainer never waits on it).
So a reader sees what the policy wrote before and after its entropy fell.

A tool run's rows (``tools=code_interpreter``) also carry ``turns``: the response read back from its
tokens as the policy's text segments and its tool calls in order (``response_turns``), each call with
its code, the output the policy saw and its status, each of the policy's segments with its own mean
entropy, and the row's ``entropy_by_kind`` (``text``, ``code``, ``post_tool``), so two runs' records
say at a glance where the entropy sat: in the reasoning, in the code, or after the tool answered.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Sequence

import torch

from ...core.files import atomic_write_lines
from ...evals.code.tool_executor import LIMIT_NOTES, REPLAY_NOTE
from ...evals.reflection import ReflectionMatcher
from ...rollout.base import TOKEN_KINDS, Rollout
from ...rollout.multi_turn import ChatToolTurns, check_tool_turn
from ...rollout.settings import ToolSettings
from ...rollout.tool_formats import ToolFormat, build_tool_format
from ..algos.step_batch import StepBatch

__all__ = [
    "SAMPLES_FILE",
    "CALL_STATUSES",
    "samples_due",
    "pick_rows",
    "sample_rows",
    "call_status",
    "response_turns",
    "tool_turn_rows",
    "append_samples",
    "write_step_samples",
    "drop_after",
]

SAMPLES_FILE = "samples.jsonl"


def samples_due(step: int, every: int) -> bool:
    """Whether step ``step`` (1-based, as logged) writes samples: step 1 and every ``every``-th; 0 = never."""
    return every > 0 and (step == 1 or step % every == 0)


def pick_rows(batch_rows: int, group_size: int, rows: int) -> list[int]:
    """Which rows to keep: the first response of as many groups as possible, spread over the batch,
    then further responses of those groups until ``rows``."""
    groups = max(batch_rows // max(group_size, 1), 1)
    stride = max(groups // max(rows, 1), 1)
    firsts = [g * group_size for g in range(0, groups, stride)][:rows]
    extra = [r for r in range(batch_rows) if r not in set(firsts)]
    return sorted((firsts + extra)[: min(rows, batch_rows)])


def sample_rows(
    step: int,
    prompts: Sequence[str],
    responses: Sequence[str],
    rewards: Sequence[float],
    correct: Sequence[float],
    entropy_mean: Sequence[float],
    lengths: Sequence[int],
    reflection: Sequence[int] | None = None,
    turns: Sequence[dict] | None = None,
) -> list[dict]:
    """One dict per response: ``step``, ``prompt``, ``response``, ``reward``, ``correct``,
    ``entropy_mean`` (mean token entropy of the sampling policy over the response), ``length`` (tokens),
    with a word list ``reflection`` (its count of reflection words) and in a tool run the keys of
    ``turns[i]`` (``response_turns``: ``turns``, ``entropy_by_kind``)."""
    out = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        row = {
            "step": int(step),
            "prompt": p,
            "response": r,
            "reward": float(rewards[i]),
            "correct": float(correct[i]),
            "entropy_mean": float(entropy_mean[i]),
            "length": int(lengths[i]),
        }
        if reflection is not None:
            row["reflection"] = int(reflection[i])
        if turns is not None:
            row.update(turns[i])
        out.append(row)
    return out


#: a call's status in ``turns``: ran and succeeded; raised, was killed or failed its replay; ran past
#: the wall clock; malformed (not run: its error was the output); closed with no call or turn left
#: to answer it (not run, no output).
CALL_STATUSES = ("ok", "error", "timeout", "invalid", "not_run")

# how the executor's outputs of a failed call end or begin (evals/code/tool_executor.py)
_TIMEOUT_NOTE = LIMIT_NOTES["timeout"].split("(")[0]
_LIMIT_NOTES = tuple(note.split("{")[0].split("(")[0] for note in LIMIT_NOTES.values())
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def call_status(output: str) -> str:
    """``ok``, ``error`` or ``timeout`` of a call that ran, read from the output the policy saw: the
    executor's wall-clock note, another of its limit notes, a failed replay, or a last line that is a
    Python exception (what a raised call prints last). A guess from text: ``response_turns`` settles
    it against the response's own error count where that decides."""
    if _TIMEOUT_NOTE in output:
        return "timeout"
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if output.startswith(REPLAY_NOTE) or any(note in output for note in _LIMIT_NOTES) or _EXCEPTION_LINE.match(last):
        return "error"
    return "ok"


def _runs(kind: Sequence[int], turn: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """``(kind, turn, start, end)`` of each run of consecutive tokens of one kind and turn."""
    out: list[tuple[int, int, int, int]] = []
    for i, (k, t) in enumerate(zip(kind, turn)):
        if out and out[-1][0] == k and out[-1][1] == t:
            out[-1] = (k, t, out[-1][2], i + 1)
        else:
            out.append((int(k), int(t), i, i + 1))
    return out


def _mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def _unwrap(text: str, wrapper: tuple[str, str]) -> tuple[str, bool]:
    """``(the output inside its wrapper, whether it was cut)``: the closing part missing means the
    length budget ended the response inside the output."""
    opening, closing = wrapper
    if opening and text.startswith(opening):
        text = text[len(opening) :]
    if closing and text.endswith(closing):
        return text[: -len(closing)], False
    return text, bool(closing)


def response_turns(
    ids: Sequence[int],
    kind: Sequence[int],
    turn: Sequence[int],
    entropy: Sequence[float],
    policy: Sequence[bool],
    *,
    decode: Callable[[list[int], bool], str],
    fmt: ToolFormat,
    output_wrapper: tuple[str, str],
    errors: int,
    malformed: int | None = None,
) -> dict:
    """One response of a tool run read back from its tokens (all ``[R]`` over its valid tokens):
    ``{"turns": [...], "entropy_by_kind": {kind: mean or None}}``.

    ``turns`` in order: ``{"type": "text", "kind": "text"|"post_tool", "turn", "text", "tokens",
    "entropy_mean"}`` for each of the policy's text segments and ``{"type": "call", "turn", "code",
    "tokens", "entropy_mean", "status", "output", "output_cut"}`` for each call: its code (the text of
    the whole call when it is malformed, with ``error`` saying why), the entropy of its code tokens,
    the output as the policy saw it (the tool's tokens decoded, the format's wrapper taken off: cut in
    the middle past ``tools.max_output_chars`` as the driver cut it; ``output_cut`` where the budget
    ended the response inside it), and its status (``CALL_STATUSES``). A status comes from the call's
    parse (``invalid``), a missing output (``not_run``), and for the calls that ran, ``call_status``
    on the output, settled by ``errors`` (the response's errored calls, malformed ones included, of
    which ``malformed`` were malformed): none left means every run call was ``ok``, as many as there
    are run calls means none was. ``entropy_mean`` is over the segment's policy tokens (None: none).

    ``decode(ids, keep_special)``: the tokenizer's decode (special tokens kept for tool outputs, whose
    chat wrapper holds some); ``output_wrapper``: ``(opening, closing)`` around each output. Pure."""
    policy_kinds = [k for k in TOKEN_KINDS if k != "tool"]
    by_kind: dict[str, list[float]] = {k: [] for k in policy_kinds}
    items: list[dict] = []
    calls: list[dict] = []
    for k, t, start, end in _runs(kind, turn):
        name = TOKEN_KINDS[k]
        values = [float(entropy[i]) for i in range(start, end) if policy[i]]
        if name in by_kind:
            by_kind[name] += values
        if name == "tool":
            pending = next((c for c in calls if c["output"] is None), None)
            output, cut = _unwrap(decode(list(ids[start:end]), True), output_wrapper)
            if pending is None:  # an output with no call before it: shown as it came
                items.append({"type": "tool_output", "turn": t, "output": output, "output_cut": cut})
            else:
                pending.update(output=output, output_cut=cut)
                if pending["status"] != "invalid":
                    pending["status"] = "ran"
            continue
        text = decode(list(ids[start:end]), False)
        item = {"type": "text", "kind": name, "turn": t, "text": text, "tokens": end - start, "entropy_mean": _mean(values)}
        if name == "code":
            parsed = fmt.parse(text)
            item = {"type": "call", "turn": t, "code": text if parsed is None or parsed.error else parsed.code}
            item.update(tokens=end - start, entropy_mean=_mean(values), status="not_run", output=None, output_cut=False)
            if parsed is not None and parsed.error:
                item.update(status="invalid", error=parsed.error)
            calls.append(item)
        items.append(item)
    ran = [c for c in calls if c["status"] == "ran"]
    for c in ran:
        c["status"] = call_status(c["output"])
    invalid = sum(c["status"] == "invalid" for c in calls) if malformed is None else int(malformed)
    failed = int(errors) - invalid  # errored calls among those that ran
    if failed <= 0:
        for c in ran:
            c["status"] = "ok"
    elif failed >= len(ran):
        for c in ran:
            c["status"] = c["status"] if c["status"] == "timeout" else "error"
    return {"turns": items, "entropy_by_kind": {k: _mean(v) for k, v in by_kind.items()}}


def _output_wrapper(tools_cfg, tokenizer, fmt: ToolFormat) -> tuple[str, str]:
    """What the driver wraps each tool output in: the format's output tags, or with
    ``tools.tool_turn=chat`` the chat template's tool turn (``rollout/multi_turn.py``)."""
    if check_tool_turn(tools_cfg) == "chat":
        chat = ChatToolTurns(tokenizer, ToolSettings.from_config(tools_cfg).name)
        return chat.open, chat.close
    return fmt.tags["output_open"], fmt.tags["output_close"]


def tool_turn_rows(roll: Rollout, entropy: torch.Tensor, rows: Sequence[int], tokenizer, tools_cfg) -> list[dict]:
    """``response_turns`` of rows ``rows`` of a tool run's batch (``entropy`` [B, R], the sampling
    policy's), for ``sample_rows``' ``turns``."""
    fmt = build_tool_format(tools_cfg)
    wrapper = _output_wrapper(tools_cfg, tokenizer, fmt)
    trace = roll.tools

    def decode(ids: list[int], keep_special: bool) -> str:
        return tokenizer.decode(ids, skip_special_tokens=not keep_special)

    out = []
    ent, policy = entropy.detach().float().cpu(), roll.policy_mask.bool().cpu()
    for i in rows:
        n = int(roll.response_mask[i].sum())
        out.append(
            response_turns(
                roll.response_ids[i, :n].tolist(),
                trace.kind[i, :n].tolist(),
                trace.turn[i, :n].tolist(),
                ent[i, :n].tolist(),
                policy[i, :n].tolist(),
                decode=decode,
                fmt=fmt,
                output_wrapper=wrapper,
                errors=int(trace.errors[i]),
                malformed=None if trace.malformed is None else int(trace.malformed[i]),
            )
        )
    return out


def append_samples(output_dir: Path, rows: list[dict]) -> Path:
    """Append ``rows`` to the run's samples table (the folder made if a step runs before ``fit``)."""
    path = Path(output_dir) / SAMPLES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def write_step_samples(
    output_dir: Path,
    step: int,
    batch: StepBatch,
    tokenizer,
    *,
    group_size: int,
    rows: int,
    matcher: ReflectionMatcher,
    tools_cfg=None,
) -> Path:
    """A few of step ``step``'s responses (``pick_rows``: ``rows`` of them, groups of
    ``group_size``) with prompt, reward and mean token entropy, appended to the samples table;
    returns its path. With ``matcher`` on, each row's reflection count (found beside the reward,
    ``batch.facts``, else here for these few rows); in a tool run, its turns (``tool_turn_rows``)."""
    roll = batch.responses
    picked = pick_rows(len(batch), group_size, rows)
    mask = batch.mask.detach().cpu()
    ent = (batch.entropy.detach().cpu() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    prompts = [tokenizer.decode(roll.prompt_ids[i][roll.prompt_mask[i].bool()], skip_special_tokens=True) for i in picked]
    counts = None
    if matcher.enabled:
        counts = [int(batch.facts.counts[i]) if batch.facts is not None else matcher.count(roll.texts[i]) for i in picked]
    table = sample_rows(
        step,
        prompts,
        [roll.texts[i] for i in picked],
        [float(batch.rewards[i]) for i in picked],
        [float(batch.correct[i]) for i in picked],
        [float(ent[i]) for i in picked],
        [int(roll.lengths[i]) for i in picked],
        counts,
        None if roll.tools is None else tool_turn_rows(roll, batch.entropy, picked, tokenizer, tools_cfg),
    )
    return append_samples(output_dir, table)


def drop_after(output_dir: Path, step: int) -> None:
    """On resume from step ``step``: drop the rows of later steps (the run redoes them)."""
    path = Path(output_dir) / SAMPLES_FILE
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                kept.append(line)
        except (ValueError, AttributeError):
            continue
    atomic_write_lines(path, kept)
