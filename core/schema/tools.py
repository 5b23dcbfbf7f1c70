"""The schema of the ``tools`` group's keys: multi-turn rollouts with a code interpreter (``conf/tools/``).

Every option of the group starts from this node (``schema/tools``): ``tools=none`` keeps the defaults (tools
off), ``tools=code_interpreter`` turns them on; a task (``data=tool_arith``) may set its own tags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..rules import (
    BOOL,
    NONNEG,
    NONNEG_INT,
    POS,
    POS_INT,
    STR,
    Rule,
    choice,
    integer,
    number,
    owned,
)
from . import key, owned_section, section


@dataclass
class Executor:
    """``tools.executor``: the code sandbox's limits per call (evals/code/sandbox.py, SandboxLimits)"""

    wall_seconds: float = key(5.0, POS, "wall clock; past it the call is killed (its output says so) and counts as an error")
    cpu_seconds: int = key(5, POS_INT, "CPU seconds")
    memory_mb: int = key(512, integer(64), "address space of each process of the call")
    processes: int = key(16, POS_INT, "processes/threads of the call at once (fork storms stop here)")
    max_output_bytes: int = key(64000, integer(256), "stdout + stderr kept; past it the call is killed")
    isolation: str = key(
        "auto",
        owned("evals/code/sandbox.py (auto, bwrap, unshare or none)"),
        "auto | bwrap | unshare | none (the sandbox's launcher; auto: the strongest that works)",
    )
    workers: int = key(0, NONNEG_INT, "calls run at once; 0 = the CPUs this process may use")
    launch: str = key(
        "zygote",
        choice("zygote", "fresh"),
        (
            "how a call's process starts (evals/code/zygote.py): zygote = forked from a warm interpreter already inside "
            "the sandbox (one per worker; the same limits, namespaces and nothing kept between calls, without an "
            "interpreter start per call); fresh = a new sandboxed interpreter per call (the slower design it replaced, "
            "kept to compare)"
        ),
    )


@dataclass
class Shaping:
    """``tools.shaping``: optional reward terms for tool use, added to the verifier's reward (off: 0)"""

    call_bonus: float = key(0.0, number(), "added once to a response that ran at least one call without error")
    error_penalty: float = key(0.0, NONNEG, "subtracted per call that errored (malformed, raised, past a limit)")


@dataclass
class ToolsSchema:
    """``tools``: a Python code interpreter the policy may call between turns (docs/tools.md); off by
    default (``tools=none``), on with ``tools=code_interpreter``."""

    enabled: bool = key(False, BOOL, "true: multi-turn rollouts with the tool (set by tools=code_interpreter)")
    name: str = key("code_interpreter", STR, 'the tool\'s name, as a call names it (hermes: {"name": ...})')
    format: str = key(
        "hermes",
        STR,
        (
            'how a call is written and its output returned (rollout/tool_formats.py): hermes: <tool_call>{"name": '
            '"code_interpreter", "arguments": {"code": ...}}</tool_call>, output in <tool_response>...</tool_response>; '
            "tir: a ```python fenced block, output in <output>...</output> (ReTool, SimpleTIR)"
        ),
    )
    tags: dict[str, Any] = owned_section(
        owned("rollout/tool_formats.py (a tag string, or null for the format's own)"),
        (
            "the format's tags; null = the format's own (e.g. tags made of the embedded tokenizer's characters: "
            'conf/data/tool_arith.yaml). Quote values with "=": tools.tags.call_open="\'M=\'"'
        ),
        {
            "call_open": (None, "opens a call (hermes: <tool_call>; tir: ```python + newline)"),
            "call_close": (None, "closes it: generation of the turn stops here (hermes: </tool_call>; tir: ```)"),
            "output_open": (None, "written before the tool's output (hermes: <tool_response>; tir: <output>)"),
            "output_close": (None, "written after it"),
        },
    )
    max_turns: int = key(4, POS_INT, "generation turns per response (a turn ends at a closed call, EOS or the budget)")
    max_calls: int = key(
        3,
        NONNEG_INT,
        (
            "tool calls run per response; a call closed past it ends the response (truncated); at most max_turns - 1 "
            "run whatever this says (the last turn answers: a larger value is said at start)"
        ),
    )
    max_output_chars: int = key(
        1024,
        integer(16),
        (
            'a tool output longer than this is cut in the middle: its real head and tail are kept around a note "...[N '
            'characters cut]..." that counts exactly what was dropped; the result, note included, is at most this long '
            "(verl's note comes on top of its limit)"
        ),
    )
    tool_turn: str = key(
        "inline",
        choice("inline", "chat"),
        (
            "how a call turn ends and the output comes back (rollout/multi_turn.py): inline: the turn stops at the call's "
            "closing tag; the output, in the format's output tags, is appended to the same assistant message and the "
            "policy continues it; chat: as verl's ToolAgentLoop: the call turn ends at EOS, the output comes back as a "
            "chat-templated 'tool' turn (all of it mask 0), and the system prompt carries the tool's JSON schema; needs "
            "format=hermes and a tokenizer with a chat template"
        ),
    )
    session: str = key(
        "stateless",
        choice("stateless", "trajectory"),
        (
            "what a call starts from; every call is a fresh sandboxed process with the same limits: stateless: nothing "
            "from earlier calls (as SandboxFusion); trajectory: the variables of the same response's earlier calls, as in "
            "a notebook kernel. By replay: the process first re-runs that response's earlier calls that ran without "
            "error, output discarded, then the new call. Chosen over a long-lived kernel because no process outlives its "
            "call (no new way out of the sandbox, nothing to clean up); the cost: the replay's time counts against the "
            "new call's limits, and random draws or clock reads come out anew. A replay that fails or passes a limit "
            "makes the new call an error (its output says so)"
        ),
    )
    mask_invalid_calls: bool = key(
        False,
        BOOL,
        (
            "true: a response with a malformed call (bad JSON, unknown tool, no code) is left out of the loss entirely (a "
            "switch of STARE's tool-use recipe); its reward still counts in its group's baseline"
        ),
    )
    mask_repeated: bool = key(
        False,
        BOOL,
        (
            "true: a response that repeats itself, i.e. runs the same code in two of its calls (compared with the "
            "whitespace around the code stripped; malformed calls have no code and never count), is left out of the loss "
            "as mask_invalid_calls does (STARE's mask_repeat_response switch; STARE does not publish its test, this one "
            "is ours)"
        ),
    )
    drop_void_turns: bool = key(
        False,
        BOOL,
        (
            "true: a response with a void turn, one that ended with neither a closed call nor a final answer (SimpleTIR's "
            "definition; e.g. cut by the budget mid-turn, or stopped without an answer), is left out of the loss "
            "entirely, as SimpleTIR's mask_void_turns does; its reward still counts in its group's baseline"
        ),
    )
    answer_pattern: str | None = key(
        None,
        Rule("str", nullable=True),
        (
            "what counts as a final answer in a turn (for void turns): null = the math grader's final answer (a \\boxed{} "
            "or an \"Answer:\" line); else a regular expression searched in the turn's text (SimpleTIR's test is "
            "'\\\\boxed\\{'; data=tool_arith sets its own)"
        ),
    )
    show_last_expression: bool = key(
        True, BOOL, "a call whose code ends in an expression prints its repr, as a notebook cell does"
    )
    executor: Executor = section(Executor)
    shaping: Shaping = section(Shaping)
