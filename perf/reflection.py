"""Cost of the long chain-of-thought metrics (``docs/long-cot.md``) at their default settings, per
1,000 responses of 4,096 tokens: what the text-metrics worker does beside the reward, what the
trainer itself pays, and that against the same batch's grading time.

Responses: MATH-500 reference solutions chained (each followed by a reflection sentence, "Wait,
let me recheck ...", so every response holds matches and no row is skipped: the worst case for
the token mapping), cut at 4,096 BPE-like pieces (a word with its leading space, a space, a
punctuation mark), which stand for the model's tokens; the pieces form the vocabulary, so a token's
text is one list lookup, as after the trainer's per-id cache is warm.

Beside the reward (``rewards/text_facts.py``, ``diagnostics.reflection.workers`` processes):

- ``pool_cpu_seconds``: ``response_facts`` (each response's reflection spans, 4-gram repetition
  score, length) run in this process: the CPU time the workers spend on the batch;
- ``pool_wall_seconds``: the same batch through a started ``TextFactsPool`` (hand over, wait for
  the answer), with nothing else running.

In the trainer's process:

- ``handoff_seconds``: what ``RewardRunner.score`` adds around the grader when the facts are
  found beside it: handing the texts to the workers, plus any wait for their answer once the
  grader is done (the grader's second pass over these responses, quicker than the first: its
  workers keep the answers they parsed, so the wait is not understated);
- ``aggregate_seconds``: ``text_metrics`` (counts, density, shares by verdict, repetition, lengths
  by verdict) from the facts, as ``trainers/collect.py`` runs it;
- ``mapping_seconds``: ``reflection_token_masks`` from the facts' spans (no matching);
- ``entropy_means_seconds``: ``reflection_entropy_metrics`` on ``[1000, 4096]`` entropies, log-probs
  and token-level advantages, here on the CPU (in a run they are on the training device);
- ``trainer_seconds``: the last three added.

The denominator:

- ``grading_seconds``: the math grader (``grade_batch``, its worker pool started beforehand) on the
  same responses against their gold answers, alone, the first time it sees them (as each step's
  responses are new): the part of a step's scoring measured here. A step's scoring also holds the
  sampling policy's forward pass over the batch's tokens (the old log-probs and entropies), which
  is not run here, so a step's real share is smaller;
- ``share_of_scoring``: ``(handoff + trainer) / grading``: what the metrics add to the scoring as
  the trainer waits for it. The workers' CPU time is not in it: they run in their own processes
  while the grader runs; ``pool_cpu_share`` (``pool_cpu / grading``) is what they ask of a machine
  with no idle core.

Best of ``REPEATS`` runs each, the grader's runs once. The trainer's parts run on one torch thread:
they are the CPU work itself, not what a thread pool sharing busy cores makes of it.

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


def _best(fn, repeats: int = REPEATS, clock=time.perf_counter) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = clock()
        out = fn()
        best = min(best, clock() - t0)
    return best, out


def run() -> dict:
    import torch

    from entropyrl.conf import compose
    from entropyrl.evals.grading.grader import grade_batch
    from entropyrl.evals.reflection import TokenPieces, response_facts, text_metrics
    from entropyrl.rewards.text_facts import TextFactsPool
    from entropyrl.trainers.stats.reflection import reflection_entropy_metrics, reflection_settings, reflection_token_masks

    pieces, golds = _responses()
    texts = ["".join(p) for p in pieces]
    vocab: dict[str, int] = {}
    ids = torch.tensor([[vocab.setdefault(t, len(vocab)) for t in p] for p in pieces])
    pieces_of = TokenPieces(list(vocab).__getitem__)
    settings = reflection_settings(compose("train", []))  # the defaults
    spec, matcher = settings.text_facts, settings.matcher
    mask = torch.ones(ids.shape)
    lengths, correct = [TOKENS] * RESPONSES, [float(i % 2) for i in range(RESPONSES)]
    gen = torch.Generator().manual_seed(0)
    entropy = torch.rand(ids.shape, generator=gen) * 2
    logp = -torch.rand(ids.shape, generator=gen) * 3
    advantages = torch.randn(RESPONSES, 1, generator=gen) * mask  # token-level, as GRPOTrainer._score has them

    # beside the reward
    pool_cpu_s, facts = _best(lambda: response_facts(texts, matcher, spec.repetition_n), clock=time.process_time)
    pool = TextFactsPool(spec.workers)
    try:
        pool.submit(texts[:8], spec).result()  # started and warm, as after a run's first step
        pool_wall_s, _ = _best(lambda: pool.submit(texts, spec).result())
        grade_batch(texts[:8], golds[:8])  # the grader's pool starts before the timed batch, as in a run
        grading_s, _ = _best(lambda: grade_batch(texts, golds), repeats=1)
        t0 = time.perf_counter()
        pending = pool.submit(texts, spec)
        t1 = time.perf_counter()
        grade_batch(texts, golds)
        t2 = time.perf_counter()
        pending.result()
        t3 = time.perf_counter()
    finally:
        pool.close()
    handoff_s = (t1 - t0) + (t3 - t2)

    # in the trainer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        aggregate_s, text_out = _best(lambda: text_metrics(facts, lengths, correct, reflection=True))
        mapping_s, (at, before, first) = _best(lambda: reflection_token_masks(ids, mask, pieces_of, matcher, facts=facts))
        means_s, token_out = _best(lambda: reflection_entropy_metrics(entropy, logp, mask, at, before, advantages, first=first))
    finally:
        torch.set_num_threads(threads)
    trainer_s = aggregate_s + mapping_s + means_s
    return {
        "responses": RESPONSES,
        "tokens_per_response": TOKENS,
        "chars_per_response": round(sum(map(len, texts)) / RESPONSES),
        "reflection_words_per_1k_tokens": round(text_out["reflection/density"], 2),
        "pool_workers": spec.workers,
        "pool_cpu_seconds": round(pool_cpu_s, 4),
        "pool_wall_seconds": round(pool_wall_s, 4),
        "handoff_seconds": round(handoff_s, 4),
        "aggregate_seconds": round(aggregate_s, 4),
        "mapping_seconds": round(mapping_s, 4),
        "entropy_means_seconds": round(means_s, 4),
        "trainer_seconds": round(trainer_s, 4),
        "grading_seconds": round(grading_s, 4),
        "share_of_scoring": round((handoff_s + trainer_s) / grading_s, 4),
        "pool_cpu_share": round(pool_cpu_s / grading_s, 4),
        "reflection_token_frac": round(token_out["reflection/token_frac"], 4),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
