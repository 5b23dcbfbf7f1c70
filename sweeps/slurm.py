"""The ``slurm`` launcher: one SLURM job per training run, submitted as one job array through
submitit (``AutoExecutor(cluster="slurm")``); ``launcher.array_parallelism`` caps how many run at once.

Jobs are requeued on preemption/timeout (submitit ``Checkpointable``) and resume from their last
checkpoint; they run with this interpreter (``launcher.python``) so they import ``entropyrl`` from
the same checkout/venv. Before submitting, the request is compared with the node sizes ``sinfo``
reports (``launcher.check_request``); while following, a job pending for a reason that cannot
clear by itself (PartitionConfig, ReqNodeNotAvail, InvalidAccount, ...) is named with the
``launcher.*`` key to change.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import submitit
from submitit.core.utils import FailedJobError

from ..conf import cfg_get, to_plain
from ..core.errors import UserError
from ..core.schema import defaults
from ..core.schema.launcher import SlurmLauncherSchema
from .jobs import job_environment
from .launchers import ACTIVE, ENDED, WAITING, Launcher, QueueEntry, declared, register_launcher, tasks_per_node

#: launcher=slurm's keys with their schema defaults (core/schema/launcher.py), for a key a request leaves out
SLURM_KEYS = defaults(SlurmLauncherSchema)

# SLURM job states (squeue %T) in which the job will still run, or is running.
SLURM_WAITING = {
    "PENDING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "CONFIGURING",
    "RESV_DEL_HOLD",
    "SUSPENDED",
    "RESIZING",
    "SPECIAL_EXIT",
    "PREEMPTED",
}
SLURM_ACTIVE = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED"}

# Pending reasons (squeue %r) that no amount of waiting clears, and the launcher key to change.
# PartitionConfig / Resources / ReqNodeNotAvail are explained against the node sizes (sinfo).
NEVER_CLEARS = {
    "PartitionNodeLimit": "launcher.nodes",
    "PartitionTimeLimit": "launcher.timeout_min",
    "PartitionDown": "launcher.partition",
    "PartitionInactive": "launcher.partition",
    "InvalidAccount": "launcher.account",
    "InvalidQOS": "launcher.qos",
    "QOSMaxCpuPerJobLimit": "launcher.cpus_per_task",
    "QOSMaxMemoryPerJob": "launcher.mem_gb",
    "QOSMaxGRESPerJob": "launcher.gpus_per_node",
    "QOSMaxNodePerJobLimit": "launcher.nodes",
    "QOSMaxWallDurationPerJobLimit": "launcher.timeout_min",
    "AssocMaxWallDurationPerJobLimit": "launcher.timeout_min",
    "AssocMaxCpuPerJobLimit": "launcher.cpus_per_task",
    "AssocMaxNodePerJobLimit": "launcher.nodes",
    "BadConstraints": "launcher.additional_parameters.constraint",
}


@dataclass
class PartitionSize:
    """The largest node of a partition (``sinfo``) and its limits."""

    name: str
    cpus: int
    mem_mb: int
    gpus: int
    nodes: int
    time_limit_min: float | None  # None: infinite


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _gpus(gres: str) -> int:
    """``gpu:a100:4(S:0-1),gpu:2`` -> 6; ``(null)`` -> 0."""
    return sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,()]+)?:(\d+)", gres or ""))


def _minutes(limit: str) -> float | None:
    """SLURM time (``infinite``, ``1-00:00:00``, ``2:00:00``, ``30:00``, ``30``) in minutes."""
    limit = limit.strip()
    if not limit or limit.lower() in ("infinite", "unlimited", "n/a"):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    h, m, s = ([0.0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0.0, parts[0], 0.0)
    return (float(days) if days else 0.0) * 1440 + h * 60 + m + s / 60


def partition_sizes() -> tuple[dict[str, PartitionSize], str | None] | None:
    """``({partition: PartitionSize}, default partition)`` from ``sinfo``; None if it cannot be asked."""
    nodes = _run(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%m|%G"])
    limits = _run(["sinfo", "-h", "-o", "%P|%l"])
    if nodes is None or limits is None:
        return None
    sizes: dict[str, PartitionSize] = {}
    default = None
    for line in nodes.splitlines():
        try:
            _, part, cpus, mem, gres = line.strip().split("|")
            p = part.rstrip("*")
            default = p if part.endswith("*") else default
            size = sizes.setdefault(p, PartitionSize(p, 0, 0, 0, 0, None))
            size.cpus = max(size.cpus, int(cpus.rstrip("+")))
            size.mem_mb = max(size.mem_mb, int(mem.rstrip("+")))
            size.gpus = max(size.gpus, _gpus(gres))
            size.nodes += 1
        except ValueError:
            continue
    for line in limits.splitlines():
        part, _, limit = line.strip().partition("|")
        if part.rstrip("*") in sizes:
            try:
                sizes[part.rstrip("*")].time_limit_min = _minutes(limit)
            except ValueError:
                pass
    return sizes, default


def oversized(cfg: Any, sizes: dict[str, PartitionSize], default: str | None) -> str | None:
    """The first part of the request no node of the target partition can hold, as one line naming
    the launcher key and the largest value that fits; None when it fits."""
    name = str(declared(cfg, "partition", SLURM_KEYS) or default or "")
    part = sizes.get(name)
    if part is None:
        if cfg_get(cfg, "partition"):
            return (
                f"launcher.partition={name} is not a partition of this cluster; "
                f"set launcher.partition to one of: {', '.join(sorted(sizes))}"
            )
        return None
    where = f"the largest node of partition {name}"
    cpus = int(declared(cfg, "cpus_per_task", SLURM_KEYS) or 0)
    if cpus > part.cpus:
        return f"launcher.cpus_per_task={cpus} exceeds {where} ({part.cpus} CPUs); set launcher.cpus_per_task<={part.cpus}"
    tasks = tasks_per_node(cfg)
    if tasks * max(cpus, 1) > part.cpus:
        return (
            f"launcher.tasks_per_node={tasks} x launcher.cpus_per_task={max(cpus, 1)} exceeds {where} "
            f"({part.cpus} CPUs); set launcher.tasks_per_node<={max(part.cpus // max(cpus, 1), 1)}"
            + (" or lower launcher.cpus_per_task" if cpus > 1 else "")
        )
    mem = float(declared(cfg, "mem_gb", SLURM_KEYS) or 0)
    if part.mem_mb and mem * 1024 > part.mem_mb:
        return (
            f"launcher.mem_gb={mem:g} exceeds {where} ({part.mem_mb / 1024:.1f} GB); "
            f"set launcher.mem_gb<={int(part.mem_mb // 1024)}"
        )
    gpus = int(declared(cfg, "gpus_per_node", SLURM_KEYS) or 0)
    if gpus > part.gpus:
        return f"launcher.gpus_per_node={gpus} exceeds {where} ({part.gpus} GPUs); set launcher.gpus_per_node<={part.gpus}"
    nodes = int(declared(cfg, "nodes", SLURM_KEYS))
    if nodes > part.nodes:
        return f"launcher.nodes={nodes} exceeds partition {name} ({part.nodes} nodes); set launcher.nodes<={part.nodes}"
    minutes = float(declared(cfg, "timeout_min", SLURM_KEYS) or 0)
    if part.time_limit_min is not None and minutes > part.time_limit_min:
        return (
            f"launcher.timeout_min={minutes:g} exceeds partition {name}'s time limit "
            f"({part.time_limit_min:g} min); set launcher.timeout_min<={int(part.time_limit_min)}"
        )
    return None


class SlurmLauncher(Launcher):
    name = "slurm"
    detached = True
    scheduler = "SLURM"

    def executor(self, cfg: Any, folder: Path) -> submitit.Executor:
        if shutil.which("sbatch") is None:
            raise UserError(
                "launcher=slurm but `sbatch` is not on PATH: run on a SLURM login node, or use "
                "launcher=local (tests: tests/slurm/start.sh starts a one-node cluster)"
            )
        python = cfg_get(cfg, "python") or sys.executable
        ex = submitit.AutoExecutor(
            folder=folder,
            cluster="slurm",
            slurm_python=shlex.quote(str(python)),
            slurm_max_num_timeout=int(cfg["max_num_timeout"]),
        )
        params: dict[str, Any] = {
            "name": str(cfg["job_name"]),
            "timeout_min": int(cfg["timeout_min"]),
            "nodes": int(cfg["nodes"]),
            # one task per rank: srun starts them all, each reads its rank from SLURM_PROCID
            "tasks_per_node": self.tasks_per_node(cfg),
            "slurm_array_parallelism": int(cfg["array_parallelism"]),
            "slurm_signal_delay_s": int(cfg["signal_delay_s"]),
            "slurm_use_srun": bool(cfg["use_srun"]),
        }
        if cfg_get(cfg, "cpus_per_task"):
            params["cpus_per_task"] = int(cfg["cpus_per_task"])
        if cfg_get(cfg, "gpus_per_node"):
            params["gpus_per_node"] = int(cfg["gpus_per_node"])
        if cfg_get(cfg, "mem_gb"):
            params["mem_gb"] = float(cfg["mem_gb"])
        for key in ("partition", "account", "qos"):
            if cfg_get(cfg, key):
                params[f"slurm_{key}"] = str(cfg[key])
        # The job must import entropyrl from this checkout and reuse the warm model cache; the
        # callable also sets its environment itself (TrainJob.env), these lines help anything before it.
        setup = [str(s) for s in (to_plain(cfg["setup"]) or [])]
        params["slurm_setup"] = [f"export {k}={shlex.quote(v)}" for k, v in sorted(job_environment().items())] + setup
        extra = to_plain(cfg["additional_parameters"]) or {}
        if extra:
            params["slurm_additional_parameters"] = {str(k): v for k, v in extra.items()}
        try:
            ex.update_parameters(**params)
        except (ValueError, TypeError) as exc:
            raise UserError(f"bad launcher=slurm setting: {str(exc).splitlines()[0]}") from None
        return ex

    def parallelism(self, cfg: Any) -> int | None:
        return None  # one array; SLURM runs at most array_parallelism of it at once

    def auto_threads(self, cfg: Any) -> int | None:
        return int(declared(cfg, "cpus_per_task", SLURM_KEYS) or 0) or None

    def describe(self, cfg: Any) -> str:
        bits = [f"partition={declared(cfg, 'partition', SLURM_KEYS) or 'default'}", f"{self.world_size(cfg)} rank(s) per job"]
        for key in ("nodes", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min", "array_parallelism"):
            if cfg_get(cfg, key):
                bits.append(f"{key}={cfg[key]}")
        return "slurm (" + ", ".join(bits) + ")"

    def check(self, cfg: Any) -> None:
        if not bool(declared(cfg, "check_request", SLURM_KEYS)) or shutil.which("sinfo") is None:
            return
        found = partition_sizes()
        if found is None:
            return  # the controller does not answer: sbatch will say so
        problem = oversized(cfg, *found)
        if problem:
            raise UserError(f"{problem} (no job of this sweep could ever start; launcher.check_request=false submits anyway)")

    def submit(self, executor: submitit.Executor, callables: Sequence[Any]) -> list[submitit.Job]:
        try:
            with executor.batch():  # one job array
                jobs = [executor.submit(c) for c in callables]
        except FailedJobError as exc:
            lines = [ln.split("error:", 1)[-1].strip() for ln in str(exc).splitlines() if "error:" in ln]
            said = "; ".join(dict.fromkeys(lines)) or str(exc).strip().splitlines()[0][:300]
            hint = (
                "is the SLURM controller up? (`sinfo`)"
                if re.search(r"contact|connect|timed out", said, re.I)
                else "check launcher.partition, cpus_per_task, mem_gb, gpus_per_node, additional_parameters"
            )
            raise UserError(f"sbatch refused the sweep's jobs: {said} ({hint})") from None
        return jobs

    def queue(self, job_ids: Sequence[str]) -> dict[str, QueueEntry] | None:
        """From ``squeue -t all`` (array tasks as ``123_4``); None when SLURM cannot be asked."""
        ids = sorted({str(j) for j in job_ids if j})
        if not ids:
            return {}
        if shutil.which("squeue") is None:
            return None
        try:
            # by array id: an array cancelled before its tasks were split off is listed as "123" only
            arrays = sorted({i.split("_")[0] for i in ids})
            out = subprocess.run(
                ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r", "-j", ",".join(arrays)],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            # squeue errors out when *every* id is unknown ("Invalid job id specified"): all forgotten.
            return {} if "Invalid job id" in out.stderr else None
        entries: dict[str, QueueEntry] = {}
        for line in out.stdout.splitlines():
            parts = line.strip().split("|", 2)
            if len(parts) < 2:
                continue
            state = parts[1].split()[0] if parts[1] else ""
            reason = parts[2].strip() if len(parts) > 2 else ""
            phase = WAITING if state in SLURM_WAITING else ACTIVE if state in SLURM_ACTIVE else ENDED
            entries[parts[0]] = QueueEntry(phase, state, "" if reason in ("None", "(null)") else reason)
        for task in ids:
            if task not in entries and task.split("_")[0] in entries:
                entries[task] = entries[task.split("_")[0]]
        return entries

    def stuck(self, cfg: Any, entry: QueueEntry) -> str | None:
        reason = entry.reason.split(",")[0].strip()
        if reason in NEVER_CLEARS:
            key = NEVER_CLEARS[reason]
            now = cfg_get(cfg, key.split(".")[1])
            return f"change {key}" + (f" (now {now})" if isinstance(now, (int, float, str)) else "")
        if reason not in ("PartitionConfig", "Resources", "ReqNodeNotAvail"):
            return None
        found = self._sizes()
        problem = oversized(cfg, *found) if found else None
        if problem:
            return problem
        if reason == "PartitionConfig":
            return (
                "the request does not fit partition "
                f"{declared(cfg, 'partition', SLURM_KEYS) or 'default'}'s configuration; change launcher.cpus_per_task, "
                f"mem_gb, gpus_per_node, nodes, timeout_min or partition"
            )
        if reason == "ReqNodeNotAvail":
            return (
                "the nodes this job asks for are unavailable (down, drained or reserved); change "
                "launcher.partition or launcher.additional_parameters (nodelist/exclude)"
            )
        return None  # Resources: waiting for busy nodes

    def _sizes(self) -> tuple[dict[str, PartitionSize], str | None] | None:
        """``partition_sizes()``, asked at most once a minute (every waiting job of every poll may ask)."""
        cached = getattr(self, "_sizes_cache", None)
        if cached is None or time.time() - cached[0] > 60:
            cached = self._sizes_cache = (time.time(), partition_sizes())
        return cached[1]

    def cancel(self, job_ids: Sequence[str], handles: Sequence[submitit.Job]) -> None:
        ids = sorted({str(j) for j in job_ids if j})
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60)


register_launcher(SlurmLauncher())  # its config: conf/launcher/slurm.yaml
