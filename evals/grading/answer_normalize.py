"""Normalisation of extracted answers: pure string functions, linear time, no model text executed.

``normalize`` turns an answer into LaTeX that math-verify and ``compact_key`` read the same way
for the usual spellings ("073" -> "73", "27.0" -> "27", "1,000" -> "1000", ``\\text{}`` wrappers,
``^\\circ``, ``\\%`` and the words percent / percentage / pct, ``\\$``, a trailing period,
``\\left``/``\\right``, spacing, an ``x =`` label). A comma followed by a space is never a
thousands separator: "32, 349" is a list of two answers, not 32349.

``split_parts`` reads a multi-part answer ("(2, 2), (6, 2)", "k = 45, n = 2", ``\\{1, 2\\}``) as
its parts and ``match_parts`` compares two of them (as sets, or label by label). The values of
constant expressions are in ``answer_values``.
"""

from __future__ import annotations

import math
import re

MAX_ANSWER_CHARS = 1_000  # longer extracted / gold answers are not compared: verdict False

__all__ = [
    "MAX_ANSWER_CHARS",
    "balanced_group",
    "canonical_number",
    "normalize",
    "compact_key",
    "lossy",
    "split_parts",
    "label_of",
    "match_parts",
]


def balanced_group(text: str, start: int) -> tuple[str, int] | None:
    """Content of the ``{...}`` group opening at ``text[start]`` and the index after it.

    Escaped braces (``\\{``, ``\\}``) and ``\\\\`` are skipped. None if never closed."""
    depth = 0
    i, n = start, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


_NUM_RE = re.compile(r"^([+-]?)(\d{1,3}(?:,\d{3})+|\d+)?(?:\.(\d*))?$")
_WRAP_RE = re.compile(r"^\\(?:boxed|fbox|textbf|mathbf|text|textrm|mathrm|mbox)\s*\{")
_INNER_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree|°")
_PERCENT_RE = re.compile(r"\\%|%|\s*(?:\\(?:text|mathrm|mbox)\s*\{\s*)?\b(?:percentage|percent|pct)\b\.?\s*\}?\s*$")
_SPACING_RE = re.compile(r"\\[,;:! ]|\\q?quad(?![A-Za-z])|~")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_UNITS_RE = re.compile(r"\\(?:text|mathrm|mbox)\{\s+[^{}]*\}\s*$")  # "5\text{ cm}": a unit
_LHS_RE = re.compile(r"^([A-Za-z](?:_\{?\w+\}?)?)\s*=\s*(?=[^=])")  # "x = 5", "a_1 = 5", "x_{2}=5"
_COMMA_SPACE_RE = re.compile(r",\s+")


def canonical_number(s: str) -> str | None:
    """ "073" -> "73", "27.0" -> "27", "1,000" -> "1000", "+.50" -> "0.5"; None if not a plain
    decimal number (a comma followed by a space is never a thousands separator: "32, 349")."""
    m = _NUM_RE.match(s)
    if not m or (m.group(2) is None and not m.group(3)):
        return None
    sign, whole, frac = m.group(1), (m.group(2) or "0").replace(",", ""), (m.group(3) or "")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    out = whole + ("." + frac if frac else "")
    if sign == "-" and out != "0":
        out = "-" + out
    return out


def _unwrap_whole(s: str) -> str:
    """Remove wrappers like ``\\boxed{...}`` / ``\\text{...}`` that span the whole string."""
    for _ in range(5):
        m = _WRAP_RE.match(s)
        if not m:
            return s
        got = balanced_group(s, m.end() - 1)
        if got is None or got[1] != len(s):
            return s
        s = got[0].strip()
    return s


_LATEX_THOUSANDS_RE = re.compile(r"\{,\}|,\\!\s*(?=\d{3}(?!\d))")  # "14{,}916", "16,\\!386"


def _thousands(s: str) -> str:
    """LaTeX thousands separators ``{,}`` and ``,\\!`` written as a plain comma."""
    return _LATEX_THOUSANDS_RE.sub(",", s).replace("\\!", "") if ("{,}" in s or "\\!" in s) else s


