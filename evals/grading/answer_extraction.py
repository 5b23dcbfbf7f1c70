"""Finding the final answer in a model response (or in a gold answer written like one).

The final answer is the *last answer marker by position* in the text:

- a box: ``\\boxed{...}``, ``\\fbox{...}``, ``\\framebox[..]{...}`` (balanced braces, escaped
  ``\\{ \\}`` skipped; ``\\boxed 5`` takes one token);
- a text marker: ``Answer: X`` (the rest of the line; inside a line, "hence the Answer: 12",
  only in a response without a box and when X starts like math), ``The final answer is X`` (the Minerva
  format ``Final Answer: The final answer is $X$. I hope it is correct.``) and ``the answer is X``
  (only when X starts like math: a delimiter, a digit, a sign or a backslash, so that "the answer
  is correct" after a box is not read as an answer). A value in ``$...$`` / ``\\(...\\)`` is that
  math only; otherwise the line up to its end or its first sentence break.

When the last marker is a box, the boxes of the *final answer region* (those that close the
response, joined by commas, "and", "or", ``\\quad``, short ``\\text{...}`` or labels such as
``y_1 = \\boxed{..}``) are gathered into one multi-part answer, written as its parts joined by
", " (with their labels: "y_1 = ..., y_2 = ..."), which ``answer_normalize.split_parts`` reads
back.

The whole response is searched, whatever its length: one regular-expression pass for each kind
of marker (linear time) and brace matching only for the boxes of the final region.
"""

from __future__ import annotations

import re

from .answer_normalize import balanced_group

__all__ = ["extract_answer", "extract_with_reason", "unwrap_gold"]

_BOX_RE = re.compile(r"\\(boxed|fbox|framebox)(?![A-Za-z])")
# "Answer:" opens a line or follows "Final" ("we may check our answer: ..." is not a marker).
# "... hence the Answer: 12" (inside a line): only when no box was given and the value is math.
_TEXT_MARKER_RE = re.compile(
    r"(?:^[ \t*#_>]*|\bfinal\s+)answer\s*[:\uff1a]|\bthe\s+(final\s+)?answer\s+is\b\s*:?"
    r"|(?P<mid>\banswer\s*[:\uff1a])",
    re.IGNORECASE | re.MULTILINE,
)
_MATHLIKE_START_RE = re.compile(r"[$\\(\[\d+\-.]")
_SENTENCE_END_RE = re.compile(r"\.\s+(?=[A-Z])")
_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_MAX_VALUE_CHARS = 2_000  # a text marker's value is read from this many characters at most
_MAX_GAP_CHARS = 120  # longest text between two boxes of one final answer
# Between two boxes of one answer: spacing, math delimiters, separators, short \text{...}, labels.
_GAP_TOKEN = (
    r"\s+|\$+|\\[()\[\]]|[,;&]|\\\\|\\q?quad(?![A-Za-z])|\\[,;:! ]|~|\b(?:and|or)\b"
    r"|\\(?:text|mbox|textrm|mathrm)\s*\{[^{}]{0,40}\}|[A-Za-z](?:_\{?\w+\}?)?\s*="
    r"|[A-Za-z]{1,15}\s+(?=(?:and|or)\b)"
)  # "\boxed{1} papers and \boxed{2} bins"
_GAP_RE = re.compile(rf"(?:{_GAP_TOKEN})*")
_SEPARATOR_RE = re.compile(r"[,;&]|\\\\|\\q?quad(?![A-Za-z])|\b(?:and|or)\b|\\(?:text|mbox|textrm|mathrm)\s*\{|=")
_LABEL_TAIL_RE = re.compile(r"([A-Za-z](?:_\{?\w+\}?)?)\s*=\s*(?:\$|\\[(\[])?\s*$")

UNBALANCED = object()


def _box_content(text: str, m: re.Match) -> tuple[object, int]:
    """``(argument, end)`` of the box command matched by ``m``: the argument is a string, None
    (no argument) or ``UNBALANCED``; ``end`` is the index after it."""
    i, n = m.end(), len(text)
    if m.group(1) == "framebox":  # \framebox[width][pos]{...}
        for _ in range(2):
            j = i
            while j < n and text[j] in " \t":
                j += 1
            if j < n and text[j] == "[":
                close = text.find("]", j)
                if close < 0:
                    return UNBALANCED, n
                i = close + 1
    j = i
    while j < n and text[j] in " \t":
        j += 1
    if j < n and text[j] == "{":
        got = balanced_group(text, j)
        return (UNBALANCED, n) if got is None else got
    if j > i and j < n:  # "\boxed 5": one token up to a space, '$' or newline
        k = j
        while k < n and text[k] not in " \t\n$":
            k += 1
        return (text[j:k] or None), k
    return None, i


