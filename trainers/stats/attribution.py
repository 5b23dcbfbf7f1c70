"""The net first-order prediction of an update's effect on the probe entropy.

``diagnostics.attribution=true`` (every ``diagnostics.attribution_every`` steps): before the step's
updates the gradient of the probe batch's token-mean entropy with respect to the trainable
parameters, ``g_H = dH_probe/dtheta``, is taken (the probe of ``probe.py``: held-out responses,
re-scored); after the optimizer steps the parameter change gives

    entropy_change/predicted_net = g_H . (theta_after - theta_before)

logged beside ``entropy_change/realized`` (the measured ``H_probe(after) - H_probe(before)``).
Unlike the per-token prediction (``prediction.py``), it sees everything the optimizer did (Adam's
preconditioning, clipping, several mini-batches), so the gap to the realised change is the
second-order part alone. It costs one backward through the probe and a copy of the parameters.

    entropyrl train diagnostics.attribution=true diagnostics.attribution_every=5
"""

from __future__ import annotations

from typing import Callable

import torch

from ...core.errors import UserError
from .update_split import UpdateSplit

__all__ = ["probe_entropy_gradient", "predicted_change", "EntropyAttribution", "build_attribution"]


def probe_entropy_gradient(model, rollout, entropy_fn: Callable, rows_per_chunk: int) -> list[torch.Tensor]:
    """``g_H``: d(token-mean entropy of ``rollout``'s valid tokens)/d(each trainable parameter).

    ``entropy_fn(model, rollout_part) -> entropy [b, R]`` with gradient (``response_token_stats``
    with ``entropy_grad=True``); summed chunk by chunk of ``rows_per_chunk`` rows, so memory is one
    chunk's graph. The parameters' ``.grad`` are left as they were.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    n_valid = int(rollout.response_mask.sum())
    if n_valid == 0:
        return total
    rows = len(rollout.texts)
    for start in range(0, rows, rows_per_chunk):
        part = rollout.select(torch.arange(start, min(start + rows_per_chunk, rows)))
        entropy = entropy_fn(model, part)
        mask = part.response_mask.to(entropy.device).bool()
        summed = torch.where(mask, entropy, torch.zeros_like(entropy)).sum() / n_valid
        grads = torch.autograd.grad(summed, params, allow_unused=True)
        for acc, g in zip(total, grads):
            if g is not None:
                acc.add_(g)
    return total


def predicted_change(grad: list[torch.Tensor], before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """``sum_i g_i . (after_i - before_i)`` over the parameter tensors (float64 accumulation)."""
    total = torch.zeros((), dtype=torch.float64)
    for g, b, a in zip(grad, before, after):
        total += (g.double() * (a.double() - b.double())).sum().cpu()
    return float(total)


class EntropyAttribution:
    """``begin`` before a step's updates (gradient and parameters), ``finish`` after them."""

    def __init__(self, probe, entropy_fn: Callable, rows_per_chunk: int, every: int = 1):
        self.probe, self.entropy_fn, self.rows, self.every = probe, entropy_fn, rows_per_chunk, max(int(every), 1)
        self._grad: list[torch.Tensor] | None = None
        self._before: list[torch.Tensor] | None = None
        self.split: UpdateSplit | None = None      # the step's update split into parts (update_split.py)

    def due(self, step: int) -> bool:
        """Step ``step`` (0-based count of steps done) is measured: the first, then every ``every``."""
        return step % self.every == 0

    def begin(self, model) -> None:
        if self.probe.batch is None:    # the probe's responses are sampled on first use
            self.probe.entropy(model)
        self._grad = probe_entropy_gradient(model, self.probe.batch, self.entropy_fn, self.rows)
        self._before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        self.split = UpdateSplit(self._grad, [p for p in model.parameters() if p.requires_grad])

    def finish(self, model) -> dict[str, float]:
        if self._grad is None or self._before is None:
            return {}
        after = [p.detach() for p in model.parameters() if p.requires_grad]
        out = {"entropy_change/predicted_net": predicted_change(self._grad, self._before, after)}
        if self.split is not None:
            out.update(self.split.metrics())
        self._grad = self._before = self.split = None
        return out


def build_attribution(cfg, probe, world_size: int, entropy_fn: Callable) -> EntropyAttribution | None:
    """The attribution step when ``diagnostics.attribution`` is on and there is a probe batch."""
    diag = cfg.get("diagnostics", {}) or {}
    if not diag.get("attribution", False) or probe is None:
        return None
    if world_size > 1:
        raise UserError("diagnostics.attribution=true runs on one process (its dot product of gradient and "
                        "parameter change is not sharded): switch it off under torchrun/srun")
    return EntropyAttribution(probe, entropy_fn, int(cfg.trainer.micro_batch_responses),
                              int(diag.get("attribution_every", 1)))