def _squeeze_number(s: str) -> str | None:
    """``canonical_number`` of ``s`` without its spaces, unless a space follows a comma."""
    if _COMMA_SPACE_RE.search(s):
        return None
    return canonical_number(s.replace(" ", ""))


def normalize(answer: str) -> str:
    """A normalised answer that is still LaTeX (fed to math-verify and to ``compact_key``)."""
    s = _thousands(answer.strip())
    s = _unwrap_whole(s)
    s = s.replace("\\$", "").replace("$", "")
    s = _PERCENT_RE.sub("", s)
    s = _DEGREE_RE.sub("", s)
    s = _UNITS_RE.sub("", s)
    s = _SPACING_RE.sub(" ", s).strip()
    while len(s) > 1 and s.endswith((".", ",", ";")) and not s.endswith("\\."):
        s = s[:-1].rstrip()
    s = _unwrap_whole(s)
    if s.startswith("(") and s.endswith(")") and canonical_number(s[1:-1].strip()) is not None:
        s = s[1:-1].strip()  # "(073)" -> "073" (a lone number in parentheses)
    m = _LHS_RE.match(s)
    if m and "=" not in s[m.end() :]:
        s = s[m.end() :].strip()
    num = _squeeze_number(s)
    return num if num is not None else s


def compact_key(answer: str) -> str:
    """``normalize`` plus spacing-, ``\\left``- and ``\\dfrac``-insensitive: the fast-path key."""
    s = normalize(answer)
    s = _LEFT_RIGHT_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _INNER_TEXT_RE.sub(r"\1", s)
    squeezed = re.sub(r"\s+", "", s)
    num = _squeeze_number(s)
    if num is None and canonical_number(squeezed) is not None:
        return squeezed.replace(",", ", ")  # "32, 349" stays a list, never the number 32349
    return num if num is not None else squeezed


def lossy(answer: str) -> float | None:
    """The factor of the value that ``normalize`` drops when it removes a percent (``10\\%`` is
    0.1 to math-verify: 1/100) or a degree sign (pi/180), else None. Such a pair may be accepted
    on equal keys, but rejected only when the values differ under both readings."""
    if _PERCENT_RE.search(answer):
        return 0.01
    if _DEGREE_RE.search(answer):
        return math.pi / 180
    return None


# --------------------------------------------------------------------------------------------
# Multi-part answers
# --------------------------------------------------------------------------------------------

_OPEN, _CLOSE = "([{", ")]}"
_JOIN_WORD_RE = re.compile(r"\s*(?:\\text\s*\{\s*(?:and|or)\s*\}|\band\b|\bor\b)\s*")
_LEAD_SPACING_RE = re.compile(r"^(?:\\q?quad|\\[,;: !]|~|\s)+")
_THOUSANDS_TAIL_RE = re.compile(r"\d{3}(?!\d)")
_THOUSANDS_HEAD_RE = re.compile(r"(?:^|[^\d.])\d{1,3}$")
_SET_RE = re.compile(r"^\\\{(.*)\\\}$", re.S)


def _top_level_splits(s: str) -> list[str]:
    """``s`` cut at the commas and semicolons outside any bracket (``\\{`` ``\\}`` count as
    brackets), keeping "1,000"-style thousands groups (a comma with no space after it)."""
    parts, depth, last, i, n = [], 0, 0, 0, len(s)
    while i < n:
        ch = s[i]
        if ch == "\\":
            if i + 1 < n and s[i + 1] in "{}":
                depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0 and ch in ",;":
            if not (ch == "," and _THOUSANDS_TAIL_RE.match(s, i + 1) and _THOUSANDS_HEAD_RE.search(s[max(0, i - 4) : i])):
                parts.append(s[last:i])
                last = i + 1
        i += 1
    parts.append(s[last:])
    return parts


_LABELLED_RE = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=[^=])")


