"""Sampled validation: pass@1 and pass@k on the built-in task's held-out prompts.

Entropy collapse shows as pass@k narrowing while pass@1 rises: the policy concentrates on fewer
solution paths. ``k`` responses per prompt at the rollout temperature; pass@1 is the mean share of
correct samples and pass@k the unbiased estimator (``evals.metrics.pass_at_k``, n = k).

    entropyrl train data=countdown val.pass_k=8
"""

from __future__ import annotations

import numpy as np

from ...core.seeds import PASS_SEED
from ...evals.metrics import pass_at_k

__all__ = ["sampled_pass_metrics", "pass_metrics_from_scores"]


def pass_metrics_from_scores(scores: list[float], k: int) -> dict[str, float]:
    """``{"val/pass@1", "val/pass@k"}`` from ``len(problems) * k`` 0/1 scores, grouped by prompt."""
    if k < 1 or len(scores) % k:
        raise ValueError(f"need a multiple of k={k} scores, got {len(scores)}")
    counts = [int(sum(s > 0 for s in scores[i : i + k])) for i in range(0, len(scores), k)]
    return {
        "val/pass@1": float(np.mean([pass_at_k(k, c, 1) for c in counts])),
        f"val/pass@{k}": float(np.mean([pass_at_k(k, c, k) for c in counts])),
    }


def sampled_pass_metrics(rollout_engine, source, problems: list, k: int) -> dict[str, float]:
    """Sample ``k`` responses per problem (rollout temperature), grade them, pass@1 and pass@k."""
    roll = rollout_engine.generate([source.prompt(p) for p in problems], n=k, seed=PASS_SEED)
    scores = [source.reward(problems[i // k], text) for i, text in enumerate(roll.texts)]
    return pass_metrics_from_scores(scores, k)
