"""Where this process sits in a data-parallel run: the launcher's environment (torchrun or SLURM)
and the process group (``setup``/``cleanup``). See ``distributed.py`` for how training is split.

    info = setup(cfg.trainer)        # DistInfo(rank, world_size, device, fsdp, ...)

Every wait on another rank is bounded by ``trainer.collective_timeout_s`` (the process group's
timeout): a rank that died or stalls ends the others' collectives with an error, which
``peer_failure`` turns into one line instead of gloo's traceback (or its 30-minute wait).
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from ...conf import compose
from ...core.errors import UserError

__all__ = [
    "DistInfo",
    "launcher_env",
    "expand_nodelist",
    "node_name",
    "setup",
    "cleanup",
    "collective_timeout_s",
    "peer_failure",
]

DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0  # trainer.collective_timeout_s when unset (NCCL's own default)


@dataclass
class DistInfo:
    """Where this process sits. ``fsdp``: the policy is (to be) wrapped with ``fully_shard``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "single"  # single | torchrun | slurm | local (submitit's local tasks)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    fsdp: bool = False
    owns_group: bool = False  # this module created the process group

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
        return {
            "launcher": "torchrun",
            "rank": int(env["RANK"]),
            "world_size": int(env["WORLD_SIZE"]),
            "local_rank": int(env.get("LOCAL_RANK", 0)),
            "master_addr": env.get("MASTER_ADDR", "127.0.0.1"),
            "master_port": int(env.get("MASTER_PORT", 29500)),
        }
    # submitit's LocalExecutor with tasks_per_node > 1 (``launcher=local launcher.tasks_per_node=N``):
    # N processes on this machine; the port follows the job (its controller's pid), so jobs
    # running side by side do not meet.
    local_world = int(env.get("SUBMITIT_LOCAL_NTASKS") or 1)
    if local_world > 1 and "SUBMITIT_LOCAL_GLOBALID" in env:
        job = int(env.get("SUBMITIT_LOCAL_JOB_ID", 0) or 0)
        return {
            "launcher": "local",
            "rank": int(env["SUBMITIT_LOCAL_GLOBALID"]),
            "world_size": local_world,
            "local_rank": int(env.get("SUBMITIT_LOCAL_LOCALID", 0)),
            "master_addr": env.get("MASTER_ADDR") or "127.0.0.1",
            "master_port": int(env.get("MASTER_PORT") or 20000 + job % 20000),
        }
    # Inside an `srun` step SLURM_STEP_NUM_TASKS is the step's size; a batch script itself (one
    # process, even when the job asked for many tasks) has no step task count and runs alone.
    world = int(env.get("SLURM_STEP_NUM_TASKS") or 1)
    if world > 1 and "SLURM_PROCID" in env:
        nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
        job = int(env.get("SLURM_JOB_ID", 0) or 0)
        return {
            "launcher": "slurm",
            "rank": int(env["SLURM_PROCID"]),
            "world_size": world,
            "local_rank": int(env.get("SLURM_LOCALID", 0)),
            "master_addr": env.get("MASTER_ADDR") or (nodes[0] if nodes else "127.0.0.1"),
            "master_port": int(env.get("MASTER_PORT") or 29500 + job % 1000),
        }
    return {"launcher": "single", "rank": 0, "world_size": 1, "local_rank": 0, "master_addr": "127.0.0.1", "master_port": 29500}


def node_name(env: dict | None = None) -> str:
    """The name of the node this process runs on: SLURM's (``SLURMD_NODENAME``, which tells apart
    several slurmd on one host), else the host name."""
    import socket

    env = os.environ if env is None else env
    return str(env.get("SLURMD_NODENAME") or socket.gethostname())


def _wants_fsdp(trainer_cfg, world: int) -> bool:
    setting = str(trainer_cfg["fsdp"]).lower()
    dtype = str(trainer_cfg["dtype"])
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"trainer.dtype must be float32 or bfloat16, got {dtype}")
    if setting in ("true", "1", "yes"):
        return True
    if setting in ("false", "0", "no"):
        if world > 1:
            raise UserError(
                "trainer.fsdp=false with several processes: data-parallel training "
                "shards the model with FSDP; drop trainer.fsdp or run one process"
            )
        return False  # bfloat16 without FSDP: torch.autocast around the body (stats/policy_stats.py)
    if setting != "auto":
        raise UserError(f"trainer.fsdp must be auto, true or false, got {setting}")
    return world > 1 or dtype == "bfloat16"


