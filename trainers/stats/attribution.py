"""The network's own prediction of an update's effect on the probe entropy.

``diagnostics.attribution=true`` (on steps ``diagnostics.attribution_every``, twice that, ...): at
the start of each of the step's optimizer steps the gradient of the probe batch's token-mean
entropy with respect to the trainable parameters, ``g_H = dH_probe/dtheta``, is taken (the probe of
``probe.py``: held-out responses, re-scored), and again after the last; with the parameter change
``d_k = theta_{k+1} - theta_k`` of each optimizer step k (``prompts_per_step / mini_batch_prompts``
per epoch) the step logs

    entropy_change/predicted_net_1st = sum_k g_H(theta_k) . d_k                                (first order)
    entropy_change/predicted_net     = sum_k (g_H(theta_k) + g_H(theta_{k+1})) / 2 . d_k       (trapezoid)

beside ``entropy_change/realized`` (the measured ``H_probe(after) - H_probe(before)``). Unlike the
per-token prediction (``prediction.py``), both see everything the optimizer did (Adam's
preconditioning, clipping, momentum). The first order's gap to the realised change is the
curvature along the step, ``d' H d / 2``; the trapezoid is exact for an entropy quadratic along each
optimizer step, so its gap is third order. ``predicted_net`` is the trapezoid because at the step
sizes that make a run collapse the curvature is not small beside the change, and the first order
overshoots a step's decline by a share of the change itself (docs/algorithms.md §6, docs/lab.md).
``g_H`` is re-taken at each optimizer step's start because a training step of several Adam steps
is not small: with one ``g_H`` for the whole step the curvature over the path (the cross term
between consecutive, momentum-correlated updates included) about doubled the first order's error.
Cost per measured step: one backward through the probe per optimizer step plus one at the end, and
a copy of the parameters.

Under FSDP (several ranks, or one with ``trainer.fsdp=true`` / ``trainer.dtype=bfloat16``) every
rank holds the same probe batch (same prompts, same sampling seed) and takes a contiguous share of
its rows; their backward passes go through FSDP's reduce-scatter, which averages over ranks, so
each rank's share is scaled by ``world_size`` and the local gradient shard is that rank's slice of
the single-process ``g_H``. The dot products are the sums of the ranks' local shard dot products:
one all-reduce of both predictions when the step finishes. The split into parts
(``update_split.py``) needs the unsharded parameters: one process without FSDP; under FSDP it is
skipped.

    entropyrl train diagnostics.attribution=true diagnostics.attribution_every=5
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable

import torch

from ...core.errors import UserError
from ...core.resources import available_memory_bytes
from ..parallel.distributed import DistInfo, max_across, min_across, sum_across
from ..parallel.fsdp import is_fsdp, sharded_parameters
from .update_split import GROUPS, UpdateSplit

__all__ = [
    "probe_entropy_gradient",
    "sharded_probe_entropy_gradient",
    "predicted_change",
    "EntropyAttribution",
    "build_attribution",
    "check_split_memory",
    "split_memory_bytes",
]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 parameter or gradient (a DTensor); a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _trainable(model) -> list[torch.Tensor]:
    return sharded_parameters(model)  # model.parameters() as they are without FSDP


def probe_entropy_gradient(model, rollout, entropy_fn: Callable, rows_per_chunk: int) -> list[torch.Tensor]:
    """``g_H``: d(token-mean entropy of ``rollout``'s valid tokens)/d(each trainable parameter).

    ``entropy_fn(model, rollout_part) -> entropy [b, R]`` with gradient (``response_token_stats``
    with ``entropy_grad=True``); summed chunk by chunk of ``rows_per_chunk`` rows, so memory is one
    chunk's graph. The parameters' ``.grad`` are left as they were.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    n_valid = int(rollout.policy_mask.sum())
    if n_valid == 0:
        return total
    rows = len(rollout.texts)
    for start in range(0, rows, rows_per_chunk):
        part = rollout.select(torch.arange(start, min(start + rows_per_chunk, rows)))
        entropy = entropy_fn(model, part)
        mask = part.policy_mask.to(entropy.device).bool()
        summed = torch.where(mask, entropy, torch.zeros_like(entropy)).sum() / n_valid
        grads = torch.autograd.grad(summed, params, allow_unused=True)
        for acc, g in zip(total, grads):
            if g is not None:
                acc.add_(g)
    return total


def sharded_probe_entropy_gradient(
    model, rollout, entropy_fn: Callable, rows_per_chunk: int, rank: int, world_size: int
) -> list[torch.Tensor]:
    """``g_H`` under FSDP2: this rank's local shard of each trainable parameter's gradient.

    Every rank passes the same ``rollout`` (the probe batch) and takes its share of the rows
    (``tensor_split``); every rank runs the same number of backward passes (a rank with fewer rows
    adds zero-weighted ones), so FSDP's reduce-scatters pair up. The token mean is over the whole
    probe's valid tokens, and each share is scaled by ``world_size`` because FSDP averages the
    ranks' gradients. Runs through ``.grad`` (FSDP reduces there); the ``.grad`` held before are
    put back.
    """
    params = _trainable(model)
    total = [torch.zeros_like(_local(p)) for p in params]
    n_valid = int(rollout.policy_mask.sum())
    if n_valid == 0:  # the same on every rank: no rank runs a backward
        return total
    rows = len(rollout.texts)
    mine = torch.arange(rows).tensor_split(world_size)[rank]
    largest = math.ceil(rows / world_size)  # tensor_split: the first shares are the largest
    passes = max(math.ceil(largest / rows_per_chunk), 1)
    held = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        for k in range(passes):
            idx = mine[k * rows_per_chunk : (k + 1) * rows_per_chunk]
            pairing = len(idx) == 0  # only to pair this rank's reduce-scatter with the others'
            part = rollout.select(torch.zeros(1, dtype=torch.long) if pairing else idx)
            entropy = entropy_fn(model, part)
            mask = part.policy_mask.to(entropy.device).bool()
            weight = 0.0 if pairing else world_size / n_valid
            (torch.where(mask, entropy, torch.zeros_like(entropy)).sum() * weight).backward()
        for acc, p in zip(total, params):
            if p.grad is not None:
                acc.add_(_local(p.grad).detach())
    finally:
        for p, g in zip(params, held):
            p.grad = g
    return total


def predicted_change(grad: list[torch.Tensor], before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """``sum_i g_i . (after_i - before_i)`` over the parameter tensors (float64 accumulation)."""
    total = torch.zeros((), dtype=torch.float64)
    for g, b, a in zip(grad, before, after):
        total += (g.double() * (a.double() - b.double())).sum().cpu()
    return float(total)


class EntropyAttribution:
    """``begin`` before a step's first optimizer step (gradient and parameters), ``optimizer_step``
    around each of them (the split's parts, that optimizer step's prediction, and ``g_H`` where it
    ended), ``finish`` after the step (the metrics).

    ``sharded``: the policy is wrapped with FSDP (``dist``: its process group, None for one
    process): the gradient and parameters are this rank's shards, the dot product is all-reduced,
    and there is no split into parts. Otherwise the single-process path, with the split."""

    def __init__(
        self,
        probe,
        entropy_fn: Callable,
        rows_per_chunk: int,
        every: int = 1,
        dist: DistInfo | None = None,
        log: Callable[[str], None] = print,
        sharded: bool | None = None,
    ):
        self.probe, self.entropy_fn, self.rows, self.every = probe, entropy_fn, rows_per_chunk, max(int(every), 1)
        self.dist = dist if dist is not None else DistInfo()
        self.sharded = self.dist.world_size > 1 if sharded is None else bool(sharded)
        self.log = log
        self._probe_checked = self.dist.world_size == 1
        self.off = False  # several ranks holding different probe batches
        self._grad: list[torch.Tensor] | None = None  # g_H at the current optimizer step's start
        self._training = False  # the model's mode when g_H was first taken
        self._before: list[torch.Tensor] | None = None  # the parameters there
        self._net = self._net_1st = 0.0  # the step's predictions so far (this rank's shards)
        self.split: UpdateSplit | None = None  # the step's update split into parts (update_split.py)

    def due(self, step: int) -> bool:
        """The step about to run, ``step + 1`` (``step``: the steps done), is measured: steps ``every``,
        ``2 * every``, ..., counted as ``trainer.val_every`` and ``save_every`` count (and verl's
        ``*_freq``); every step when ``every`` is 1."""
        return (step + 1) % self.every == 0

    def _same_probe_on_every_rank(self) -> bool:
        """Every rank sampled the same probe batch (same prompts and seed): a fingerprint of its
        tokens compared across ranks (two all-reduces, once per run)."""
        batch = self.probe.batch
        ids, mask = batch.response_ids.double(), batch.response_mask.double()
        place = torch.arange(1, ids.numel() + 1, dtype=torch.float64).reshape(ids.shape)
        mark = torch.stack([(ids * mask * place.remainder(9973)).sum(), mask.sum(), torch.tensor(float(len(ids)))])
        return bool(torch.equal(min_across(mark, self.dist), max_across(mark, self.dist)))

    def begin(self, model) -> None:
        if self.off:
            return
        if self.probe.batch is None:  # the probe's responses are sampled on first use
            self.probe.entropy(model)
        if not self._probe_checked:
            self._probe_checked = True
            if not self._same_probe_on_every_rank():  # then g_H would mix batches: log nothing wrong
                self.off = True
                self.log(
                    "diagnostics.attribution: the ranks sampled different probe batches, so "
                    "entropy_change/predicted_net is not logged in this run"
                )
                return
        self._training = model.training
        self._grad = self._gradient(model)
        if not self.sharded:
            self.split = UpdateSplit(self._grad, _trainable(model))
        self._before = [_local(p.detach()).clone() for p in _trainable(model)]
        self._net = self._net_1st = 0.0

    def _gradient(self, model) -> list[torch.Tensor]:
        was = model.training
        model.train(self._training)  # the mode g_H was first taken in (dropout), mid-update too
        try:
            if not self.sharded:
                return probe_entropy_gradient(model, self.probe.batch, self.entropy_fn, self.rows)
            return sharded_probe_entropy_gradient(
                model, self.probe.batch, self.entropy_fn, self.rows, self.dist.rank, self.dist.world_size
            )
        finally:
            model.train(was)

    @contextmanager
    def optimizer_step(self, model, optimizer, grad_norm_before_clip: float):
        """Around one of the measured step's ``optimizer.step()`` (after clipping): the split reads the
        optimizer's state before and after it, then ``after_optimizer_step``."""
        if self.split is not None:
            self.split.before_step(optimizer, grad_norm_before_clip)
        yield
        if self.split is not None:
            self.split.after_step(optimizer)
        self.after_optimizer_step(model)

    def after_optimizer_step(self, model) -> None:
        """After one of the measured step's optimizer steps: its first-order prediction
        ``g_H(start) . dtheta`` and trapezoid ``(g_H(start) + g_H(end))/2 . dtheta`` are added up
        (this rank's shards under FSDP: ``finish`` sums the ranks), and ``g_H(end)`` is where the next
        one starts (and the split's parts move on with it)."""
        if self._grad is None or self._before is None:
            return
        after = [_local(p.detach()) for p in _trainable(model)]
        first = predicted_change(self._grad, self._before, after)
        grad_end = self._gradient(model)
        self._net_1st += first
        self._net += 0.5 * (first + predicted_change(grad_end, self._before, after))
        if self.split is not None:
            self.split.end_segment(grad_end)
        self._grad, self._before = grad_end, [a.clone() for a in after]

    def finish(self, model) -> dict[str, float]:
        """``predicted_net`` (the trapezoid per optimizer step, what ``attribution/<part>`` adds up
        to) and ``predicted_net_1st`` (first order per optimizer step, what ``attribution_1st/<part>``
        adds up to); what separates them is the curvature (largest on Adam's first, sign-like step)."""
        if self._grad is None or self._before is None:
            return {}
        net, net_1st = self._net, self._net_1st
        if self.sharded:  # each rank holds its shards: the dot products are their sums
            net, net_1st = (float(v) for v in sum_across(torch.tensor([net, net_1st], dtype=torch.float64), self.dist))
        out = {"entropy_change/predicted_net": net, "entropy_change/predicted_net_1st": net_1st}
        if self.split is not None:
            out.update(self.split.metrics())
        self._grad = self._before = self.split = None
        return out


def split_memory_bytes(trainable: int, interventions: int) -> int:
    """What the split into parts (``update_split.py``) holds at its peak for ``trainable``
    parameters (float32) and ``interventions`` interventions: each part's gradient (the five token
    groups, each intervention, the KL term) plus one being summed in, six float32 copies (the
    parameters and the momentum before the step, ``g_H`` at both ends, the parameters where each
    optimizer step starts and ends) and five float64 ones (the parts' shared factor and the four
    other parts' changes). The training step's own memory comes on top."""
    gradients = len(GROUPS) + int(interventions) + 1 + 1
    return int(trainable) * (4 * gradients + 4 * 6 + 8 * 5)


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_split_memory(params: list[torch.Tensor], interventions: int, free: int | None = None) -> None:
    """Refuse, before the first step, an attribution whose split alone would not fit in the memory
    left on the parameters' device (a run killed for memory at its first measured step loses it
    all). Passing is no promise: the step's own activations come on top."""
    trainable = sum(p.numel() for p in params if p.requires_grad)
    if not trainable:
        return
    device = params[0].device
    if free is None:
        if device.type == "cuda":
            free = int(torch.cuda.mem_get_info(device)[0])
        elif device.type == "cpu":
            free = available_memory_bytes()
    need = split_memory_bytes(trainable, interventions)
    if free is not None and need > free:
        raise UserError(
            f"diagnostics.attribution: splitting the update of {trainable:,} trainable parameters "
            f"into its parts needs about {_size(need)}, and {_size(free)} are free on {device}: "
            f"train a LoRA adapter (model.lora.rank=8: the split holds only its parameters), or set "
            f"diagnostics.attribution=false"
        )


def build_attribution(
    cfg, probe, dist: DistInfo, entropy_fn: Callable, model, log: Callable[[str], None] = print
) -> EntropyAttribution | None:
    """The attribution step when ``diagnostics.attribution`` is on and there is a probe batch.
    With ``model`` sharded by FSDP (always with several ranks: ``process_group`` refuses
    ``trainer.fsdp=false`` there) ``predicted_net`` only, and one line from rank 0 says the split
    into parts is skipped."""
    diag = cfg.diagnostics
    if not diag.attribution or probe is None:
        return None
    sharded = is_fsdp(model)
    if not sharded:
        parts = len(list(cfg.algo.interventions or []))
        check_split_memory(_trainable(model), parts)
    if sharded and dist.is_main:
        log(
            f"diagnostics.attribution: the policy is sharded with FSDP ({dist.world_size} rank(s)), so "
            f"entropy_change/predicted_net only (dot product reduced over shards); the split into "
            f"attribution/<part> needs one process without FSDP (trainer.fsdp=false, float32)"
        )
    return EntropyAttribution(
        probe,
        entropy_fn,
        int(cfg.trainer.micro_batch_responses),
        int(diag.attribution_every),
        dist=dist,
        log=log,
        sharded=sharded,
    )
