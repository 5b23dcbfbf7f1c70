"""Values of constant answers for the grader's fast path: exact rationals and a tiny evaluator.

``rational`` reads a plain decimal or an integer fraction exactly; ``numeric_value`` evaluates a
constant arithmetic expression in LaTeX with a small recursive-descent parser (no ``eval``: model
text is never executed).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .answer_normalize import canonical_number

__all__ = ["numeric_value", "rational"]


class _NotNumeric(Exception):
    pass


_TOKEN_RE = re.compile(r"\\(?:frac|sqrt|pi|cdot|times)(?![A-Za-z])|\d+(?:\.\d+)?|\.\d+|[-+*/^(){}\[\]]")


def numeric_value(key: str) -> float | None:
    """The value of a constant arithmetic expression in LaTeX, or None.

    A small recursive-descent evaluator (no ``eval``) over numbers, ``+ - *``, ``\\cdot``,
    ``\\times``, ``^``, ``\\frac``, ``\\sqrt`` (with an optional index), ``\\pi``, parentheses and
    braces, with implicit multiplication ("3\\sqrt{2}"). Anything else (a letter, a comma, a
    set, a slash, a huge power, an ambiguous "2^10") gives None."""
    if not key or len(key) > 200:
        return None
    tokens, pos = [], 0
    for m in _TOKEN_RE.finditer(key):
        if m.start() != pos:
            return None  # something outside the grammar (a letter, a comma...)
        tokens.append(m.group())
        pos = m.end()
    if pos != len(key):
        return None
    i = 0

    def peek():
        return tokens[i] if i < len(tokens) else None

    def take(expected=None):
        nonlocal i
        tok = peek()
        if tok is None or (expected is not None and tok != expected):
            raise _NotNumeric
        i += 1
        return tok

    def finite(x: float) -> float:
        if not math.isfinite(x) or abs(x) > 1e100:
            raise _NotNumeric
        return x

    def expr() -> float:
        value = term()
        while peek() in ("+", "-"):
            value = finite(value + term() if take() == "+" else value - term())
        return value

    def starts_factor(tok) -> bool:
        return tok is not None and (tok[0].isdigit() or tok[0] == "." or tok in ("\\frac", "\\sqrt", "\\pi", "(", "{"))

    def term() -> float:
        value = unary()
        while True:
            tok = peek()
            if tok in ("*", "\\cdot", "\\times"):
                take()
                value = finite(value * unary())
            elif tok == "/":  # "2/3\\pi": (2/3)pi or 2/(3pi)? Left to math-verify.
                raise _NotNumeric
            elif tok is not None and (tok[0].isdigit() or tok[0] == "."):
                raise _NotNumeric  # a number right after a factor ("1.5.2", "\\sqrt{2}3")
            elif tok == "\\frac" and tokens[i - 1][0].isdigit():
                raise _NotNumeric  # "15\\frac{39}{40}": a mixed number or a product? Unsure.
            elif starts_factor(tok):
                value = finite(value * power())
            else:
                return value

    def unary() -> float:
        if peek() in ("-", "+"):
            return -unary() if take() == "-" else unary()
        return power()

    def power() -> float:
        base = atom()
        if peek() == "^":
            take()
            exponent = group() if peek() == "{" else atom_single()
            if abs(exponent) > 64 or (base < 0 and exponent != int(exponent)) or (base == 0 and exponent < 0):
                raise _NotNumeric
            try:
                return finite(math.pow(base, exponent))
            except (OverflowError, ValueError):
                raise _NotNumeric from None
        return base

    def group() -> float:
        take("{")
        value = expr()
        take("}")
        return value

    def atom_single() -> float:
        """A one-character argument: ``\\sqrt2``, ``2^3``. Longer bare runs ("2^10", which LaTeX
        typesets as 2^1 0) are ambiguous: not numeric."""
        tok = take()
        if tok.isdigit() and len(tok) == 1:
            return float(tok)
        if tok == "\\pi":
            return math.pi
        raise _NotNumeric

    def arg() -> float:
        return group() if peek() == "{" else atom_single()

    def atom() -> float:
        tok = peek()
        if tok is None:
            raise _NotNumeric
        if tok[0].isdigit() or tok[0] == ".":
            take()
            return float(tok)
        if tok == "\\pi":
            take()
            return math.pi
        if tok == "(":
            take()
            value = expr()
            take(")")
            return value
        if tok == "{":
            return group()
        if tok == "\\frac":
            take()
            nxt = peek()
            if nxt is not None and nxt.isdigit() and len(nxt) == 2:  # \\frac12
                take()
                top, bottom = float(nxt[0]), float(nxt[1])
            else:
                top, bottom = arg(), arg()
            if bottom == 0:
                raise _NotNumeric
            return finite(top / bottom)
        if tok == "\\sqrt":
            take()
            index = 2.0
            if peek() == "[":
                take()
                index = expr()
                take("]")
                if index not in (2.0, 3.0, 4.0, 5.0):
                    raise _NotNumeric
            radicand = arg()
            if radicand < 0:
                raise _NotNumeric
            return finite(radicand ** (1.0 / index))
        raise _NotNumeric

    try:
        value = expr()
    except (_NotNumeric, RecursionError, OverflowError, ZeroDivisionError, ValueError):
        return None
    return value if i == len(tokens) else None


_FRAC_RE = re.compile(r"^(-?)\\frac(?:\{(-?\d{1,30})\}\{(\d{1,30})\}|(\d)(\d))$")


def rational(key: str) -> tuple[Fraction, int] | None:
    """``(exact value, decimals written)`` of a compact key that is a plain decimal number or an
    integer fraction ``\\frac{a}{b}``; None otherwise."""
    if len(key) > 64:
        return None
    num = canonical_number(key)
    if num is not None:
        return Fraction(num), len(num.partition(".")[2])
    m = _FRAC_RE.match(key)
    if not m:
        return None
    top, bottom = (m.group(2), m.group(3)) if m.group(2) is not None else (m.group(4), m.group(5))
    if int(bottom) == 0:
        return None
    value = Fraction(int(top), int(bottom))
    return (-value if m.group(1) else value), 0
