"""Launchers: where a sweep's jobs run, all through submitit.

- ``debug``: in this process, one job after another (submitit's ``DebugExecutor``). For debugging a
  sweep: tracebacks in your terminal, ``launcher.post_mortem=true`` drops into pdb on a failure.
- ``local``: one process per job on this machine (submitit's ``LocalExecutor``), at most
  ``launcher.max_parallel`` at once.
- ``slurm``: one SLURM job per training run, submitted as one job array (submitit's
  ``AutoExecutor(cluster="slurm")``); ``launcher.array_parallelism`` caps how many run at once.
  Jobs are requeued on preemption/timeout (submitit ``Checkpointable``) and resume from their last
  checkpoint; the jobs run with this interpreter (``launcher.python``) so they import ``entropyrl``
  from the same checkout/venv.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from entropyrl.conf import cfg_get, to_plain
from entropyrl.errors import UserError
from entropyrl.resources import available_cpus

KNOWN = ("debug", "local", "slurm")


def threads_per_job(launcher: DictConfig | dict) -> int | None:
    """torch threads each job should use (``trainer.threads``), so parallel jobs do not fight over
    cores: local = cores / max_parallel, slurm = cpus_per_task, debug = leave torch's default."""
    value = cfg_get(launcher, "threads_per_job", "auto")
    name = str(cfg_get(launcher, "name", "local"))
    if value != "auto":
        return int(value) or None
    if name == "local":
        return max(1, available_cpus() // max(1, int(cfg_get(launcher, "max_parallel", 1))))
    if name == "slurm":
        return int(cfg_get(launcher, "cpus_per_task", 0)) or None
    return None


def max_in_flight(launcher: DictConfig | dict) -> int | None:
    """How many jobs the sweep process keeps submitted at once (None: all; SLURM throttles arrays)."""
    name = str(cfg_get(launcher, "name", "local"))
    if name == "local":
        n = int(cfg_get(launcher, "max_parallel", 1))
        if n < 1:
            raise UserError(f"launcher.max_parallel must be >= 1 (got {n})")
        return n
    if name == "debug":
        return 1
    return None


def make_executor(launcher: DictConfig | dict, folder: Path):
    """A submitit executor configured from the ``launcher`` config group."""
    import submitit

    name = str(cfg_get(launcher, "name", "local"))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if name == "debug":
        return submitit.DebugExecutor(folder)
    if name == "local":
        ex = submitit.LocalExecutor(folder, max_num_timeout=int(cfg_get(launcher, "max_num_timeout", 3)))
        ex.update_parameters(timeout_min=float(cfg_get(launcher, "timeout_min", 1440)),
                             signal_delay_s=int(cfg_get(launcher, "signal_delay_s", 30)))
        return ex
    if name == "slurm":
        return _slurm_executor(launcher, folder)
    raise UserError(f"unknown launcher '{name}'; valid: {', '.join(KNOWN)}")


def _slurm_executor(launcher: DictConfig | dict, folder: Path):
    import shutil

    import submitit

    if shutil.which("sbatch") is None:
        raise UserError("launcher=slurm but `sbatch` is not on PATH: run on a SLURM login node, or use "
                        "launcher=local (tests: tests/slurm/start.sh starts a one-node cluster)")
    python = cfg_get(launcher, "python") or sys.executable
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_python=shlex.quote(str(python)),
                               slurm_max_num_timeout=int(cfg_get(launcher, "max_num_timeout", 3)))
    params: dict[str, Any] = {
        "name": str(cfg_get(launcher, "job_name", "entropyrl")),
        "timeout_min": int(cfg_get(launcher, "timeout_min", 240)),
        "nodes": int(cfg_get(launcher, "nodes", 1)),
        "tasks_per_node": 1,
        "slurm_array_parallelism": int(cfg_get(launcher, "array_parallelism", 16)),
        "slurm_signal_delay_s": int(cfg_get(launcher, "signal_delay_s", 90)),
        "slurm_use_srun": bool(cfg_get(launcher, "use_srun", True)),
    }
    if cfg_get(launcher, "cpus_per_task"):
        params["cpus_per_task"] = int(launcher["cpus_per_task"])
    if cfg_get(launcher, "gpus_per_node"):
        params["gpus_per_node"] = int(launcher["gpus_per_node"])
    if cfg_get(launcher, "mem_gb"):
        params["mem_gb"] = float(launcher["mem_gb"])
    for key in ("partition", "account", "qos"):
        if cfg_get(launcher, key):
            params[f"slurm_{key}"] = str(launcher[key])
    setup = [str(s) for s in (to_plain(cfg_get(launcher, "setup", [])) or [])]
    # The job must import entropyrl from this checkout and reuse the warm model cache; the callable
    # also sets its environment itself (TrainJob.env), these lines help anything run before it.
    from entropyrl.sweeps.jobs import job_environment

    env = job_environment()
    setup = [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())] + setup
    params["slurm_setup"] = setup
    extra = to_plain(cfg_get(launcher, "additional_parameters", {})) or {}
    if extra:
        params["slurm_additional_parameters"] = {str(k): v for k, v in extra.items()}
    try:
        ex.update_parameters(**params)
    except (ValueError, TypeError) as exc:
        raise UserError(f"bad launcher=slurm setting: {str(exc).splitlines()[0]}") from None
    return ex


def describe(launcher: DictConfig | dict) -> str:
    name = str(cfg_get(launcher, "name", "local"))
    if name == "local":
        return f"local (at most {cfg_get(launcher, 'max_parallel', 1)} at once)"
    if name == "slurm":
        bits = [f"partition={cfg_get(launcher, 'partition', 'default')}"]
        for key in ("gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min", "array_parallelism"):
            if cfg_get(launcher, key):
                bits.append(f"{key}={launcher[key]}")
        return "slurm (" + ", ".join(bits) + ")"
    return "debug (in this process, one at a time)"
