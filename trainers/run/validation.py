"""A training run's periodic validation (``trainer.val_every``): the task's held-out prompts sampled
once each (``val/acc``, by group ``val/acc/<group>``, with ``val.pass_k`` the sampled pass@1 and
pass@k), and the real benchmarks of ``val.benchmarks`` through the eval harness
(``val/<bench>/avg@<n>``). With tools on, both sample through the run's multi-turn driver and its
sandbox, as training does (``val/tools/...``, ``val/<bench>/tools/...``).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from ...evals.runner import tool_summary
from ...evals.runner import validate as validate_benchmarks
from ..stats.passk import sampled_pass_metrics

__all__ = ["validation_metrics"]


@torch.no_grad()
def validation_metrics(model, tokenizer, rollout, source, problems: list, settings) -> dict[str, float]:
    """The ``val/*`` metrics of the policy ``model`` now. ``rollout``: the run's engine (its tool
    driver with tools on); ``source``: the task (prompts, verifier, groups); ``problems``: its
    held-out problems; ``settings``: the run's ``StepSettings`` (seed, ``val.*``, tools)."""
    out: dict[str, float] = {}
    val = settings.val or {}
    if problems:
        roll = rollout.generate(
            [source.prompt(p) for p in problems],
            n=1,
            seed=settings.seed,
            temperature=settings.val_temperature,
            top_p=val.get("top_p"),  # null: rollout.top_p
            max_new_tokens=val.get("max_new_tokens"),  # null: rollout.max_new_tokens
        )
        correct = [source.reward(p, txt) for p, txt in zip(problems, roll.texts)]
        out["val/acc"] = float(np.mean(correct))
        if roll.tools is not None:  # sampled through the tool driver, as training: val/tools/calls/mean, ...
            out.update({f"val/{k}": v for k, v in tool_summary(roll.tools).items()})
        by_group = defaultdict(list)
        for p, c in zip(problems, correct):
            by_group[source.group(p)].append(c)
        out.update({f"val/acc/{g}": float(np.mean(v)) for g, v in by_group.items()})
        if settings.val_pass_k > 0:  # pass@1 / pass@k from sampled responses
            out.update(sampled_pass_metrics(rollout, source, problems, settings.val_pass_k))
    if settings.val_benchmarks:
        # with tools on, through the same multi-turn driver and tool as training (val/<bench>/tools/...)
        out.update(
            validate_benchmarks(
                model,
                tokenizer,
                list(settings.val_benchmarks),
                settings.val,
                tools=settings.tools,
                executor=getattr(rollout, "executor", None),
                max_new_tokens=settings.rollout_max_new_tokens,
            )
        )
    return out
