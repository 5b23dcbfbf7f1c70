"""The launchers shipped with entropyrl, all through submitit, registered by name:

- ``debug``: in this process, one job after another (submitit's ``DebugExecutor``). For debugging a
  sweep: tracebacks in your terminal, ``launcher.post_mortem=true`` drops into pdb on a failure.
- ``local``: one process per job on this machine (submitit's ``LocalExecutor``), at most
  ``launcher.max_parallel`` at once; ``launcher.tasks_per_node=N`` runs each job as N
  data-parallel processes (gloo on CPU, ranks from submitit's ``SUBMITIT_LOCAL_*`` environment).
- ``slurm``: a SLURM job array (``sweeps/slurm.py``).

The protocol and the registry live in ``sweeps/launcher.py``; this module is what the sweep imports
to get them with the built-in launchers registered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import submitit

from ..conf import cfg_get
from ..core.errors import UserError
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
                             signal_delay_s=int(cfg_get(cfg, "signal_delay_s", 30)),
                             tasks_per_node=self.tasks_per_node(cfg))
        return ex

    def auto_threads(self, cfg: Any) -> int | None:
        """The machine's cores shared by the processes running at once (jobs x ranks)."""
        return max(1, available_cpus() // max(1, int(cfg_get(cfg, "max_parallel", 1)) * self.tasks_per_node(cfg)))

    def check(self, cfg: Any) -> None:
        nodes, tasks = int(cfg_get(cfg, "nodes", 1) or 1), self.tasks_per_node(cfg)
        if nodes != 1:
            raise UserError(f"launcher.nodes={nodes}: launcher=local runs on this machine only; set launcher.nodes=1 "
                            f"(or launcher=slurm for several nodes)")
        parallel, cpus = max(1, int(cfg_get(cfg, "max_parallel", 1))), available_cpus()
        if tasks * parallel > cpus:
            raise UserError(f"launcher.tasks_per_node={tasks} x launcher.max_parallel={parallel} processes exceed "
                            f"the {cpus} CPUs this machine lets us use; set launcher.tasks_per_node<="
                            f"{max(1, cpus // parallel)}" + (" or lower launcher.max_parallel" if parallel > 1 else ""))

    def describe(self, cfg: Any) -> str:
        tasks = self.tasks_per_node(cfg)
        return f"local (at most {cfg_get(cfg, 'max_parallel', 1)} at once" + (f", {tasks} ranks each)" if tasks > 1 else ")")


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
