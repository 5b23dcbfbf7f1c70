"""Evaluation's side of the rollout engines (``entropyrl.rollout``): texts per prompt, checked settings.

    sample_texts(engine, prompts, n=4, temperature=1.0, top_p=1.0, max_new_tokens=1024, seed=0)
    -> one list of ``n`` responses per prompt

Any ``rollout.RolloutEngine`` (``eval.backend=hf|vllm|<registered>``) samples; this module only
checks the ``eval.*`` values first (one-line errors) and groups the engine's decoded texts.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..core.errors import UserError
from ..rollout.base import RolloutEngine

__all__ = ["sample_texts"]


def _check_args(n: int, temperature: float, top_p: float, max_new_tokens: int) -> None:
    if int(n) < 1:
        raise UserError(f"eval.n_samples must be >= 1, got {n}")
    if float(temperature) < 0:
        raise UserError(f"eval.temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < float(top_p) <= 1:
        raise UserError(f"eval.top_p must be in (0, 1], got {top_p}")
    if int(max_new_tokens) < 1:
        raise UserError(f"eval.max_new_tokens must be >= 1, got {max_new_tokens}")


def sample_texts(
    engine: RolloutEngine,
    prompts: Sequence[str],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
    traces: list | None = None,
) -> list[list[str]]:
    """``n`` decoded responses for each prompt (``temperature`` 0 = greedy); same seed, same texts.
    ``traces``: a list that gets the rollout's ``ToolTrace`` (None without tools) appended."""
    _check_args(n, temperature, top_p, max_new_tokens)
    roll = engine.generate(
        list(prompts),
        n=int(n),
        seed=int(seed),
        temperature=float(temperature),
        top_p=float(top_p),
        max_new_tokens=int(max_new_tokens),
        progress=progress,
    )
    if traces is not None:
        traces.append(roll.tools)
    return roll.grouped_texts(int(n))
