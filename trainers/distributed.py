"""Data-parallel training: process group from torchrun or SLURM, FSDP2 sharding, rank helpers.

The same ``entropyrl train ...`` command runs single-process or under a launcher:

    torchrun --nproc_per_node 2 -m entropyrl.cli.main train ...        # one node, 2 ranks
    srun --ntasks-per-node 8 entropyrl train ...                        # SLURM, one task per GPU
    srun --ntasks-per-node 1 torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 \\
         --rdzv_backend c10d --rdzv_endpoint $MASTER:29500 -m entropyrl.cli.main train ...

``setup(trainer_cfg)`` reads the launcher's environment: torchrun's ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK`` (+ ``MASTER_ADDR``/``MASTER_PORT``), else SLURM's ``SLURM_PROCID``/``SLURM_NTASKS``
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
"""

from __future__ import annotations

import os
import re
import types
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from entropyrl.conf import cfg_get
from entropyrl.errors import UserError
from entropyrl.trainers.core_algos import loss_aggregation

__all__ = ["DistInfo", "launcher_env", "expand_nodelist", "setup", "prepare_model", "shard",
           "sum_across", "min_across", "max_across", "mean_metrics", "masked_mean_across", "loss_scale",
           "clip_grad_norm", "barrier", "checkpoint_views", "load_full_state", "is_fsdp",
           "check_batch_sizes", "NullTracker", "cleanup"]


@dataclass
class DistInfo:
    """Where this process sits. ``fsdp``: the policy is (to be) wrapped with ``fully_shard``."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "single"               # single | torchrun | slurm
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    fsdp: bool = False
    owns_group: bool = False               # this module created the process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# ---------------------------------------------------------------------------------------------
# launcher environment
# ---------------------------------------------------------------------------------------------
def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM hostlist syntax -> host names: ``"gpu[01-03,07],cpu5"`` -> gpu01 gpu02 gpu03 gpu07 cpu5."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?(?:,|$)", nodelist.strip()):
        prefix, ranges = m.group(1), m.group(2)
        if not prefix and not ranges:
            continue
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                width = len(lo)
                hosts += [f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
            elif part:
                hosts.append(f"{prefix}{part}")
    return hosts


def launcher_env(env: dict | None = None) -> dict[str, Any]:
    """``{launcher, rank, world_size, local_rank, master_addr, master_port}`` from the environment."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        return {"launcher": "torchrun", "rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
                "local_rank": int(env.get("LOCAL_RANK", 0)), "master_addr": env.get("MASTER_ADDR", "127.0.0.1"),
                "master_port": int(env.get("MASTER_PORT", 29500))}
    # Inside an `srun` step SLURM_STEP_NUM_TASKS is the step's size; a batch script itself (one
    # process, even when the job asked for many tasks) has no step task count and runs alone.
    world = int(env.get("SLURM_STEP_NUM_TASKS") or 1)
    if world > 1 and "SLURM_PROCID" in env:
        nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
        job = int(env.get("SLURM_JOB_ID", 0) or 0)
        return {"launcher": "slurm", "rank": int(env["SLURM_PROCID"]), "world_size": world,
                "local_rank": int(env.get("SLURM_LOCALID", 0)),
                "master_addr": env.get("MASTER_ADDR") or (nodes[0] if nodes else "127.0.0.1"),
                "master_port": int(env.get("MASTER_PORT") or 29500 + job % 1000)}
    return {"launcher": "single", "rank": 0, "world_size": 1, "local_rank": 0,
            "master_addr": "127.0.0.1", "master_port": 29500}


def _wants_fsdp(trainer_cfg, world: int) -> bool:
    setting = str(cfg_get(trainer_cfg, "fsdp", "auto")).lower()
    dtype = str(cfg_get(trainer_cfg, "dtype", "float32"))
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"trainer.dtype must be float32 or bfloat16, got {dtype}")
    if setting in ("true", "1", "yes"):
        return True
    if setting in ("false", "0", "no"):
        if world > 1:
            raise UserError("trainer.fsdp=false with several processes: data-parallel training "
                            "shards the model with FSDP; drop trainer.fsdp or run one process")
        if dtype == "bfloat16":
            raise UserError("trainer.dtype=bfloat16 uses FSDP's mixed precision: drop trainer.fsdp=false")
        return False
    if setting != "auto":
        raise UserError(f"trainer.fsdp must be auto, true or false, got {setting}")
    return world > 1 or dtype == "bfloat16"


def setup(trainer_cfg=None) -> DistInfo:
    """Initialise torch.distributed when launched with several processes (or when FSDP is wanted
    on one), pick this rank's device. Idempotent: an existing process group is reused."""
    import torch.distributed as dist

    info = launcher_env()
    requested = str(cfg_get(trainer_cfg, "device", "auto"))
    use_cuda = torch.cuda.is_available() if requested == "auto" else requested.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise UserError(f"trainer.device={requested} but no CUDA device is available")
    if use_cuda:
        index = info["local_rank"] if info["world_size"] > 1 or requested in ("auto", "cuda") else \
            torch.device(requested).index or 0
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu" if requested == "auto" else requested)
    fsdp = _wants_fsdp(trainer_cfg, info["world_size"])
    backend = "nccl" if use_cuda else "gloo"
    owns = False
    if (info["world_size"] > 1 or fsdp) and not dist.is_initialized():
        if info["world_size"] > 1:
            os.environ.setdefault("MASTER_ADDR", str(info["master_addr"]))
            os.environ.setdefault("MASTER_PORT", str(info["master_port"]))
            dist.init_process_group(backend=backend, init_method="env://", rank=info["rank"],
                                    world_size=info["world_size"],
                                    device_id=device if use_cuda else None)
        else:   # FSDP on one process (bf16 mixed precision): a private one-process group
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        owns = True
    elif dist.is_initialized() and dist.get_world_size() != info["world_size"]:
        raise UserError(f"torch.distributed is initialised with {dist.get_world_size()} processes but the "
                        f"launcher environment says {info['world_size']}")
    return DistInfo(rank=info["rank"], world_size=info["world_size"], local_rank=info["local_rank"],
                    launcher=info["launcher"], device=device, backend=backend if (owns or dist.is_initialized()) else None,
                    fsdp=fsdp, owns_group=owns)


