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
    parser = _Evaluator(tokens)
    try:
        value = parser.expr()
    except (_NotNumeric, RecursionError, OverflowError, ZeroDivisionError, ValueError):
        return None
    return value if parser.i == len(tokens) else None


def _finite(x: float) -> float:
    if not math.isfinite(x) or abs(x) > 1e100:
        raise _NotNumeric
    return x


class _Evaluator:
    """The grammar of ``numeric_value``, one method per rule, over its tokens; ``i`` is the next
    token's index. Every rule raises ``_NotNumeric`` where the text is outside the grammar."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _NotNumeric
        self.i += 1
        return tok

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = _finite(value + self.term() if self.take() == "+" else value - self.term())
        return value

    @staticmethod
    def starts_factor(tok: str | None) -> bool:
        return tok is not None and (tok[0].isdigit() or tok[0] == "." or tok in ("\\frac", "\\sqrt", "\\pi", "(", "{"))

    def term(self) -> float:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok in ("*", "\\cdot", "\\times"):
                self.take()
                value = _finite(value * self.unary())
            elif tok == "/":  # "2/3\\pi": (2/3)pi or 2/(3pi)? Left to math-verify.
                raise _NotNumeric
            elif tok is not None and (tok[0].isdigit() or tok[0] == "."):
                raise _NotNumeric  # a number right after a factor ("1.5.2", "\\sqrt{2}3")
            elif tok == "\\frac" and self.tokens[self.i - 1][0].isdigit():
                raise _NotNumeric  # "15\\frac{39}{40}": a mixed number or a product? Unsure.
            elif self.starts_factor(tok):
                value = _finite(value * self.power())
            else:
                return value

    def unary(self) -> float:
        if self.peek() in ("-", "+"):
            return -self.unary() if self.take() == "-" else self.unary()
        return self.power()

    def power(self) -> float:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        exponent = self.group() if self.peek() == "{" else self.atom_single()
        if abs(exponent) > 64 or (base < 0 and exponent != int(exponent)) or (base == 0 and exponent < 0):
            raise _NotNumeric
        try:
            return _finite(math.pow(base, exponent))
        except (OverflowError, ValueError):
            raise _NotNumeric from None

    def group(self) -> float:
        self.take("{")
        value = self.expr()
        self.take("}")
        return value

    def atom_single(self) -> float:
        """A one-character argument: ``\\sqrt2``, ``2^3``. Longer bare runs ("2^10", which LaTeX
        typesets as 2^1 0) are ambiguous: not numeric."""
        tok = self.take()
        if tok.isdigit() and len(tok) == 1:
            return float(tok)
        if tok == "\\pi":
            return math.pi
        raise _NotNumeric

    def arg(self) -> float:
        return self.group() if self.peek() == "{" else self.atom_single()

    def atom(self) -> float:
        tok = self.peek()
        if tok is None:
            raise _NotNumeric
        if tok[0].isdigit() or tok[0] == ".":
            self.take()
            return float(tok)
        if tok == "\\pi":
            self.take()
            return math.pi
        if tok == "(":
            self.take()
            value = self.expr()
            self.take(")")
            return value
        if tok == "{":
            return self.group()
        if tok == "\\frac":
            return self.fraction()
        if tok == "\\sqrt":
            return self.root()
        raise _NotNumeric

    def fraction(self) -> float:
        self.take("\\frac")
        nxt = self.peek()
        if nxt is not None and nxt.isdigit() and len(nxt) == 2:  # \\frac12
            self.take()
            top, bottom = float(nxt[0]), float(nxt[1])
        else:
            top, bottom = self.arg(), self.arg()
        if bottom == 0:
            raise _NotNumeric
        return _finite(top / bottom)

    def root(self) -> float:
        self.take("\\sqrt")
        index = 2.0
        if self.peek() == "[":
            self.take()
            index = self.expr()
            self.take("]")
            if index not in (2.0, 3.0, 4.0, 5.0):
                raise _NotNumeric
        radicand = self.arg()
        if radicand < 0:
            raise _NotNumeric
        return _finite(radicand ** (1.0 / index))


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
