"""The statistics pass and the first update pass share one forward.

Before any update of a step the trainer recomputes the sampling policy's token statistics of every
row (``old_logp`` and the entropy ``H``, no gradient); the first micro-batch of the first update then
runs the same weights over some of the same rows with gradient. Same weights, same rows, same
padding: the same numbers, so PPO's ratio is exactly 1 there. ``sampling_stats`` computes those rows
once, with their graph, and the update takes them from the ``KeptPass`` instead of running the
forward again (one forward of ``micro_batch_responses`` rows fewer a step: the whole statistics pass
when the batch is a single pass, as in on-policy runs).

The two forwards are the same computation only when nothing in them is random or split across
processes, so the pass is kept only when ``trainer.reuse_stats_forward`` is on, at least one epoch
runs, the run is one process (FSDP's forward pairs collectives across ranks), the model has no active
dropout (a ``Dropout`` module or a config rate above 0: LoRA's ``model.lora.dropout`` too), and no
sampling-time vocabulary statistics are asked (SIREN's first batch). Otherwise every row goes through
the no-gradient pass. The kept rows run in training mode, as the update runs them, so gradient
checkpointing holds only its checkpoints between scoring and the update.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...core.seeds import shuffle_seed
from ..algos.step_batch import StepBatch
from ..stats.policy_stats import batch_token_stats, response_token_stats
from . import micro_batches

__all__ = ["KeptPass", "epoch_orders", "first_pass_rows", "has_dropout", "sampling_stats"]


@dataclass
class KeptPass:
    """The first update pass's statistics, computed during scoring with their graph.

    ``rows``: ``[b]`` positions in the step batch; ``stats``: ``(logp [b, w], entropy [b, w])``
    (and the update's vocabulary statistics when it asks for them) as ``response_token_stats``
    returns them, or None when nothing is kept (or it was taken)."""

    rows: torch.Tensor | None = None
    stats: tuple | None = None

    def take(self, rows: torch.Tensor) -> tuple | None:
        """The kept statistics if ``rows`` are the kept rows (the first pass of the first update),
        once; None when nothing is kept any more. A first pass on other rows is a bug in the order
        the two sides agree on, so it raises rather than train on another pass's graph."""
        if self.stats is None:
            return None
        if not torch.equal(rows, self.rows):
            raise RuntimeError(
                f"the kept statistics pass ran rows {self.rows.tolist()[:8]}..., the first update pass is on "
                f"{rows.tolist()[:8]}...: the two must draw their order the same way (first_pass_rows)"
            )
        stats, self.stats = self.stats, None
        return stats


def epoch_orders(n_rows: int, seed: int, step: int) -> Iterator[torch.Tensor]:
    """The order of a step's ``n_rows`` rows in each PPO epoch, one permutation per ``next``, drawn
    from the step's shuffle seed (``core/seeds.shuffle_seed``): the update's order, which
    ``first_pass_rows`` reads the first of."""
    shuffle = torch.Generator().manual_seed(shuffle_seed(seed, step))
    while True:
        yield torch.randperm(n_rows, generator=shuffle)


def first_pass_rows(batch: StepBatch, settings, step: int, dist) -> torch.Tensor:
    """``[b]`` positions in ``batch`` of the first update's first micro-batch: epoch 0's order
    (``epoch_orders``), its first mini-batch, the first of that mini-batch's passes
    (``micro_batches.passes``)."""
    order = next(epoch_orders(len(batch), settings.seed, step))
    mini = order[: settings.mini_batch_rows]
    return mini[micro_batches.passes(batch.responses.select(mini), settings, dist)[0]]


def has_dropout(model) -> bool:
    """Whether a training-mode forward of ``model`` is random: a ``Dropout`` module with ``p > 0``, or
    a rate above 0 in its config under a name with ``dropout`` or ``pdrop`` (Hugging Face attention
    dropout is a config rate, not a module)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = {} if config is None else config.to_dict()
    return any(
        ("dropout" in k or "pdrop" in k) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for k, v in rates.items()
    )


def sampling_stats(model, batch: StepBatch, settings, algo, *, step: int, dist, vocab_stats=None):
    """``(old_logp [B, R], entropy [B, R], sampled, kept)``: the sampling policy's token statistics of
    every row of ``batch``, ``sampled`` the list ``[{key: [B, R]}]`` of ``vocab_stats`` (empty without),
    ``kept`` the ``KeptPass`` of the first update pass's rows (empty when the forwards cannot be
    shared, see the module docstring)."""
    s, roll = settings, batch.responses
    shared = s.reuse_stats_forward and s.ppo_epochs >= 1 and dist.world_size == 1 and not vocab_stats
    if not shared or has_dropout(model):
        old_logp, entropy, *sampled = batch_token_stats(model, roll, s.micro_batch_responses, vocab_stats=vocab_stats, **s.stats)
        return old_logp, entropy, sampled, KeptPass()
    rows = first_pass_rows(batch, s, step, dist)
    part = micro_batches.pass_rows(batch[rows], s).responses  # trimmed as the update trims it
    weight = next(model.parameters())  # the statistics are float32 for half-precision weights (token_stats.py)
    old_logp = torch.zeros(roll.response_ids.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device)
    entropy = torch.zeros_like(old_logp)
    others = torch.ones(len(batch), dtype=torch.bool)
    others[rows] = False
    if others.any():  # first, so the kept graph is not held through them
        rest = others.nonzero().squeeze(-1)
        old_logp[rest], entropy[rest] = batch_token_stats(model, roll.select(rest), s.micro_batch_responses, **s.stats)
    was_training = model.training
    with torch.enable_grad():
        model.train()
        stats = response_token_stats(model, part, entropy_grad=algo.needs_entropy_grad, vocab_stats=algo.vocab_stats(), **s.stats)
    model.train(was_training)
    width = stats[0].shape[1]
    old_logp[rows, :width], entropy[rows, :width] = stats[0].detach(), stats[1].detach()
    return old_logp, entropy, [], KeptPass(rows, stats)
