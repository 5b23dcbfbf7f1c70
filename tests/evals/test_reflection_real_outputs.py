"""The long chain-of-thought text metrics on what a real model wrote: SmolLM2-135M-Instruct's
responses to GSM8K problems, sampled by `entropyrl eval` and shipped as a fixture
(``tests/fixtures/smollm2_gsm8k_responses.jsonl``, its README says how it was made). The embedded
model never writes a reflection word, so this is where the matcher, the repetition score and the
eval's ``reflection`` block meet real text: English with its punctuation, line breaks, LaTeX and
the phrases it repeats. Each figure is checked against a plain implementation written here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from entropyrl.evals.reflection import (
    WORD_LISTS,
    matcher_for,
    reflection_block,
    reflection_eval_metrics,
    repetition_score,
    response_facts,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2_gsm8k_responses.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
WORDS = WORD_LISTS["default"]


def plain_count(text: str, words=WORDS) -> int:
    """Reflection words as the docs define them: case-insensitive, whole words (no word character
    on either side), a space matching any whitespace run, longer phrases first, no overlaps."""
    alternatives = sorted(words, key=len, reverse=True)
    body = "|".join(r"\s+".join(map(re.escape, w.split())) for w in alternatives)
    return len(re.findall(rf"(?<!\w)(?:{body})(?!\w)", text, flags=re.IGNORECASE))


def plain_repetition(text: str, n: int = 4) -> float:
    words = text.lower().split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def test_the_fixture_is_real_model_text_with_reflection_words_in_it():
    assert len(ROWS) >= 32
    assert all(r["model"] == "SmolLM2-135M-Instruct" and r["response"].strip() for r in ROWS)
    reflecting = [r for r in ROWS if plain_count(r["response"]) > 0]
    assert len(reflecting) >= 2, "the fixture should hold responses that reflect"
    assert any(plain_repetition(r["response"]) > 0.05 for r in ROWS), "and some that repeat themselves"


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['problem']}-{r['sample']}" for r in ROWS])
def test_counts_spans_and_repetition_equal_the_plain_definitions(row):
    text = row["response"]
    matcher = matcher_for(WORDS)
    facts = response_facts([text], matcher, 4)
    assert int(facts.counts[0]) == plain_count(text) == matcher.count(text)
    spans = [tuple(s) for s in facts.spans.tolist()]
    assert spans == matcher.spans(text)
    for start, end in spans:  # each span is a listed word, standing alone
        assert " ".join(text[start:end].lower().split()) in WORDS
        assert (start == 0 or not text[start - 1].isalnum()) and (end == len(text) or not text[end].isalnum())
    assert facts.repetition[0] == pytest.approx(plain_repetition(text), abs=1e-12)
    assert repetition_score(text) == pytest.approx(plain_repetition(text), abs=1e-12)


def test_the_blocks_entropyrl_eval_wrote_agree_with_the_text():
    matcher = matcher_for(WORDS)
    for r in ROWS:
        block = r["reflection"]  # as `entropyrl eval` wrote it, with the model's token count
        assert block["count"] == plain_count(r["response"])
        assert block["density"] == pytest.approx(1000 * block["count"] / block["tokens"])
        again = reflection_block(r["response"], matcher, block["tokens"])
        assert again == block


def test_reflection_at_k_precision_and_recall_on_the_real_samples():
    by_problem: dict[str, list[tuple[bool, bool]]] = {}
    for r in ROWS:
        by_problem.setdefault(r["problem"], []).append((plain_count(r["response"]) > 0, bool(r["correct"])))
    got = reflection_eval_metrics(
        [[a for a, _ in v] for v in by_problem.values()], [[c for _, c in v] for v in by_problem.values()]
    )
    n = max(len(v) for v in by_problem.values())
    samples = [s for v in by_problem.values() for s in v]
    reflecting = [c for a, c in samples if a]
    assert got[f"reflection@{n}"] == pytest.approx(sum(any(a for a, _ in v) for v in by_problem.values()) / len(by_problem))
    assert got["reflection/frac"] == pytest.approx(len(reflecting) / len(samples))
    if reflecting:
        assert got["reflection/precision"] == pytest.approx(sum(reflecting) / len(reflecting))
