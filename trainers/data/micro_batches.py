"""How a mini-batch is cut into micro-batches (the forward/backward passes of gradient accumulation).

- by count (``trainer.micro_batch_responses``): consecutive runs of that many responses, each padded
  to the widest row of the whole batch (the published recipes' layout);
- by tokens (``trainer.micro_batch_tokens``): responses sorted longest first and packed greedily while
  ``rows x (longest prompt + longest response)`` (the size of the trimmed pass) stays within the budget; each pass is then
  trimmed to its own longest prompt and response (``trim``). Ranks must run the same number of
  passes (FSDP's collectives pair them up), so every rank splits its largest passes until it has as
  many as the rank with the most (``balance``).

The accumulation weight of each pass is its share of the aggregation's declared denominator
(``algos.loss_agg``), so any partition of the mini-batch gives the same gradient.
"""

from __future__ import annotations

import torch

from ...conf import cfg_get
from ...rollout.base import Rollout
from ..algos.step_batch import StepBatch
from ..parallel import distributed

__all__ = ["passes", "pass_rows", "by_count", "by_tokens", "balance", "trim", "padded_tokens"]


def passes(rows: Rollout, trainer_cfg, dist) -> list[torch.Tensor]:
    """Positions in the mini-batch ``rows`` of each forward/backward pass:
    ``trainer.micro_batch_responses`` rows at a time, or packed by ``trainer.micro_batch_tokens``,
    as many passes on every rank of ``dist``. ``trainer_cfg``: the trainer section, or any object
    with those two keys (the trainer's ``StepSettings``)."""
    budget = cfg_get(trainer_cfg, "micro_batch_tokens")
    if not budget:
        return by_count(len(rows.texts), int(cfg_get(trainer_cfg, "micro_batch_responses")))
    packed = by_tokens(rows.prompt_mask.sum(1), rows.response_mask.sum(1), int(budget))
    return balance(packed, int(distributed.max_across(len(packed), dist)))


def pass_rows(rows: StepBatch, trainer_cfg) -> StepBatch:
    """The rows of one pass, trimmed to their own width under a token budget."""
    if not cfg_get(trainer_cfg, "micro_batch_tokens"):
        return rows
    responses, width = trim(rows.responses)
    return rows.narrowed(responses, width)


def by_count(n_rows: int, rows: int) -> list[torch.Tensor]:
    """``[0..rows), [rows..2 rows), ...``: positions in the mini-batch."""
    return [torch.arange(s, min(s + rows, n_rows)) for s in range(0, n_rows, rows)]


def by_tokens(prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Positions (into the ``[n]`` token counts of each row's prompt and response) packed longest
    first into passes of at most ``budget`` padded tokens (rows x (longest prompt + longest
    response): the size of the trimmed pass); a row over the budget by itself goes alone."""
    order = torch.argsort(prompt_lengths + response_lengths, descending=True, stable=True)
    passes: list[list[int]] = []
    top_p = top_r = 0
    for i in order.tolist():
        p, r = int(prompt_lengths[i]), int(response_lengths[i])
        if passes and (len(passes[-1]) + 1) * (max(top_p, p) + max(top_r, r)) <= budget:
            passes[-1].append(i)
            top_p, top_r = max(top_p, p), max(top_r, r)
        else:
            passes.append([i])
            top_p, top_r = p, r
    return [torch.tensor(sorted(q), dtype=torch.long) for q in passes]


def balance(passes: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """Split the passes with the most rows until there are ``count`` of them (a rank with fewer passes
    than another); a one-row pass cannot split: an empty pass is then added (the loop runs it as a
    zero-weight pass on one row, so the collectives still pair up)."""
    passes = list(passes)
    while len(passes) < count:
        widest = max(range(len(passes)), key=lambda j: len(passes[j]))
        if len(passes[widest]) < 2:
            passes.append(torch.empty(0, dtype=torch.long))
            continue
        p = passes.pop(widest)
        half = (len(p) + 1) // 2
        passes[widest:widest] = [p[:half], p[half:]]
    return passes


def trim(rollout: Rollout) -> tuple[Rollout, int]:
    """The rollout without the prompt columns no row uses (left padding) and the response columns
    no row uses (right padding); and its response width. Positions follow the attention mask, so
    the numbers do not change."""
    used_p = rollout.prompt_mask.bool().any(0).nonzero()
    p0 = int(used_p[0]) if len(used_p) else rollout.prompt_mask.shape[1]
    used_r = rollout.response_mask.bool().any(0).nonzero()
    r1 = max(int(used_r[-1]) + 1 if len(used_r) else 1, 1)
    cut = lambda t, a, b: None if t is None else t[:, a:b]  # noqa: E731
    return Rollout(
        cut(rollout.prompt_ids, p0, None),
        cut(rollout.prompt_mask, p0, None),
        cut(rollout.response_ids, 0, r1),
        cut(rollout.response_mask, 0, r1),
        rollout.texts,
        rollout.truncated,
        cut(rollout.sampling_logp, 0, r1),
        None if rollout.tools is None else rollout.tools.narrow(r1),
    ), r1


def padded_tokens(rollout: Rollout, passes: list[torch.Tensor], trimmed: bool) -> int:
    """Positions the passes run through the model (rows x width, summed), trimmed or not."""
    total = 0
    for p in passes:
        if len(p) == 0:
            continue
        part = rollout.select(p)
        if trimmed:
            part, _ = trim(part)
        total += len(p) * (part.prompt_ids.shape[1] + part.response_ids.shape[1])
    return total
