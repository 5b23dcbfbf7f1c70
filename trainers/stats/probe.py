"""The realised entropy change of an update, measured on a fixed held-out probe batch.

Measuring the change on the batch just trained on overstates it (about 2x on the lab task: the
update lowers exactly those tokens' entropy). The probe is a batch of responses to held-out
prompts, sampled once, then re-scored (teacher-forced, no sampling) before and after every update:
``entropy_change/realized = H_probe(after) - H_probe(before)``, the same prompts and responses
every step, so the change is the update's effect and nothing else.

    entropyrl train diagnostics.entropy_change=true diagnostics.probe_prompts=32
"""

from __future__ import annotations

from typing import Callable

import torch

from ...core.seeds import PROBE_SEED

__all__ = ["ProbeBatch", "build_probe", "probe_entropy"]


def probe_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> float:
    """Token-mean entropy over the valid tokens (``[B, T]`` each); nan when there are none."""
    m = mask.bool()
    n = int(m.sum())
    return float(torch.where(m, entropy, torch.zeros_like(entropy)).sum() / n) if n else float("nan")


class ProbeBatch:
    """Held-out responses re-scored around each update.

    ``stats(model, rollout) -> (logp [B, R], entropy [B, R])`` scores a rollout (no grad). The
    responses are sampled lazily at the first ``before_update`` from the policy of that moment.
    """

    def __init__(self, problems: list, prompt_fn: Callable, rollout_engine, stats: Callable, n: int):
        self.problems, self.prompt_fn, self.engine, self.stats, self.n = problems, prompt_fn, rollout_engine, stats, n
        self.batch = None
        self.h_before: float | None = None

    def entropy(self, model) -> float:
        if self.batch is None:
            self.batch = self.engine.generate([self.prompt_fn(p) for p in self.problems], n=self.n, seed=PROBE_SEED)
        _, ent = self.stats(model, self.batch)
        return probe_entropy(ent, self.batch.policy_mask.to(ent.device))

    def before_update(self, model) -> None:
        """Score the probe unless the last ``after_update`` already did (the model has not moved since)."""
        if self.h_before is None:
            self.h_before = self.entropy(model)

    def after_update(self, model) -> dict[str, float]:
        h_after = self.entropy(model)
        out = {"entropy/probe": h_after, "entropy_change/realized": h_after - float(self.h_before)}
        self.h_before = h_after
        return out


def build_probe(cfg, source, rollout_engine, stats: Callable) -> ProbeBatch | None:
    """A probe when ``diagnostics.entropy_change`` or ``diagnostics.attribution`` is on and the
    prompt source has held-out prompts."""
    diag = cfg.diagnostics
    if not (diag.entropy_change or diag.attribution):
        return None
    n_prompts = int(diag.probe_prompts)
    problems = source.validation(n_prompts) if n_prompts > 0 else []
    if not problems:
        return None
    return ProbeBatch(problems, source.prompt, rollout_engine, stats, int(diag.probe_responses))
