"""How a policy writes a tool call and how the tool's answer is written back: call formats,
registered by name (``tools.format``).

A format reads the text of one generation turn (``closed``: does it hold a complete call yet;
``parse``: the call, or why it is malformed) and writes the tool's output back as text
(``wrap_output``). Formats are pure text functions: nothing here runs anything.

- ``hermes``: ``<tool_call>{"name": "code_interpreter", "arguments": {"code": "..."}}</tool_call>``
  (Qwen's and verl's default); the answer comes back as
  ``<tool_response>...</tool_response>``. Malformed: JSON that does not parse, a name other than
  the tool's, or no ``code`` string argument.
- ``tir``: a fenced code block, ````` ```python ... ``` `````, as ReTool and SimpleTIR write it; the
  output comes back in ``<output>...</output>``. Malformed: an empty block.

Every tag is configurable (``tools.tags``: ``call_open``, ``call_close``, ``output_open``,
``output_close``), so a model whose tokenizer lacks ``<`` or backticks (the embedded tiny model)
can still call tools with tags made of its own characters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from ..core.errors import UserError
from .settings import TAG_KEYS, ToolSettings

__all__ = [
    "ToolCall",
    "ToolFormat",
    "HermesFormat",
    "TIRFormat",
    "TOOL_FORMATS",
    "register_tool_format",
    "build_tool_format",
    "middle_cut",
    "cut_note",
    "tool_schema",
    "hermes_tools_prompt",
    "TAG_KEYS",
]


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``code`` to run, or ``error`` (why the call is malformed; ``code`` is then
    empty and the error text becomes the tool's output). ``start``: the character offset in the
    turn's text where the call opens (tokens from there on are the code the policy wrote);
    ``end``: where its closing tag ends."""

    code: str
    error: str | None
    start: int
    end: int | None = None  # the character offset just past the call's closing tag


def cut_note(removed: int) -> str:
    """The note that stands where ``middle_cut`` removed ``removed`` characters."""
    return f"\n...[{removed} characters cut]...\n"


def middle_cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters by dropping its middle (the head and the tail of
    an output say most: what started, how it ended), with a note of exactly how many characters
    were dropped; the note counts against ``limit``. A ``limit`` too small to hold the note keeps
    the first ``limit`` characters, without a note."""
    if len(text) <= limit:
        return text
    removed = len(text) - limit
    while True:  # the note's length depends on the count it states: rises to the least consistent count
        keep = limit - len(cut_note(removed))
        if keep <= 0:
            return text[:limit]
        if len(text) - keep == removed:
            break
        removed = len(text) - keep
    note = cut_note(removed)
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + note + (text[len(text) - tail :] if tail else "")


class ToolFormat:
    """A call format: the tags, ``closed(text)``, ``parse(text)`` and ``wrap_output(text)``."""

    name = ""
    defaults: dict[str, str] = {}

    def __init__(self, tags: Mapping[str, str] | None = None, tool_name: str = "code_interpreter"):
        merged = dict(self.defaults)
        for key, value in (tags or {}).items():
            if key not in TAG_KEYS:
                raise UserError(f"unknown tools.tags key '{key}'; valid: {', '.join(TAG_KEYS)}")
            if value is None:
                continue
            if not isinstance(value, str) or not value:
                raise UserError(f"tools.tags.{key}={value!r} is not allowed: it must be a non-empty string")
            merged[key] = value
        self.tags = merged
        self.tool_name = tool_name

    @property
    def stop_strings(self) -> list[str]:
        """Strings at which a turn may hold a complete call, for engines that stop on strings
        (vLLM): the closing tag. Such an engine also stops where the closing tag is not a call's
        end (a fence is part of its opening tag, ```` ``` ```` in ```` ```python ````; a closing tag
        with no opening one): the driver then continues the same turn (``multi_turn.py``), so
        every engine ends a turn where ``closed`` first holds."""
        return [self.tags["call_close"]]

    def _span(self, text: str) -> tuple[int, int, int] | None:
        """``(open start, body start, close end)`` of the first complete call in ``text``, or None."""
        opener, closer = self.tags["call_open"], self.tags["call_close"]
        start = text.find(opener)
        if start < 0:
            return None
        body = start + len(opener)
        end = text.find(closer, body)
        if end < 0:
            return None
        return start, body, end + len(closer)

    def closed(self, text: str) -> bool:
        """True when ``text`` (one turn) holds a complete call: generation stops there."""
        return self._span(text) is not None

    def count_calls(self, text: str) -> int:
        """How many complete calls ``text`` holds, one after another."""
        count, span = 0, self._span(text)
        while span is not None:
            count += 1
            text = text[span[2] :]
            span = self._span(text)
        return count

    def parse(self, text: str) -> ToolCall | None:
        """The first complete call in ``text``, or None when there is none."""
        span = self._span(text)
        if span is None:
            return None
        start, body, end = span
        return replace(self._parse_body(text[body : end - len(self.tags["call_close"])], start), end=end)

    def _parse_body(self, body: str, start: int) -> ToolCall:
        raise NotImplementedError

    def wrap_output(self, output: str) -> str:
        """The tool's output as the text appended to the response (the policy reads it next turn)."""
        return self.tags["output_open"] + output + self.tags["output_close"]


