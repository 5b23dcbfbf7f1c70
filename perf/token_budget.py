"""Token-budget micro-batches (``trainer.micro_batch_tokens``) vs fixed-count padded micro-batches.

Setting: a random-init Qwen2 (hidden 256, 4 layers, vocabulary 1024; no download), float32, CPU,
one mini-batch of ``ROWS`` responses whose lengths are drawn like a long-CoT run: most short, a
Pareto tail capped at 16x the base length (``BASE`` tokens), each after a ``PROMPT``-token prompt.

- padded: ``MICRO_ROWS`` responses per pass, every pass padded to the widest row of the batch (the
  trainer's ``micro_batch_responses`` layout);
- token budget: the trainer's packing (``trainers/data/micro_batches.py``: longest first, each pass
  trimmed to its own width) with the same budget as one padded pass (``MICRO_ROWS x`` the batch
  width), so neither path holds more activations at once.

Both run the trainer's loss (``Algorithm.loss``, token-mean) forward + backward over every pass with
the accumulation weights of ``loss_agg``. Reported: the padded share of the positions each path
runs through the model, ``processed_tokens_ratio`` (padded path / token-budget path), the median
time per step over ``REPS`` interleaved repetitions and its ratio, and the largest gradient
difference between the two paths.

    .venv/bin/python perf/token_budget.py
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
import torch

ROWS, MICRO_ROWS, PROMPT, BASE, TAIL, REPS = 64, 8, 16, 24, 16, 3


def _lengths(seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    scale = np.minimum(1.0 + rng.pareto(1.5, ROWS), TAIL)  # most near 1x, a few up to 16x
    return torch.tensor(np.maximum(1, (BASE * scale).astype(int)))


def _setup():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from entropyrl.rollout.base import Rollout

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).float()
    lengths = _lengths()
    width = int(lengths.max())
    resp_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    resp_ids = torch.randint(1, 1024, (ROWS, width)) * resp_mask
    prompt_ids = torch.randint(1, 1024, (ROWS, PROMPT))
    roll = Rollout(
        prompt_ids, torch.ones_like(prompt_ids), resp_ids, resp_mask, [""] * ROWS, torch.zeros(ROWS, dtype=torch.bool), None
    )
    return model, roll


def _step(model, roll, passes, trimmed: bool, old_logp, advantages, mask) -> float:
    from entropyrl.trainers.algos.algorithm import Algorithm
    from entropyrl.trainers.algos.core_algos import part_weight
    from entropyrl.trainers.data.micro_batches import trim
    from entropyrl.trainers.stats.policy_stats import response_token_stats

    algo = Algorithm(max_response_length=roll.response_ids.shape[1])
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    for rows in passes:
        part = roll.select(rows)
        part, w = trim(part) if trimmed else (part, part.response_ids.shape[1])
        logp, ent = response_token_stats(model, part, temperature=1.0, chunk_size=4096)
        out = algo.loss(logp=logp, old_logp=old_logp[rows, :w], entropy=ent, advantages=advantages[rows, :w], mask=mask[rows, :w])
        (out.loss * part_weight("token-mean", mask[rows], mask)).backward()
    return time.perf_counter() - started


def run() -> dict:
    from entropyrl.trainers.data.micro_batches import by_count, by_tokens, padded_tokens
    from entropyrl.trainers.stats.policy_stats import batch_token_stats

    torch.set_num_threads(1)
    model, roll = _setup()
    mask = roll.response_mask.float()
    old_logp, _ = batch_token_stats(model, roll, MICRO_ROWS, temperature=1.0, chunk_size=4096)
    advantages = torch.randn(ROWS, 1).expand_as(mask) * mask
    width = PROMPT + roll.response_ids.shape[1]
    padded = by_count(ROWS, MICRO_ROWS)
    budget = MICRO_ROWS * width
    packed = by_tokens(roll.prompt_mask.sum(1), roll.response_mask.sum(1), budget)
    real = int(roll.prompt_mask.sum() + roll.response_mask.sum())
    processed = {"padded": padded_tokens(roll, padded, trimmed=False), "token_budget": padded_tokens(roll, packed, trimmed=True)}

    times: dict[str, list[float]] = {"padded": [], "token_budget": []}
    grads = {}
    for rep in range(REPS):
        order = ("padded", "token_budget") if rep % 2 == 0 else ("token_budget", "padded")
        for mode in order:
            passes, trimmed = (padded, False) if mode == "padded" else (packed, True)
            times[mode].append(_step(model, roll, passes, trimmed, old_logp, advantages, mask))
            grads[mode] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    grad_diff = max(float((grads["padded"][n] - grads["token_budget"][n]).abs().max()) for n in grads["padded"])
    grad_scale = max(float(g.abs().max()) for g in grads["padded"].values())
    step = {m: statistics.median(v) for m, v in times.items()}
    return {
        "rows": ROWS,
        "lengths": {
            "min": int(roll.response_mask.sum(1).min()),
            "median": int(roll.response_mask.sum(1).median()),
            "max": int(roll.response_mask.sum(1).max()),
        },
        "budget_tokens": budget,
        "passes": {"padded": len(padded), "token_budget": len(packed)},
        "padded_share": {m: round(1 - real / v, 4) for m, v in processed.items()},
        "processed_tokens": processed,
        "processed_tokens_ratio": round(processed["padded"] / processed["token_budget"], 3),
        "step_seconds": {m: round(v, 4) for m, v in step.items()},
        "step_time_ratio": round(step["token_budget"] / step["padded"], 3),
        "max_grad_diff": grad_diff,
        "max_grad": grad_scale,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
