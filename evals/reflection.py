"""Text metrics of long chain-of-thought responses: reflection words, n-gram repetition, and where
the reflection words sit among a response's tokens. Pure functions of strings (and of the decoded
token pieces for the token positions); no torch, no I/O. Definitions: ``docs/long-cot.md``.

- A *reflection word* is a match of the configured word/phrase list: case-insensitive, on word
  boundaries (``wait`` matches ``Wait,`` and ``wait.`` but not ``await`` or ``waiting``), a space in
  a phrase matching any run of whitespace. ``count`` is the number of non-overlapping matches
  (longer phrases first); ``density`` is ``1000 * count / tokens``.
- The built-in lists (``WORD_LISTS``): ``orz`` (Open-Reasoner-Zero's reflection patterns, without the
  trailing comma or whitespace its patterns require), ``oat_zero`` (oat-zero's self-reflection
  keywords, one list for every base model family it evaluates), ``default`` (both). An empty list
  turns the reflection metrics off.
- ``repetition_score``: the share of a response's word n-grams that repeat an earlier one,
  ``1 - distinct / total`` (0 when it has fewer than ``n`` words).
- ``response_facts``: what the step's metrics need of each response (its length, repetition score,
  reflection spans), found once where its reward is computed (``rewards/text_facts.py``);
  ``text_metrics`` adds them up over a step, and the trainer maps the spans onto tokens.
"""

# size: every text metric of a response, pure functions over strings and token pieces, defined together as docs/long-cot.md defines them
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Callable, Sequence

import numpy as np

from ..core.errors import UserError

__all__ = [
    "WORD_LISTS",
    "ReflectionMatcher",
    "matcher_for",
    "resolve_words",
    "density",
    "repetition_score",
    "ResponseFacts",
    "response_facts",
    "reflection_block",
    "response_text_metrics",
    "text_metrics",
    "token_offsets",
    "reflection_token_positions",
    "span_tokens",
    "TokenPieces",
    "reflection_eval_metrics",
]

ORZ_WORDS = ("wait", "recheck", "retry", "alternatively", "however")
OAT_ZERO_WORDS = (
    "recheck",
    "rethink",
    "reevaluate",
    "re-evaluate",
    "reevaluation",
    "re-examine",
    "reexamine",
    "try again",
    "check again",
    "think again",
    "go over the steps",
)
WORD_LISTS: dict[str, tuple[str, ...]] = {
    "default": tuple(dict.fromkeys(ORZ_WORDS + OAT_ZERO_WORDS)),
    "orz": ORZ_WORDS,
    "oat_zero": OAT_ZERO_WORDS,
}


def resolve_words(words, option: str = "diagnostics.reflection.words") -> tuple[str, ...]:
    """The word list a setting names: a built-in list's name (``WORD_LISTS``), a list of words and
    phrases, or an empty list / null (reflection metrics off)."""
    if words is None:
        return ()
    if isinstance(words, str):
        if words not in WORD_LISTS:
            raise UserError(
                f"{option}={words!r} is not a word list: use one of {', '.join(WORD_LISTS)}, "
                f"a list of words ({option}=[wait,recheck]) or [] to turn reflection metrics off"
            )
        return WORD_LISTS[words]
    if isinstance(words, (int, float)) and not isinstance(words, bool):
        words = [words]
    out = []
    for w in words:
        if isinstance(w, (int, float)) and not isinstance(w, bool):  # a command line's [42] arrives as a number
            w = str(w)
        if not isinstance(w, str) or not w.strip():
            raise UserError(f"{option}: {w!r} is not a word or phrase: give non-empty strings, e.g. [wait,'try again']")
        out.append(w.strip())
    return tuple(dict.fromkeys(out))


def _pattern(word: str) -> str:
    body = r"\s+".join(re.escape(part) for part in word.split())
    head = r"\b" if re.match(r"\w", word[0]) else ""  # next to a word character: a word boundary
    tail = r"\b" if re.match(r"\w", word[-1]) else ""
    return head + body + tail


