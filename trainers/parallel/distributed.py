"""Data-parallel training: process group from torchrun or SLURM, FSDP2 sharding, rank helpers.

The same ``entropyrl train ...`` command runs single-process or under a launcher:

    torchrun --nproc_per_node 2 -m entropyrl.cli.main train ...        # one node, 2 ranks
    srun --ntasks-per-node 8 entropyrl train ...                        # SLURM, one task per GPU
    srun --ntasks-per-node 1 torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 \\
         --rdzv_backend c10d --rdzv_endpoint $MASTER:29500 -m entropyrl.cli.main train ...

``setup(trainer_cfg)`` reads the launcher's environment: torchrun's ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK`` (+ ``MASTER_ADDR``/``MASTER_PORT``), else submitit's local tasks
(``SUBMITIT_LOCAL_GLOBALID``/``SUBMITIT_LOCAL_NTASKS``: ``entropyrl sweep launcher=local
launcher.tasks_per_node=N``), else SLURM's ``SLURM_PROCID``/``SLURM_NTASKS``
(``SLURM_STEP_NUM_TASKS`` inside an ``srun`` step)/``SLURM_LOCALID``, the master being the first
host of ``SLURM_NODELIST`` (``MASTER_ADDR``/``MASTER_PORT`` override it; the port defaults to
29500 + the job id mod 1000). Backend: NCCL on GPUs, gloo on CPU.

How training is split (``trainers/trainer.py`` calls the helpers below; all are no-ops on one
process without FSDP):

- every rank samples its own contiguous slice of the step's prompts (``shard``) with its own seed
  offset and generates them with its own rollout engine (HF ``generate`` on the sharded model
  with ``synced_gpus``, or one vLLM engine per rank), so groups never straddle ranks;
- the policy is wrapped with FSDP2 (``prepare_model``): ``fully_shard`` on every decoder layer and
  on the root, optionally with bf16 compute (``trainer.dtype: bfloat16``: bf16 parameters in
  forward/backward, float32 master weights, gradients reduced in float32) and gradient
  checkpointing (``trainer.gradient_checkpointing``). Gradients are averaged over ranks by FSDP;
  the loop scales each rank's loss so that the result equals the single-process token-mean over
  the whole mini-batch (``sum_across``, ``world_size``);
- step metrics are averaged over ranks (``mean_metrics``); rank 0 alone logs (MLflow,
  metrics.jsonl, progress bar) and writes checkpoints, from a full (unsharded) state dict
  gathered from every rank (``checkpoint_views``); resume loads the full state on every rank.

Under FSDP the trainer's token statistics must run through the root module so that FSDP's hooks
gather the root-level parameters (embeddings, final norm, output projection):
``prepare_model`` registers ``model.response_hidden(**inputs)`` as an FSDP forward method and
``policy_stats.response_token_stats`` uses it when present.

This module holds the collectives and the batch split; the process group is set up in
``process_group.py`` and the model is sharded and checkpointed in ``fsdp.py``. Every public name
of the three is importable from here (``distributed.setup``, ``distributed.prepare_model``, ...).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...core.errors import UserError
from ..algos.loss_agg import loss_aggregation
from .fsdp import checkpoint_views, decoder_layers, full_weights, is_fsdp, load_full_state, prepare_model
from .process_group import (
    DistInfo,
    cleanup,
    collective_timeout_s,
    expand_nodelist,
    launcher_env,
    node_name,
    peer_failure,
    setup,
)

__all__ = [
    "DistInfo",
    "launcher_env",
    "expand_nodelist",
    "node_name",
    "node_names",
    "gather_rows",
    "gather_values",
    "setup",
    "prepare_model",
    "shard",
    "sum_across",
    "min_across",
    "max_across",
    "mean_metrics",
    "masked_mean_across",
    "loss_scale",
    "clip_grad_norm",
    "barrier",
    "broadcast_value",
    "all_gather_objects",
    "gather_objects_to_main",
    "checkpoint_views",
    "full_weights",
    "load_full_state",
    "is_fsdp",
    "decoder_layers",
    "check_batch_sizes",
    "NullTracker",
    "cleanup",
    "collective_timeout_s",
    "peer_failure",
]


# ---------------------------------------------------------------------------------------------
# collectives (no-ops on one process)
# ---------------------------------------------------------------------------------------------
def _active(info: DistInfo) -> bool:
    import torch.distributed as dist

    return info.world_size > 1 and dist.is_initialized()


def _reduce(value, info: DistInfo, op) -> torch.Tensor:
    import torch.distributed as dist

    t = torch.as_tensor(value, dtype=torch.float64).clone()
    if _active(info):
        t = t.to(info.device if info.backend == "nccl" else "cpu")
        dist.all_reduce(t, op=op)
    return t.cpu()


def sum_across(value, info: DistInfo):
    """Sum of a number or tensor over ranks (float64, on CPU)."""
    import torch.distributed as dist

    return _reduce(value, info, dist.ReduceOp.SUM)


def min_across(value, info: DistInfo):
    import torch.distributed as dist

    return _reduce(value, info, dist.ReduceOp.MIN)


def max_across(value, info: DistInfo):
    import torch.distributed as dist

    return _reduce(value, info, dist.ReduceOp.MAX)


def mean_metrics(metrics: dict[str, float], info: DistInfo) -> dict[str, float]:
    """Average every metric over ranks (NaNs ignored; a key missing on a rank counts as absent).
    Every rank must call it; keys are unioned, so ranks may report different keys."""
    if not _active(info):
        return metrics
    import torch.distributed as dist

    gathered: list[dict | None] = [None] * info.world_size
    dist.all_gather_object(gathered, {k: float(v) for k, v in metrics.items()})
    out: dict[str, float] = {}
    for key in sorted(set().union(*[g.keys() for g in gathered if g])):
        vals = [g[key] for g in gathered if g and key in g and g[key] == g[key]]
        out[key] = float(sum(vals) / len(vals)) if vals else float("nan")
    return out


def gather_rows(tensors: dict[str, torch.Tensor], info: DistInfo) -> tuple[dict[str, torch.Tensor], slice]:
    """Every rank's ``[b_r, T_r]`` tensors stacked by rank (rank 0's rows first), right-padded to
    the widest ``T`` with zeros (a zero mask: padding is never valid), and the rows of this rank in
    the result. Identity on one process. Every rank must call it (same keys)."""
    if not _active(info):
        return tensors, slice(None)
    import torch.distributed as dist

    first = next(iter(tensors.values()))
    shapes: list[tuple[int, int] | None] = [None] * info.world_size
    dist.all_gather_object(shapes, (int(first.shape[0]), int(first.shape[1])))
    rows, width = max(s[0] for s in shapes), max(s[1] for s in shapes)
    start = sum(s[0] for s in shapes[: info.rank])
    device = info.device if info.backend == "nccl" else torch.device("cpu")
    out = {}
    for key, t in tensors.items():
        wire = torch.uint8 if t.dtype == torch.bool else t.dtype  # gloo has no bool collectives
        padded = torch.zeros((rows, width), dtype=wire, device=device)
        padded[: t.shape[0], : t.shape[1]] = t.detach().to(device, wire)
        parts = [torch.empty_like(padded) for _ in range(info.world_size)]
        dist.all_gather(parts, padded)
        out[key] = torch.cat([part[: s[0]] for part, s in zip(parts, shapes)]).to(t.device, t.dtype)
    return out, slice(start, start + int(first.shape[0]))


def gather_values(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Every rank's 1-D ``values [n_r]`` concatenated by rank (rank 0's first), on this rank's
    device: one all-gather of the counts, one of the values padded to the largest count. Identity
    on one process. Every rank must call it."""
    if not _active(info):
        return values
    import torch.distributed as dist

    counts: list[int | None] = [None] * info.world_size
    dist.all_gather_object(counts, int(values.numel()))
    device = info.device if info.backend == "nccl" else torch.device("cpu")
    padded = torch.zeros(max(counts), dtype=values.dtype, device=device)
    padded[: values.numel()] = values.detach().reshape(-1).to(device)
    parts = [torch.empty_like(padded) for _ in range(info.world_size)]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, counts)]).to(values.device)


