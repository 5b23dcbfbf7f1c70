"""Grading of model responses against gold answers: the public entry points.

Pipeline for one (response, gold) pair:

1. ``extract_answer`` (``answer_extraction``): the final answer by position among all answer
   markers (boxes, ``Answer:``, ``The final answer is``); the boxes of the final answer region
   form one multi-part answer. The gold answer is unwrapped the same way (``unwrap_gold``).
2. Fast path in the calling process (``answer_normalize``): both answers normalised and compared
   as keys; plain numbers and integer fractions exactly; constant expressions whose values are
   clearly apart are wrong; multi-part answers part by part (as sets, or by label), and a single
   gold answer never matches a list. Whatever the fast path does not fully understand it leaves
   to math-verify (a percent or a degree sign it dropped: it may accept, never reject).
3. Otherwise math-verify in a worker process (``grader_pool``), with the per-item time limit
   enforced by killing the worker.

Every verdict carries a ``reason`` that says which step decided (see ``GradeResult``). Model
text is never executed.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

from .answer_extraction import extract_answer, extract_with_reason, unwrap_gold
from .answer_normalize import MAX_ANSWER_CHARS, canonical_number, compact_key, lossy, match_parts, normalize, split_parts
from .answer_values import numeric_value, rational
from .grader_pool import cpu_count, run_pool, shutdown_pool, start_pool

DEFAULT_TIMEOUT = 5.0

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_ANSWER_CHARS",
    "GradeResult",
    "REASONS",
    "NO_FINAL_ANSWER",
    "extract_answer",
    "unwrap_gold",
    "normalize",
    "compact_key",
    "canonical_number",
    "numeric_value",
    "is_equiv",
    "grade_answers",
    "grade_batch",
    "shutdown_pool",
    "cpu_count",
    "reason_counts",
    "no_answer_warning",
]

REASONS = {
    "match": "fast path: the normalised answers are equal",
    "mismatch": "fast path: different values, different part counts, or a list against one answer",
    "math_verify_match": "math-verify: equivalent",
    "math_verify_mismatch": "math-verify: not equivalent (or could not parse)",
    "timeout": "math-verify ran past the time limit (worker killed)",
    "worker_died": "the math-verify worker died on this item",
    "no_answer": "no final answer in the response (no box, no 'Answer:')",
    "unclosed_box": "the final \\boxed{ never closes (a response cut off inside its answer)",
    "empty_response": "the response is empty",
    "too_long_answer": f"the extracted or gold answer is over {MAX_ANSWER_CHARS} characters",
    "bad_gold": "the gold answer is empty or not text",
}
# Responses that end without a final answer: an eval where many do was probably cut short.
NO_FINAL_ANSWER = ("empty_response", "no_answer", "unclosed_box")


@dataclass(frozen=True)
class GradeResult:
    """Verdict for one response; ``reason`` is one of ``REASONS`` (``match`` / ``mismatch``:
    decided by the fast path; ``math_verify_*``, ``timeout``, ``worker_died``: by math-verify;
    the others: before any comparison)."""

    correct: bool
    extracted: str | None
    reason: str = ""

    @property
    def decided_by(self) -> str:
        if self.reason in ("match", "mismatch"):
            return "fast_path"
        if self.reason.startswith("math_verify") or self.reason in ("timeout", "worker_died"):
            return "math_verify"
        return "extraction"


def _as_text(x) -> str | None:
    if isinstance(x, (bytes, bytearray)):
        return bytes(x).decode("utf-8", errors="replace")
    if isinstance(x, str):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return repr(x) if isinstance(x, float) else str(x)
    return None


_MIXED_RE = re.compile(r"^(-?)(\d{1,9})\\frac\{(\d{1,9})\}\{(\d{1,9})\}$")


def _values(key: str, factor: float | None) -> list[float] | None:
    """The values a constant answer key can be read as: a mixed number "1\\frac{4}{5}" is 1 + 4/5
    or 1 * 4/5; a dropped percent / degree sign (``factor``) gives the value scaled by it too."""
    m = _MIXED_RE.match(key)
    if m and int(m.group(4)):
        whole, frac = int(m.group(2)), int(m.group(3)) / int(m.group(4))
        sign = -1 if m.group(1) else 1
        values = [sign * (whole + frac), sign * whole * frac]
    else:
        value = numeric_value(key)
        if value is None:
            return None
        values = [value]
    return values + [v * factor for v in values] if factor else values


_TEXT_RE = re.compile(r"\\(?:text|mbox|mathrm|textrm|textbf|mathbf)\s*\{[^{}]*\}")
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_STRUCTURE_RE = re.compile(r"^[(\[].*,.*[)\]]$|\\cup|\\begin\{[pbvB]?matrix\}")


def _not_a_number(answer: str) -> bool:
    """Whether an answer can never equal a plain real number: a tuple, an interval, a union, a
    matrix, or an expression with a free variable or a word ("2k+2", "6-5i", "Evelyn"; "e" may be
    Euler's number and a unit in ``\\text{}`` is not a variable)."""
    s = normalize(answer)
    if _STRUCTURE_RE.search(s.replace("\\left", "").replace("\\right", "")):
        return True
    letters = _COMMAND_RE.sub("", _TEXT_RE.sub("", s))
    return any(c.isascii() and c.isalpha() and c != "e" for c in letters)


_EQUATION_RE = re.compile(r"(?<![<>!=\\])=(?!=)")


def _has_equation(key: str) -> bool:
    """Whether an answer key is an equation (a top-level ``=``; not ``<=``, ``>=``, ``!=``)."""
    return bool(_EQUATION_RE.search(key))


def _fast_single(pred: str, gold: str) -> bool | None:
    """True / False when the fast path is sure about a one-part pair, else None."""
    pk, gk = compact_key(pred), compact_key(gold)
    if pk and pk == gk:
        return True
    if _has_equation(pk) != _has_equation(gk):
        # "f(x)=1", "|AB|=1", "\\frac{NO}{BO}=..." against a bare value: math-verify compares
        # the right-hand side; the fast path does not guess which side is the label.
        return None
    pf, gf = lossy(pred), lossy(gold)
    pv, gv = rational(pk), rational(gk)
    if pv is not None and gv is not None and not (pf or gf):
        # Plain numbers and integer fractions, compared exactly ("0.5" == "\\frac{1}{2}"). When
        # they differ but a decimal is within math-verify's 6-decimal rounding of the other
        # ("0.333333" vs "\\frac{1}{3}"), math-verify decides.
        if pv[0] == gv[0]:
            return True
        decimals = max(pv[1], gv[1])
        if decimals == 0 or abs(pv[0] - gv[0]) > Fraction(1, 10 ** min(decimals, 6)):
            return False
        return None
    # Constant expressions ("3\\sqrt{13}", "-\\frac{\\pi}{6}", "2^{10}", "30^\\circ") whose values
    # are clearly apart under every reading cannot be equal. Only ever a *reject*; equality of
    # different keys stays with math-verify.
    a, b = _values(pk, pf), _values(gk, gf)
    if a and b and all(abs(x - y) > 1e-5 * max(1.0, abs(x), abs(y)) for x in a for y in b):
        return False
    # A number against something of another shape ("5" vs "(6, 31, -1)", "12" vs "x^3+3x-6").
    if (a and _not_a_number(gold)) or (b and _not_a_number(pred)):
        return False
    return None


def _precheck(pred: str | None, gold: str | None) -> str | None:
    """The reason for a verdict reached without math-verify, or None to ask math-verify."""
    if gold is None or not gold.strip():
        return "bad_gold" if pred is not None and pred.strip() else "no_answer"
    if pred is None or not pred.strip():
        return "no_answer"
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return "too_long_answer"
    pred_parts, gold_parts = split_parts(pred), split_parts(gold)
    if len(gold_parts) == 1 and len(pred_parts) > 1:
        # A list of candidates never matches a single answer, unless every part is that answer
        # (the same value in two forms: "\\boxed{0.5}, or \\boxed{\\frac{1}{2}}").
        verdicts = [_fast_single(p, gold) for p in pred_parts]
        verdict = False if False in verdicts else (None if None in verdicts else True)
    elif len(pred_parts) > 1 and len(gold_parts) > 1:
        verdict = match_parts(pred_parts, gold_parts, _fast_single)
    elif len(gold_parts) > 1:
        verdict = True if compact_key(pred) == compact_key(gold) else None
    else:
        verdict = _fast_single(pred, gold)
    return None if verdict is None else ("match" if verdict else "mismatch")


def grade_answers(
    preds: Sequence[str | None],
    golds: Sequence,
    *,
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[int], None] | None = None,
) -> list[tuple[bool, str]]:
    """``(verdict, reason)`` for already extracted answers against gold answers (unwrapped here)."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} answers but {len(golds)} gold answers")
    out: list[tuple[bool, str] | None] = [None] * len(preds)
    unique: dict[tuple[str, str], list[int]] = {}  # identical pairs go to math-verify once
    for i, (p, g) in enumerate(zip(preds, golds)):
        p, g = _as_text(p) if p is not None else None, _as_text(g)
        if g is not None:
            g = unwrap_gold(g)
        pre = _precheck(p, g)
        if pre is None:
            unique.setdefault((p, g), []).append(i)
        else:
            out[i] = (pre == "match", pre)
            if progress:
                progress(1)
    items = list(unique)

    def done(j: int, ok: bool, reason: str) -> None:
        for i in unique[items[j]]:
            out[i] = (ok, reason)
        if progress:
            progress(len(unique[items[j]]))

    if items:
        run_pool(items, workers, float(timeout), done)
    return [o if o is not None else (False, "worker_died") for o in out]


def is_equiv(pred, gold, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether answer ``pred`` equals gold answer ``gold`` (both already extracted)."""
    return grade_answers([pred], [gold], timeout=timeout)[0][0]