def setup(trainer_cfg=None) -> DistInfo:
    """Initialise torch.distributed when launched with several processes (or when FSDP is wanted
    on one), pick this rank's device. Idempotent: an existing process group is reused.
    ``trainer_cfg``: a ``trainer`` section (``device``, ``dtype``, ``fsdp``, ``collective_timeout_s``);
    None: the default ``train`` config's."""
    import torch.distributed as dist

    if trainer_cfg is None:
        trainer_cfg = compose("train", []).trainer

    info = launcher_env()
    requested = str(trainer_cfg["device"])
    use_cuda = torch.cuda.is_available() if requested == "auto" else requested.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise UserError(f"trainer.device={requested} but no CUDA device is available")
    if use_cuda:
        index = (
            info["local_rank"] if info["world_size"] > 1 or requested in ("auto", "cuda") else torch.device(requested).index or 0
        )
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
            timeout = collective_timeout_s(trainer_cfg)
            try:
                dist.init_process_group(
                    backend=backend,
                    init_method="env://",
                    rank=info["rank"],
                    world_size=info["world_size"],
                    device_id=device if use_cuda else None,
                    timeout=datetime.timedelta(seconds=timeout),
                )
            except RuntimeError as exc:  # the other ranks did not all join within the timeout
                if not any(w in str(exc).lower() for w in _TIMED_OUT):
                    raise
                raise UserError(
                    f"rank {info['rank']} of {info['world_size']}: the other ranks did not all join the process group "
                    f"at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within "
                    f"trainer.collective_timeout_s={timeout:g} ({_first_line(exc)}); start every rank with the same "
                    f"MASTER_ADDR/MASTER_PORT and WORLD_SIZE, or raise trainer.collective_timeout_s if some start late"
                ) from None
        else:  # FSDP on one process (bf16 mixed precision): a private one-process group
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        owns = True
    elif dist.is_initialized() and dist.get_world_size() != info["world_size"]:
        raise UserError(
            f"torch.distributed is initialised with {dist.get_world_size()} processes but the "
            f"launcher environment says {info['world_size']}"
        )
    return DistInfo(
        rank=info["rank"],
        world_size=info["world_size"],
        local_rank=info["local_rank"],
        launcher=info["launcher"],
        device=device,
        backend=backend if (owns or dist.is_initialized()) else None,
        fsdp=fsdp,
        owns_group=owns,
    )


def collective_timeout_s(trainer_cfg) -> float:
    """``trainer.collective_timeout_s``: the longest one rank waits on the others (joining the
    group, any collective) before its wait fails."""
    value = trainer_cfg["collective_timeout_s"]
    return DEFAULT_COLLECTIVE_TIMEOUT_S if value is None else float(value)


# What gloo and NCCL say when a peer's process ended (its sockets closed) or a wait ran out.
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote worker crash")
_TIMED_OUT = ("timed out", "timeout", "watchdog")


def _first_line(exc: BaseException) -> str:
    said = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    said = re.sub(r"^\[[^\]]*\]\s*", "", said)  # gloo's "[.../pair.cc:553] " source location
    said = said.split(". ", 1)[0]  # its first sentence: gloo goes on with advice
    return said if len(said) <= 160 else said[:157] + "..."


def peer_failure(
    exc: BaseException,
    info: DistInfo,
    timeout_s: float,
    step: int | None = None,
    saved_step: int = 0,
    *,
    during: str | None = None,
) -> UserError | None:
    """The one line for a collective that failed because another rank died or stalled past
    ``timeout_s``, naming this rank, the cause and the knob, and what the run keeps (``step``: the
    training step that failed, ``saved_step``: the last checkpoint; or, before the first step,
    ``during``: the phase, e.g. "during set-up"); None when ``exc`` is not such a failure (or the
    run has one process)."""
    import torch.distributed as dist

    if info.world_size <= 1 or not isinstance(exc, RuntimeError):
        return None
    text = str(exc).lower()
    gone = any(w in text for w in _PEER_GONE)
    timed_out = not gone and any(w in text for w in _TIMED_OUT)
    if not (gone or (timed_out and ("gloo" in text or "nccl" in text)) or isinstance(exc, dist.DistError)):
        return None
    if gone:
        cause = "another rank's process ended (killed, out of memory or crashed): its own log says why"
    elif not timed_out:
        cause = "another rank died or stalls: its own log says why"
    else:
        cause = (
            f"another rank sent nothing for trainer.collective_timeout_s={timeout_s:g} s (stalled, stopped or far "
            f"slower): if its wait is legitimate, raise trainer.collective_timeout_s"
        )
    if step is None:
        where, kept = (f" {during}" if during else ""), ""
    elif step <= 1:
        where, kept = f" in training step {step}", "; no step had finished yet"
    else:
        where = f" in training step {step}"
        done = "step 1 is" if step == 2 else f"steps 1-{step - 1} are"
        kept = f"; {done} in metrics.jsonl" + (
            f" and the checkpoint at step {saved_step} resumes the run" if saved_step else ", no checkpoint was saved yet"
        )
    return UserError(
        f"rank {info.rank} of {info.world_size}: a collective with the other ranks failed{where} "
        f"({_first_line(exc)}); {cause}{kept}"
    )


def cleanup(info: DistInfo) -> None:
    """Destroy the process group this module created (end of ``train``)."""
    import torch.distributed as dist

    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()