def _final_boxes(text: str, boxes: list[re.Match]) -> tuple[object, int]:
    """``(answer, start)`` for the last box with an argument and the boxes gathered before it;
    answer is None when there is no such box, ``UNBALANCED`` when the last one never closes."""
    k = len(boxes) - 1
    while k >= 0:
        content, end = _box_content(text, boxes[k])
        if content is not None:
            break
        k -= 1
    else:
        return None, -1
    if content is UNBALANCED:
        return UNBALANCED, boxes[k].start()
    region = [(boxes[k].start(), content.strip())]
    next_start = boxes[k].start()
    for m in reversed(boxes[:k]):
        if next_start - m.end() > _MAX_GAP_CHARS + 2 * _MAX_VALUE_CHARS:
            break
        content, end = _box_content(text, m)
        if content is None or content is UNBALANCED or end > next_start:
            break
        gap = text[end:next_start]
        if (
            len(gap) > _MAX_GAP_CHARS
            or "\n\n" in gap.replace(" ", "")
            or not _GAP_RE.fullmatch(gap)
            or (gap and not _SEPARATOR_RE.search(gap))
        ):  # "\boxed{1}\boxed{2}": one answer
            break
        region.append((m.start(), content.strip()))
        next_start = m.start()
    region.reverse()
    if len(region) == 1:
        return region[0][1] or None, region[0][0]
    parts = []
    for start, content in region:
        label = _LABEL_TAIL_RE.search(text[max(0, start - 40) : start])
        if content:
            parts.append(f"{label.group(1)} = {content}" if label and "=" not in content else content)
    return (", ".join(parts) or None), region[0][0]


def _strip_delimiters(value: str) -> str:
    """The math of ``$X$. I hope it is correct.``: X, when only punctuation or a new sentence
    follows its closing delimiter ("$12$ and $13$" stays whole)."""
    for left, right in _DELIMS:
        if value.startswith(left):
            close = value.find(right, len(left))
            if close > len(left):
                rest = value[close + len(right) :].lstrip()
                if not rest or rest[0] in ".,;!" or rest[:1].isupper():
                    return value[len(left) : close].strip()
            return value
    return value


def _text_value(text: str, m: re.Match) -> str | None:
    """The answer after text marker ``m``, or None when there is none (or it does not look like
    an answer after "the answer is")."""
    chunk = text[m.end() : m.end() + _MAX_VALUE_CHARS]
    line = chunk.lstrip(" \t*_").split("\n", 1)[0].strip().strip("*_ \t").strip()
    if line[:2] == '\\"' and '\\"' in line[2:]:  # \"$12$ and $13$\" (a quoted answer)
        line = line[2 : line.index('\\"', 2)].strip()
    if not line:
        return None
    if (m.group(0)[:1].lower() == "t" or m.group("mid")) and not _MATHLIKE_START_RE.match(line):
        return None  # "the answer is correct", "our answer: it holds": not answers
    value = _strip_delimiters(line)
    if value is line:
        value = _SENTENCE_END_RE.split(value, 1)[0]
        if value.endswith(".") and not value.endswith("\\."):
            value = value[:-1].rstrip()
        value = _strip_delimiters(value)
    return value or None


def _last_text_answer(text: str, after: int) -> tuple[str | None, int]:
    """The last text marker's answer that starts after index ``after`` (only such a marker can
    beat the final box); a few dozen empty markers at most are read, so the search stays linear."""
    for tries, m in enumerate(reversed(list(_TEXT_MARKER_RE.finditer(text)))):
        if m.start() <= after or tries >= 50:
            break
        if m.group("mid") and after >= 0:
            continue  # a box was given: a mid-line "answer:" is a remark about it
        value = _text_value(text, m)
        if value is not None:
            return value, m.start()
    return None, -1


def extract_with_reason(text) -> tuple[str | None, str]:
    """``(final answer, "")`` or ``(None, reason)`` with reason ``empty_response`` (no text),
    ``unclosed_box`` (the last box never closes: a response cut off inside its answer) or
    ``no_answer`` (no answer marker, or an empty one)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str) or not text.strip():
        return None, "empty_response"
    boxed, box_at = _final_boxes(text, list(_BOX_RE.finditer(text)))
    said, said_at = _last_text_answer(text, box_at)
    if said is not None:
        return said, ""
    if boxed is UNBALANCED:
        return None, "unclosed_box"
    if boxed is not None:
        return boxed, ""
    return None, "no_answer"


def extract_answer(text) -> str | None:
    """The final answer in a model response (see the module docstring), or None."""
    return extract_with_reason(text)[0]


def unwrap_gold(gold: str) -> str:
    """A gold answer as the grader compares it: a solution or a boxed answer (datasets store
    ``\\boxed{1}, \\boxed{2}``, "So the answer is \\[\\boxed{5}\\]") gives its final answer, read the
    way a response is; ``$...$`` / ``\\(...\\)`` around the whole answer are removed."""
    s = gold.strip()
    if _BOX_RE.search(s) or _TEXT_MARKER_RE.search(s):
        got = extract_answer(s)
        if got:
            return got
    for left, right in _DELIMS:
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            return s[len(left) : -len(right)].strip()
    return s