def node_names(info: DistInfo) -> list[str]:
    """Every rank's node name, by rank (``[node_name()]`` on one process). Every rank must call it."""
    if not _active(info):
        return [node_name()]
    import torch.distributed as dist

    gathered: list[str | None] = [None] * info.world_size
    dist.all_gather_object(gathered, node_name())
    return [str(g) for g in gathered]


def masked_mean_across(x: torch.Tensor, mask: torch.Tensor, info: DistInfo) -> float:
    """Token mean of ``x [B, T]`` over valid tokens of every rank (the single-process value on one)."""
    if not _active(info):
        n = mask.sum()
        return float((x * mask).sum() / n) if n > 0 else float("nan")
    total = sum_across(torch.stack([(x.detach().double() * mask).sum().cpu(), mask.double().sum().cpu()]), info)
    return float(total[0] / total[1]) if total[1] > 0 else float("nan")


def loss_scale(agg: str, mini_mask: torch.Tensor, info: DistInfo) -> float:
    """Factor on each rank's mini-batch loss so that FSDP's gradient *average* over ranks equals
    the gradient of the loss aggregated over the whole (all-rank) mini-batch: ``world * local
    denominator / global denominator``, with the denominator the aggregation declared
    (``loss_agg.register_loss_agg``: token counts, response counts; an aggregation that divides
    by a constant simply adds up, so the factor is ``world``). 1.0 on one process."""
    if not _active(info):
        return 1.0
    denominator = loss_aggregation(agg).denominator
    if denominator is None:
        return float(info.world_size)
    local = float(denominator(mini_mask))
    total = float(sum_across(local, info))
    return float(info.world_size * local / total) if total > 0 else 0.0