class HermesFormat(ToolFormat):
    """``<tool_call>{"name": ..., "arguments": {"code": ...}}</tool_call>``."""

    name = "hermes"
    defaults = {
        "call_open": "<tool_call>",
        "call_close": "</tool_call>",
        "output_open": "\n<tool_response>\n",
        "output_close": "\n</tool_response>\n",
    }

    def _parse_body(self, body: str, start: int) -> ToolCall:
        try:
            call = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return ToolCall("", f"invalid tool call JSON: {str(exc)[:200]}", start)
        if not isinstance(call, dict):
            return ToolCall("", "invalid tool call: expected a JSON object with name and arguments", start)
        if call.get("name") != self.tool_name:
            return ToolCall("", f"unknown tool {str(call.get('name'))[:80]!r}; the only tool is {self.tool_name!r}", start)
        args = call.get("arguments")
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                args = None
        code = args.get("code") if isinstance(args, dict) else None
        if not isinstance(code, str) or not code.strip():
            return ToolCall("", "invalid tool call: arguments must hold a non-empty string 'code'", start)
        return ToolCall(code, None, start)


class TIRFormat(ToolFormat):
    """A fenced code block, output returned in a tag (ReTool / SimpleTIR)."""

    name = "tir"
    defaults = {"call_open": "```python\n", "call_close": "```", "output_open": "\n<output>\n", "output_close": "\n</output>\n"}

    def _parse_body(self, body: str, start: int) -> ToolCall:
        if not body.strip():
            return ToolCall("", "empty code block", start)
        return ToolCall(body, None, start)


def tool_schema(name: str = "code_interpreter") -> dict:
    """The code interpreter as a JSON function schema (the OpenAI ``tools`` entry a chat template
    renders into the system prompt), as verl's ``sandbox_fusion_tool_config.yaml`` declares it."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "A tool for executing code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The code to execute."}},
                "required": ["code"],
            },
        },
    }


def hermes_tools_prompt(schema: dict) -> str:
    """The system prompt that declares ``schema`` for hermes calls, in the words of Qwen2.5's chat
    template (for a template that does not render ``tools`` itself)."""
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(schema)
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


#: name -> format class (``tools.format``).
TOOL_FORMATS: dict[str, Callable[..., ToolFormat]] = {"hermes": HermesFormat, "tir": TIRFormat}


def register_tool_format(name: str, cls: Callable[..., ToolFormat] | None = None):
    """Register a call format under ``name`` (``tools.format=<name>``), directly or as a decorator."""
    if cls is not None:
        TOOL_FORMATS[name] = cls
        return cls

    def deco(c):
        TOOL_FORMATS[name] = c
        return c

    return deco


def build_tool_format(tools: ToolSettings) -> ToolFormat:
    """The format ``tools.format`` with ``tools.tags`` applied; one-line ``UserError`` otherwise.
    ``tools``: a ``ToolSettings``, or the ``tools`` section it is read from."""
    tools = ToolSettings.from_config(tools)
    name = tools.format
    if name not in TOOL_FORMATS:
        raise UserError(f"unknown tools.format={name}; valid: {', '.join(sorted(TOOL_FORMATS))}")
    fmt = TOOL_FORMATS[name](dict(tools.tags), tool_name=tools.name)
    if fmt.tags["call_open"] == fmt.tags["call_close"] and name == "hermes":
        raise UserError("tools.tags: call_open and call_close must differ for the hermes format")
    return fmt