def _needles(heads: Sequence[str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The strings to look for so that every place a word can start is found: each ``head`` (a
    word's first part) that holds no other head, with the offsets at which it sits inside the heads
    it stands for (``check`` finds ``recheck`` two characters earlier)."""
    heads = sorted(set(heads))
    minimal = [h for h in heads if not any(g != h and g in h for g in heads)]
    out = []
    for needle in minimal:
        offsets = {m.start() for h in heads for m in re.finditer(f"(?={re.escape(needle)})", h)}
        out.append((needle, tuple(sorted(offsets))))
    return tuple(out)


class ReflectionMatcher:
    """Finds the reflection words of ``words`` in a text (case-insensitive, on word boundaries).

    Matching runs on the lower-cased text with a lower-cased pattern. The pattern is tried only
    where a word's first part occurs (``str.find``, in C), anchored there (``regex.match(low, pos)``,
    which sees the character before ``pos`` for its word boundary), in order of position and
    skipping what a match already covers: the leftmost, non-overlapping, longest-first matches of
    ``regex.finditer``, without trying the pattern at every position. A text whose lower-casing
    changes its length (a few Unicode letters) is matched case-insensitively instead, so spans
    always index the text as given."""

    def __init__(self, words: Sequence[str]):
        self.words = tuple(words)
        ordered = sorted(self.words, key=len, reverse=True)  # "try again" before "try"
        alternation = "|".join(_pattern(w.lower()) for w in ordered)
        if ordered:  # a look-ahead on the first letters lets the regex engine skip other positions fast
            firsts = "".join(sorted({re.escape(w[0].lower()) for w in ordered}))
            alternation = f"(?=[{firsts}])(?:{alternation})"
        self.regex = re.compile(alternation) if ordered else None
        self._any_case = re.compile(alternation, re.IGNORECASE) if ordered else None
        self._needles = _needles([w.lower().split()[0] for w in ordered])

    @property
    def enabled(self) -> bool:
        return self.regex is not None

    def spans_lower(self, text: str, low: str) -> list[tuple[int, int]]:
        """``spans(text)`` given ``low = text.lower()`` (a caller that needs it too computes it once)."""
        if self.regex is None:
            return []
        if len(low) != len(text):
            return [m.span() for m in self._any_case.finditer(text)]
        starts = set()
        for needle, offsets in self._needles:
            at = low.find(needle)
            while at >= 0:
                starts.update(at - o for o in offsets)
                at = low.find(needle, at + 1)
        out, end, match = [], 0, self.regex.match
        for at in sorted(starts):
            if at >= end and (m := match(low, at)) is not None:
                out.append(m.span())
                end = m.end()
        return out

    def spans(self, text: str) -> list[tuple[int, int]]:
        """``[(start, end)]`` character spans of the matches, in order, non-overlapping."""
        return self.spans_lower(text, text.lower()) if self.regex is not None else []

    def count(self, text: str) -> int:
        return len(self.spans(text))


@lru_cache(maxsize=16)
def matcher_for(words: tuple[str, ...]) -> ReflectionMatcher:
    """One compiled matcher per word list (a training run asks for it every step)."""
    return ReflectionMatcher(words)


def density(count: int, tokens: int) -> float:
    """Reflection words per 1,000 tokens (0 for an empty response)."""
    return 1000.0 * count / tokens if tokens > 0 else 0.0


_NGRAM_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it mod 2**64 loses nothing


def repetition_score(text: str, n: int = 4) -> float:
    """``1 - distinct / total`` over the word n-grams of ``text`` (lower-cased, split on whitespace):
    0 when no n-gram repeats, approaching 1 for a response looping on one phrase; 0 with fewer
    than ``n`` words.

    The n-grams are compared by a 64-bit hash (each word's ``hash``, combined in order by
    multiplication with an odd constant mod 2**64) and counted distinct in one sort, with no tuple
    of words built: two different n-grams count as one only if their hashes collide, a chance of
    about ``total**2 / 2**65`` (under 10**-11 for a response of 10,000 words)."""
    return _repetition_lower(text.lower(), n)


def _repetition_lower(low: str, n: int) -> float:
    words = low.split()
    total = len(words) - n + 1
    if total <= 0:
        return 0.0
    h = np.fromiter(map(hash, words), dtype=np.int64, count=len(words)).view(np.uint64)
    grams = h[:total].copy()
    for i in range(1, n):  # Horner: ((h_0 * M + h_1) * M + h_2) ...
        grams *= _NGRAM_MIX
        grams += h[i : i + total]
    grams.sort()
    distinct = 1 + int(np.count_nonzero(grams[1:] != grams[:-1]))
    return 1.0 - distinct / total


@dataclass(frozen=True)
class ResponseFacts:
    """What the text metrics need of each response of a batch, found once per response where its
    reward is computed, row-aligned with the batch:

    ``chars [N]``: the length of the text the spans index (the token mapping uses the spans only
    where the response's token pieces add up to it); ``repetition [N]``: ``repetition_score``;
    ``counts [N]``: reflection matches; ``spans [sum(counts), 2]``: their ``(start, end)`` character
    spans, row after row (``row_spans``)."""

    chars: np.ndarray
    repetition: np.ndarray
    counts: np.ndarray
    spans: np.ndarray

    def __len__(self) -> int:
        return len(self.chars)

    @property
    def span_rows(self) -> np.ndarray:
        """``[sum(counts)]``: the row of each span."""
        return np.repeat(np.arange(len(self.counts)), self.counts)

    def row_spans(self, row: int) -> list[tuple[int, int]]:
        first = int(self.counts[:row].sum())
        return [(int(a), int(b)) for a, b in self.spans[first : first + int(self.counts[row])]]

    def select(self, rows: Sequence[int]) -> ResponseFacts:
        """The facts of ``rows`` (in that order; a row may repeat)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        firsts = np.concatenate([[0], np.cumsum(self.counts)])[:-1]
        counts = self.counts[rows]
        span_index = np.repeat(firsts[rows] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        return ResponseFacts(self.chars[rows], self.repetition[rows], counts, self.spans[span_index].reshape(-1, 2))

    @staticmethod
    def concat(parts: Sequence[ResponseFacts]) -> ResponseFacts:
        if not parts:
            return response_facts([], ReflectionMatcher(()))
        return ResponseFacts(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("chars", "repetition", "counts", "spans"))
        )


def response_facts(texts: Sequence[str], matcher: ReflectionMatcher, n: int = 4) -> ResponseFacts:
    """Each response's length, repetition score and reflection spans (``ResponseFacts``): all the
    per-response text work of the step's metrics, one lower-casing per response."""
    chars, repetition, counts, spans = [], [], [], []
    for text in texts:
        low = text.lower()
        found = matcher.spans_lower(text, low)
        chars.append(len(text))
        repetition.append(_repetition_lower(low, n))
        counts.append(len(found))
        spans += found
    return ResponseFacts(
        np.array(chars, dtype=np.int64),
        np.array(repetition, dtype=np.float64),
        np.array(counts, dtype=np.int64),
        np.array(spans, dtype=np.int64).reshape(-1, 2),
    )


def reflection_block(text: str, matcher: ReflectionMatcher, tokens: int | None = None) -> dict:
    """The ``reflection`` block of one graded or sampled response: ``count``, ``density`` per 1k
    ``tokens`` (model tokens when the caller has a tokenizer, else whitespace-separated words, as
    ``unit`` says), and ``tokens``."""
    unit = "tokens" if tokens is not None else "words"
    size = int(tokens) if tokens is not None else len(text.split())
    count = matcher.count(text)
    return {"count": count, "density": density(count, size), "tokens": size, "unit": unit}


def response_text_metrics(
    texts: Sequence[str], lengths: Sequence[int], correct: Sequence[float], matcher: ReflectionMatcher, n: int = 4
) -> dict[str, float]:
    """A training step's text metrics over its responses (``lengths`` in tokens, ``correct`` the
    verifier's verdict, > 0.5 counting as correct): ``text_metrics`` of their ``response_facts``."""
    return text_metrics(response_facts(texts, matcher, n), lengths, correct, reflection=matcher.enabled)


def text_metrics(facts: ResponseFacts, lengths: Sequence[int], correct: Sequence[float], reflection: bool) -> dict[str, float]:
    """A training step's text metrics from its responses' ``facts`` (``lengths`` in tokens,
    ``correct`` the verifier's verdict, > 0.5 counting as correct). In a tool run the facts are
    those of the policy's own text and ``lengths`` its own tokens, the tool's outputs left out
    (``trainers/collect.py``):

    ``response_length/correct/mean`` and ``/incorrect/mean`` (left out when no response is one),
    ``repetition/score/mean``; with ``reflection`` (a word list is set) also ``reflection/count/mean``,
    ``reflection/density`` (``1000 * sum(count) / sum(tokens)``), ``reflection/frac`` (share of
    responses with a match) and ``reflection/frac/correct``, ``/incorrect`` (the same share among
    those responses)."""
    out: dict[str, float] = {}
    if not len(facts):
        return out
    right = [float(c) > 0.5 for c in correct]
    for name, pick in (("correct", True), ("incorrect", False)):
        chosen = [int(L) for L, r in zip(lengths, right) if r == pick]
        if chosen:
            out[f"response_length/{name}/mean"] = sum(chosen) / len(chosen)
    out["repetition/score/mean"] = sum(facts.repetition.tolist()) / len(facts)
    if not reflection:
        return out
    counts = facts.counts.tolist()
    out["reflection/count/mean"] = sum(counts) / len(counts)
    out["reflection/density"] = density(sum(counts), sum(int(L) for L in lengths))
    out["reflection/frac"] = sum(c > 0 for c in counts) / len(counts)
    for name, pick in (("correct", True), ("incorrect", False)):
        chosen = [c > 0 for c, r in zip(counts, right) if r == pick]
        if chosen:
            out[f"reflection/frac/{name}"] = sum(chosen) / len(chosen)
    return out


def token_offsets(pieces: Sequence[str]) -> list[int]:
    """Character offset of each token's start in ``"".join(pieces)``, then the text's end
    (``len(pieces) + 1`` offsets)."""
    out, at = [0], 0
    for p in pieces:
        at += len(p)
        out.append(at)
    return out


def reflection_token_positions(pieces: Sequence[str], matcher: ReflectionMatcher) -> tuple[list[int], list[int]]:
    """``(at, first)`` token positions of the reflection words in a response given as its decoded
    token pieces: ``at`` every token whose characters overlap a match, ``first`` the first token of
    each match (the token just before it is ``first - 1``). Matching runs on ``"".join(pieces)``,
    so positions line up with the tokens whatever the tokenizer merged."""
    spans = matcher.spans("".join(pieces))
    if not spans:
        return [], []
    return span_tokens(list(accumulate(map(len, pieces))), spans)


def span_tokens(ends: Sequence[int], spans: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """``(at, first)`` as ``reflection_token_positions``, from the character spans and each token's
    end offset (``ends[k]``: token ``k`` covers characters ``[ends[k-1], ends[k])``)."""
    ends = np.asarray(ends)
    starts = np.fromiter((a for a, _ in spans), dtype=np.int64, count=len(spans))
    stops = np.fromiter((b for _, b in spans), dtype=np.int64, count=len(spans))
    lo = np.searchsorted(ends, starts, side="right")  # first token ending after the start
    hi = np.minimum(np.searchsorted(ends, stops, side="left"), len(ends) - 1)  # last token starting before the end
    width = hi - lo + 1
    covered = np.repeat(lo, width) + np.arange(int(width.sum())) - np.repeat(np.cumsum(width) - width, width)
    return np.unique(covered).tolist(), lo.tolist()


class TokenPieces:
    """Token ids -> the text each token adds to a response, cached per id (``decode_one(id)`` is
    called once per distinct id). ``for_tokenizer``: a Hugging Face tokenizer's ``decode`` of the
    id alone, special tokens dropped; a SentencePiece word-start token (``▁word``) keeps its leading
    space, which ``decode`` of one token drops."""

    def __init__(self, decode_one: Callable[[int], str]):
        self.decode_one = decode_one
        self.cache: dict[int, str] = {}
        self._text: np.ndarray | None = None
        self._length: np.ndarray | None = None

    @classmethod
    def for_tokenizer(cls, tokenizer) -> TokenPieces:
        def decode_one(token_id: int) -> str:
            piece = tokenizer.decode([token_id], skip_special_tokens=True)
            raw = tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(raw, str) and raw.startswith("\u2581") and piece and not piece.startswith(" "):
                piece = " " + piece
            return piece

        return cls(decode_one)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        for i in set(ids).difference(self.cache):
            self.cache[i] = self.decode_one(i)
        return list(map(self.cache.__getitem__, ids))

    def tables(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(text, length)`` arrays indexed by token id, holding at least every id in ``ids``: a
        batch's texts and offsets by array indexing rather than a lookup per token."""
        new = [i for i in np.flatnonzero(np.bincount(np.asarray(ids).ravel())).tolist() if i not in self.cache]
        for i in new:
            self.cache[i] = self.decode_one(i)
        if new or self._text is None:
            size = max(self.cache) + 1 if self.cache else 0
            self._text = np.full(size, "", dtype=object)
            self._text[list(self.cache)] = list(self.cache.values())
            self._length = np.array([len(t) for t in self._text], dtype=np.int64)
        return self._text, self._length


@dataclass
class _Counts:
    both: int = 0
    reflect: int = 0
    correct: int = 0


def reflection_eval_metrics(reflects: Sequence[Sequence[bool]], correct: Sequence[Sequence[bool]]) -> dict[str, float]:
    """Evaluation-time reflection figures over problems (one list of samples each):

    - ``reflection@n``: share of problems with at least one reflecting sample among its ``n``;
    - ``reflection/frac``: share of all samples that reflect;
    - ``reflection/precision``: share of reflecting samples that are correct (nan when none reflects);
    - ``reflection/recall``: share of correct samples that reflect (nan when none is correct)."""
    c = _Counts()
    samples = anyref = 0
    for refl, corr in zip(reflects, correct):
        anyref += any(refl)
        for r, k in zip(refl, corr):
            samples += 1
            c.reflect += bool(r)
            c.correct += bool(k)
            c.both += bool(r) and bool(k)
    n = max((len(r) for r in reflects), default=0)
    nan = float("nan")
    return {
        f"reflection@{n}": anyref / len(reflects) if reflects else nan,
        "reflection/frac": c.reflect / samples if samples else nan,
        "reflection/precision": c.both / c.reflect if c.reflect else nan,
        "reflection/recall": c.both / c.correct if c.correct else nan,
    }