def cleanup(info: DistInfo) -> None:
    """Destroy the process group this module created (end of ``train``)."""
    import torch.distributed as dist

    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------
def _response_hidden(self, **inputs):
    """Last hidden states of the base model: an FSDP forward method of the root (see module doc)."""
    return getattr(self, self.base_model_prefix)(**inputs).last_hidden_state


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise UserError(f"cannot find the decoder layers of {type(model).__name__} (expected "
                        f"model.{getattr(model, 'base_model_prefix', 'model')}.layers) to shard with FSDP")
    return list(layers)


def is_fsdp(model) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, FSDPModule)


def prepare_model(model, trainer_cfg, info: DistInfo, *, trainable: bool = True):
    """Gradient checkpointing (``trainer.gradient_checkpointing``, trainable models only) and
    FSDP2 sharding (``info.fsdp``): ``fully_shard`` per decoder layer, then the root. The model
    must already be on ``info.device``. Returns the same object (FSDP2 wraps in place)."""
    if trainable and bool(cfg_get(trainer_cfg, "gradient_checkpointing", False)):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not info.fsdp:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(info.device.type, (info.world_size,))
    if str(cfg_get(trainer_cfg, "dtype", "float32")) == "bfloat16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    # The root keeps its parameters gathered after forward: the output projection is used right
    # after the forward (token statistics read lm_head.weight directly) and again in backward.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    model.response_hidden = types.MethodType(_response_hidden, model)
    register_fsdp_forward_method(model, "response_hidden")
    model._is_fsdp_managed_module = True      # transformers' generate: synced_gpus across ranks
    return model


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
    (``core_algos.register_loss_agg``: token counts, response counts; an aggregation that divides
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
    return list(items[info.rank * k:(info.rank + 1) * k])


def check_batch_sizes(trainer_cfg, info: DistInfo) -> None:
    """Prompt counts must split evenly over ranks (each rank holds whole groups)."""
    if info.world_size == 1:
        return
    for key in ("prompts_per_step", "mini_batch_prompts"):
        value = int(trainer_cfg[key])
        if value % info.world_size:
            raise UserError(f"trainer.{key}={value} must be a multiple of the number of processes "
                            f"({info.world_size}) under data-parallel training")


# ---------------------------------------------------------------------------------------------
# checkpoints: a full state dict, written by rank 0
# ---------------------------------------------------------------------------------------------
class _ModelView:
    """What ``checkpoint.save_checkpoint`` needs of a model: ``save_pretrained`` of the full weights."""

    def __init__(self, model, state_dict):
        self.model, self.state_dict_full = model, state_dict

    def save_pretrained(self, path, **kwargs):
        return self.model.save_pretrained(path, state_dict=self.state_dict_full, **kwargs)


class _OptimView:
    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def checkpoint_views(model, optimizer, info: DistInfo):
    """``(model, optimizer)`` to hand to ``checkpoint.save_checkpoint``: the objects themselves
    without FSDP; with FSDP, views holding the full (unsharded, CPU) model and optimizer state
    dicts, gathered from every rank (a collective: every rank must call it; only rank 0 receives
    the tensors)."""
    if not is_fsdp(model):
        return model, optimizer
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=opts)
    return _ModelView(model, model_sd), _OptimView(optim_sd)


def _param_names(model) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def _optim_keys_are_names(state: dict) -> bool:
    groups = state.get("param_groups") or []
    return any(isinstance(p, str) for g in groups for p in g.get("params", []))


def _optim_with_keys(state: dict, keys: list) -> dict:
    """Re-key an optimizer state dict (index <-> parameter name) in ``model.parameters()`` order,
    the order the trainer builds its optimizer in (FSDP keeps it)."""
    old = [p for g in state["param_groups"] for p in g["params"]]
    if len(old) != len(keys):
        raise UserError(f"checkpoint optimizer holds {len(old)} parameters, the model has {len(keys)}: "
                        f"resume with the same model")
    mapping = dict(zip(old, keys))
    return {"state": {mapping[k]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [mapping[p] for p in g["params"]]} for g in state["param_groups"]]}


def load_full_state(model, optimizer, model_state: dict, optim_state: dict | None) -> None:
    """Load full (unsharded) state dicts into a model that may be sharded; every rank passes the
    full dicts (read from the shared checkpoint). Checkpoints are portable between one process
    and FSDP: optimizer states keyed by index (``optimizer.state_dict()``) or by parameter name
    (FSDP's full state dict) are converted as needed."""
    names = _param_names(model)
    if not is_fsdp(model):
        model.load_state_dict(model_state)
        if optim_state is not None:
            if _optim_keys_are_names(optim_state):
                optim_state = _optim_with_keys(optim_state, list(range(len(names))))
            optimizer.load_state_dict(optim_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=opts)
    if optim_state is not None:
        if not _optim_keys_are_names(optim_state):
            optim_state = _optim_with_keys(optim_state, names)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=optim_state, options=opts)


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