def _labelled_groups(s: str) -> list[str] | None:
    """``["(5, 2)", "(7, 2)"]`` for "p=5,q=2;p=7,q=2": groups separated by ';', each a comma list
    of ``name = value`` with the same names in the same order, read as tuples; else None."""
    groups = [g for g in s.split(";") if g.strip()]
    if len(groups) < 2:
        return None
    names, out = None, []
    for g in groups:
        items = _top_level_splits(g)
        heads = [_LABELLED_RE.match(i) for i in items]
        if len(items) < 2 or not all(heads):
            return None
        these = [h.group(0).split("=")[0].strip() for h in heads]
        if names is not None and these != names:
            return None
        names = these
        out.append("(" + ", ".join(i[h.end() :].strip() for i, h in zip(items, heads)) + ")")
    return out


def split_parts(answer: str) -> list[str]:
    """The parts of a multi-part answer, or ``[answer]``.

    Parts are separated by top-level commas / semicolons (never a thousands group "1,000") and
    the words "and" / "or"; a whole-answer set ``\\{1, 2\\}`` is its elements; one ``\\pm`` stands
    for its two values (``\\pm 2021``: -2021 and 2021). Empty parts are dropped and repeated ones
    (same ``compact_key``) kept once."""
    s = _thousands(answer.strip().strip("$").strip())
    s = _unwrap_whole(s)
    m = _SET_RE.match(s)
    if m:
        s = m.group(1)
    elif s.startswith("{") and (got := balanced_group(s, 0)) is not None and got[1] == len(s):
        s = got[0]  # "{1,2,3}": a set written with plain braces
    grouped = _labelled_groups(s) if ";" in s else None
    if grouped:
        return grouped
    pieces = []
    for chunk in _top_level_splits(s):
        pieces += _JOIN_WORD_RE.split(chunk) if ("and" in chunk or "or" in chunk) else [chunk]
    out, seen = [], set()
    for p in pieces:
        p = _LEAD_SPACING_RE.sub("", p).strip()
        if not p:
            continue
        key = compact_key(p)
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
    if len(out) == 1 and len(_PM_RE.findall(out[0])) == 1:
        # "\pm 2021" is the set {-2021, 2021}; "1 \pm \sqrt{2}" the pair 1 - \sqrt{2}, 1 + \sqrt{2}
        minus, plus = _PM_RE.sub("-", out[0]).strip(), _PM_RE.sub("+", out[0]).strip()
        return [re.sub(r"^-\s+", "-", minus), plus[1:].strip() if plus.startswith("+") else plus]
    return out or [answer]


_PM_RE = re.compile(r"\\pm(?![a-zA-Z])")


def label_of(part: str) -> tuple[str | None, str]:
    """``("x_1", "5")`` for "x_{1} = 5"; ``(None, part)`` when the part has no ``name =`` label."""
    m = _LHS_RE.match(part.strip())
    if not m or "=" in part.strip()[m.end() :]:
        return None, part
    return m.group(1).replace("{", "").replace("}", ""), part.strip()[m.end() :].strip()


def match_parts(preds: list[str], golds: list[str], equal) -> bool | None:
    """Whether multi-part answer ``preds`` equals ``golds`` under ``equal(pred, gold) -> bool |
    None`` (None: undecided), or None when an undecided pair could change the verdict.

    Parts labelled alike on both sides ("x_1 = ..", "x_{1} = ..") compare label by label;
    otherwise as sets: every gold part needs its own equal prediction part (order-insensitive)."""
    if len(preds) != len(golds):
        return False
    lp, lg = [label_of(p) for p in preds], [label_of(g) for g in golds]
    labels_p, labels_g = [name for name, _ in lp], [name for name, _ in lg]
    if None not in labels_p and sorted(labels_p) == sorted(labels_g) and len(set(labels_g)) == len(labels_g):
        by_label = dict(lp)
        verdicts = [equal(by_label[name], value) for name, value in lg]
        return False if False in verdicts else (None if None in verdicts else True)
    values_p, values_g = [v for _, v in lp], [v for _, v in lg]
    unsure, used = False, set()
    for g in values_g:
        found = False
        for j, p in enumerate(values_p):
            if j in used:
                continue
            verdict = equal(p, g)
            if verdict is True:
                used.add(j)
                found = True
                break
            unsure = unsure or verdict is None
        if not found:
            return None if unsure else False
    return True