def clip_grad_norm(model, max_norm: float) -> float:
    """``clip_grad_norm_`` over the model's parameters; the total norm as a float (FSDP: global)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def broadcast_value(value, info: DistInfo):
    """Rank 0's ``value`` (any picklable object) on every rank; ``value`` itself on one process.
    Every rank must call it."""
    if not _active(info):
        return value
    import torch.distributed as dist

    box = [value if info.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_objects(value, info: DistInfo) -> list:
    """Every rank's ``value`` (any picklable object), by rank, on every rank; ``[value]`` on one
    process. Every rank must call it."""
    if not _active(info):
        return [value]
    import torch.distributed as dist

    gathered: list = [None] * info.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def gather_objects_to_main(value, info: DistInfo) -> list | None:
    """Every rank's ``value`` (any picklable object), by rank, on rank 0 (None on the others):
    what rank 0 alone writes. ``[value]`` on one process. Every rank must call it."""
    if not _active(info):
        return [value]
    import torch.distributed as dist

    gathered: list | None = [None] * info.world_size if info.rank == 0 else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def barrier(info: DistInfo) -> None:
    import torch.distributed as dist

    if _active(info):
        dist.barrier()


def shard(items: Sequence, info: DistInfo) -> list:
    """This rank's contiguous slice of ``items`` (``len(items)`` must divide by the world size)."""
    if info.world_size == 1:
        return list(items)
    if len(items) % info.world_size:
        raise UserError(f"{len(items)} items cannot be split evenly over {info.world_size} processes")
    k = len(items) // info.world_size
    return list(items[info.rank * k : (info.rank + 1) * k])


def check_batch_sizes(trainer_cfg, info: DistInfo) -> None:
    """Prompt counts must split evenly over ranks (each rank holds whole groups)."""
    if info.world_size == 1:
        return
    for key in ("prompts_per_step", "mini_batch_prompts"):
        value = int(trainer_cfg[key])
        if value % info.world_size:
            raise UserError(
                f"trainer.{key}={value} must be a multiple of the number of processes "
                f"({info.world_size}) under data-parallel training"
            )


class NullTracker:
    """Stands in for ``RunTracker`` on ranks other than 0: they log nothing."""

    enabled = False
    run_id = None
    uri = None

    def start(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, *args, **kwargs) -> None:
        pass

    def log_artifact(self, *args, **kwargs) -> None:
        pass

    def finish(self, *args, **kwargs) -> None:
        pass
