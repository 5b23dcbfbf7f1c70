"""The launchers shipped with entropyrl, all through submitit, registered by name:

- ``debug``: in this process, one job after another (submitit's ``DebugExecutor``). For debugging a
  sweep: tracebacks in your terminal, ``launcher.post_mortem=true`` drops into pdb on a failure.
- ``local``: one process per job on this machine (submitit's ``LocalExecutor``), at most
  ``launcher.max_parallel`` at once.
- ``slurm``: a SLURM job array (``sweeps/slurm.py``).

The protocol and the registry live in ``sweeps/launcher.py``; this module is what the sweep imports
to get them with the built-in launchers registered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import submitit

from ..conf import cfg_get
from ..core.resources import available_cpus
from .launcher import (
    ACTIVE,
    ENDED,
    WAITING,
    Launcher,
    QueueEntry,
    check_number,
    find_launcher,
    get_launcher,
    launcher_names,
    register_launcher,
)
from .slurm import SlurmLauncher

__all__ = ["ACTIVE", "ENDED", "WAITING", "Launcher", "QueueEntry", "check_number", "find_launcher", "get_launcher", "launcher_names",
           "register_launcher", "LocalLauncher", "DebugLauncher", "SlurmLauncher"]


class LocalLauncher(Launcher):
    name = "local"

    def executor(self, cfg: Any, folder: Path) -> submitit.Executor:
        ex = submitit.LocalExecutor(folder, max_num_timeout=int(cfg_get(cfg, "max_num_timeout", 3)))
        ex.update_parameters(timeout_min=float(cfg_get(cfg, "timeout_min", 1440)),
                             signal_delay_s=int(cfg_get(cfg, "signal_delay_s", 30)))
        return ex

    def auto_threads(self, cfg: Any) -> int | None:
        """The machine's cores shared by the jobs running at once."""
        return max(1, available_cpus() // max(1, int(cfg_get(cfg, "max_parallel", 1))))

    def describe(self, cfg: Any) -> str:
        return f"local (at most {cfg_get(cfg, 'max_parallel', 1)} at once)"


class DebugLauncher(Launcher):
    name = "debug"
    in_process = True

    def executor(self, cfg: Any, folder: Path) -> submitit.Executor:
        return submitit.DebugExecutor(folder)

    def parallelism(self, cfg: Any) -> int | None:
        return 1

    def raise_job_errors(self, cfg: Any) -> bool:
        return bool(cfg_get(cfg, "post_mortem", False))  # pdb opens on the first failure

    def describe(self, cfg: Any) -> str:
        return "debug (in this process, one at a time)"


for _builtin in (DebugLauncher(), LocalLauncher(), SlurmLauncher()):
    if find_launcher(_builtin.name) is None:
        register_launcher(_builtin)  # their configs are conf/launcher/<name>.yaml
