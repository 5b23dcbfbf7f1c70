"""Cost of the long chain-of-thought metrics (``docs/long-cot.md``) at their default settings, per
1,000 responses of 4,096 tokens, and their share of the same batch's scoring time.

Responses: MATH-500 reference solutions chained (each followed by a reflection sentence, "Wait,
let me recheck ...", so every response holds matches and no row is skipped: the worst case for
the token mapping), cut at 4,096 BPE-like pieces (a word with its leading space, a space, a
punctuation mark), which stand for the model's tokens; the pieces form the vocabulary, so a token's
text is one list lookup, as after the trainer's per-id cache is warm.

- ``text_seconds``: ``response_text_metrics`` (reflection counts, density, shares by verdict,
  the 4-gram repetition score, lengths by verdict), as ``trainers/collect.py`` runs it per step;
- ``token_seconds``: ``reflection_token_masks`` + ``reflection_entropy_metrics`` on ``[1000, 4096]``
  entropies and log-probs, as ``GRPOTrainer._score`` runs it;
- ``grading_seconds``: the math grader (``grade_batch``, its worker pool started beforehand) on the
  same responses against their gold answers: the reward the step computes anyway;
- ``share_of_scoring``: ``(text + token) / grading``. Best of ``REPEATS`` runs each.

    python perf/reflection.py          # or make bench
"""

from __future__ import annotations

import json
import re
import time

RESPONSES = 1000
TOKENS = 4096
REPEATS = 3
REFLECT = " Wait, let me recheck the previous step. However, the result holds; let me try again to be sure."


def _responses() -> tuple[list[list[str]], list[str]]:
    from entropyrl.evals.benchmarks import PACKAGED_DATA

    rows = [json.loads(line) for line in (PACKAGED_DATA / "math500" / "test.jsonl").read_text().splitlines() if line.strip()]
    pieces_of = [re.findall(r" ?\w+| |\n|[^\w\s]", r["solution"] + REFLECT) for r in rows]
    responses, golds = [], []
    for i in range(RESPONSES):
        pieces, j = [], i
        while len(pieces) < TOKENS:
            pieces += pieces_of[j % len(rows)]
            j += 1
        responses.append(pieces[:TOKENS])
        golds.append(str(rows[(j - 1) % len(rows)]["answer"]))
    return responses, golds


def _best(fn, repeats: int = REPEATS) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run() -> dict:
    import torch

    from entropyrl.evals.grading.grader import grade_batch
    from entropyrl.evals.reflection import WORD_LISTS, TokenPieces, matcher_for, response_text_metrics
    from entropyrl.trainers.stats.reflection import reflection_entropy_metrics, reflection_token_masks

    pieces, golds = _responses()
    texts = ["".join(p) for p in pieces]
    vocab: dict[str, int] = {}
    ids = torch.tensor([[vocab.setdefault(t, len(vocab)) for t in p] for p in pieces])
    pieces_of = TokenPieces(list(vocab).__getitem__)
    matcher = matcher_for(WORD_LISTS["default"])
    mask = torch.ones(ids.shape)
    lengths, correct = [TOKENS] * RESPONSES, [float(i % 2) for i in range(RESPONSES)]
    gen = torch.Generator().manual_seed(0)
    entropy = torch.rand(ids.shape, generator=gen) * 2
    logp = -torch.rand(ids.shape, generator=gen) * 3
    adv = torch.randn(RESPONSES, generator=gen)

    text_s, text_out = _best(lambda: response_text_metrics(texts, lengths, correct, matcher, 4))

    def tokens():
        at, before = reflection_token_masks(ids, mask, pieces_of, matcher)
        return reflection_entropy_metrics(entropy, logp, mask, at, before, adv)

    token_s, token_out = _best(tokens)
    grade_batch(texts[:8], golds[:8])  # the pool starts before the timed batch, as in a run
    grading_s, _ = _best(lambda: grade_batch(texts, golds), repeats=1)
    return {
        "responses": RESPONSES,
        "tokens_per_response": TOKENS,
        "chars_per_response": round(sum(map(len, texts)) / RESPONSES),
        "reflection_words_per_1k_tokens": round(text_out["reflection/density"], 2),
        "text_seconds": round(text_s, 4),
        "token_seconds": round(token_s, 4),
        "reflection_seconds_per_1000_responses": round(text_s + token_s, 4),
        "grading_seconds": round(grading_s, 4),
        "share_of_scoring": round((text_s + token_s) / grading_s, 4),
        "reflection_token_frac": round(token_out["reflection/token_frac"], 4),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