def grade_batch(
    responses: Sequence,
    golds: Sequence,
    *,
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[int], None] | None = None,
) -> list[GradeResult]:
    """Grade full model responses against gold answers, in parallel across worker processes.

    ``workers``: math-verify processes (None = CPUs available). ``timeout``: seconds per item,
    enforced by killing the worker. ``progress(k)`` is called as items finish."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
    if responses:
        start_pool(workers)  # math-verify warms up while we extract
    extracted, why = [], []
    for r in responses:
        answer, reason = extract_with_reason(_as_text(r))
        extracted.append(answer)
        why.append(reason)
    verdicts = grade_answers(extracted, golds, workers=workers, timeout=timeout, progress=progress)
    return [GradeResult(correct=ok, extracted=extracted[i], reason=why[i] or reason) for i, (ok, reason) in enumerate(verdicts)]


def reason_counts(results: Sequence[GradeResult]) -> dict[str, int]:
    """``{reason: count}``, most frequent first."""
    return dict(Counter(r.reason for r in results).most_common())


def ungraded_warning(reasons: Sequence[str], timeout: float) -> str | None:
    """The one line for responses math-verify did not decide (``timeout``, ``worker_died``), which a
    reward scores 0 like a wrong answer; None when every response was decided."""
    counts = Counter(r for r in reasons if r in ("timeout", "worker_died"))
    if not counts:
        return None
    parts = ", ".join(f"{reason} {n}" for reason, n in counts.most_common())
    return (
        f"warning: grading: {sum(counts.values())} of {len(reasons)} response(s) were not decided ({parts}; "
        f"data.grade_timeout={timeout:g} s) and score 0 as wrong: raise data.grade_timeout, or leave the grader "
        f"more CPU (data.grade_workers)"
    )


def no_answer_warning(results: Sequence[GradeResult], label: str, share: float = 0.25) -> str | None:
    """A one-line warning when more than ``share`` of ``results`` end without a final answer
    (empty, cut off inside a box, or no answer marker: most often generation hit its token
    limit), else None."""
    if not results:
        return None
    missing = sum(r.reason in NO_FINAL_ANSWER for r in results)
    if missing <= share * len(results):
        return None
    return (
        f"{label}: {missing} of {len(results)} responses ({missing / len(results):.0%}) are empty or end "
        f"without a final answer (truncated?); raise eval.max_new_tokens or check the prompt template"
    )
