"""math-verify on one (prediction, gold) pair: what a grading worker runs.

Only ``LatexExtractionConfig`` is used, so no Python expression parser ever sees model text.
Multi-part answers are compared part by part (``answer_normalize.match_parts``).
"""

from __future__ import annotations

from functools import lru_cache

from .answer_normalize import match_parts, normalize, split_parts

__all__ = ["WARMUP", "mv_equiv", "mv_single"]


@lru_cache(maxsize=4096)
def _parsed(answer: str, inner_timeout: int) -> tuple:
    """math-verify's reading of one answer, kept per worker: the same gold answer (and the same
    extracted answer) comes back many times in a batch of samples."""
    from math_verify import LatexExtractionConfig, parse

    config = [LatexExtractionConfig(boxed_match_priority=0)]
    return tuple(parse("\\boxed{" + answer + "}", extraction_config=config, parsing_timeout=inner_timeout))


def _cut_short(text: str, parsed: tuple) -> bool:
    """Whether math-verify kept less of ``text`` than was written (its last item is the text it read)."""
    kept = parsed[-1] if parsed and isinstance(parsed[-1], str) else None
    return kept is not None and len("".join(kept.split())) < len("".join(text.split()))


def mv_single(pred: str, gold: str, inner_timeout: int) -> bool:
    """math-verify on the normalised pair, then on the raw pair. Runs in a worker."""
    from math_verify import verify

    pairs = [(normalize(gold), normalize(pred))]
    if pairs[0] != (gold, pred):
        pairs.append((gold, pred))
    for k, (g, p) in enumerate(pairs):
        if not g or not p:
            continue
        gp, pp = _parsed(g, inner_timeout), _parsed(p, inner_timeout)
        if gp and pp:
            # Both sides parsed: this comparison is authoritative (the raw pair is only a
            # fallback for when normalisation left something math-verify cannot read), except
            # that two equations are also compared as written: normalisation drops a "y =" head,
            # and "2x+4y-3=0" equals "y=-x/2+3/4" only as equations.
            if verify(list(gp), list(pp), timeout_seconds=inner_timeout):
                return True
            if _cut_short(g, gp) or _cut_short(p, pp):
                # math-verify dropped a tail it took for units ("c + 2ab" read as c + 2): read both
                # again in parentheses, where nothing is dropped (a mismatch may turn into a match
                # only when the whole expressions are equal)
                wg, wp = _parsed(f"({g})", inner_timeout), _parsed(f"({p})", inner_timeout)
                if wg and wp and verify(list(wg), list(wp), timeout_seconds=inner_timeout):
                    return True
            raw = pairs[-1]
            if k == 0 and len(pairs) == 2 and "=" in raw[0] and "=" in raw[1]:
                rg, rp = _parsed(raw[0], inner_timeout), _parsed(raw[1], inner_timeout)
                return bool(rg and rp and verify(list(rg), list(rp), timeout_seconds=inner_timeout))
            return False
    return False


def mv_equiv(pred: str, gold: str, inner_timeout: int) -> bool:
    """Multi-part answers part by part (as a set, or by label), else the whole pair."""
    gold_parts, pred_parts = split_parts(gold), split_parts(pred)
    if len(gold_parts) == 1 and len(pred_parts) > 1:
        # a list of candidates never matches a single answer, unless every part is that answer
        return all(mv_single(p, gold, inner_timeout) for p in pred_parts)
    if len(gold_parts) > 1 and len(pred_parts) > 1:
        return match_parts(pred_parts, gold_parts, lambda p, g: mv_single(p, g, inner_timeout)) is True
    return mv_single(pred, gold, inner_timeout)


# A few answers of the usual shapes, graded once in the zygote so that every worker forked from
# it starts with math-verify's parsers and sympy's caches warm (a cold process pays ~1 s).
WARMUP = [
    ("\\frac{1}{2}", "0.5"),
    ("2\\sqrt{3}", "\\sqrt{12}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
    ("[-2, 7]", "x \\in [-2,7]"),
    ("\\{1,2\\}", "1, 2"),
    ("x^2+2x+1", "(x+1)^2"),
    ("y = 2x - 3", "2x-3"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "(1,2)"),
    ("\\text{(C)}", "C"),
    ("3-4i", "3 - 4 i"),
    ("(0,9) \\cup (9,36)", "\\frac{1}{2}"),
    ("10\\%", "0.1"),
    ("\\infty", "-\\infty"),
    ("e^{i\\pi}", "-1"),
]
