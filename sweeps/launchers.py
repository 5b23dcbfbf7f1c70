"""Where a sweep's jobs run: the ``Launcher`` protocol, the registry of launchers by name, and the
launchers shipped with entropyrl (all through submitit).

- ``debug``: in this process, one job after another (submitit's ``DebugExecutor``). For debugging a
  sweep: tracebacks in your terminal, ``launcher.post_mortem=true`` drops into pdb on a failure.
- ``local``: one process per job on this machine (submitit's ``LocalExecutor``), at most
  ``launcher.max_parallel`` at once; ``launcher.tasks_per_node=N`` runs each job as N
  data-parallel processes (gloo on CPU, ranks from submitit's ``SUBMITIT_LOCAL_*`` environment).
  With ``launcher.warm_start`` (one rank per job) each job's process is forked from the sweep's
  warm worker, which has imported the job's libraries once (``WarmLocalExecutor``, ``warm_worker.py``).
- ``slurm``: a SLURM job array (``sweeps/slurm.py``, which registers itself; imported when the
  registry is first read).

A launcher turns the ``launcher`` config group (``conf/launcher/<name>.yaml``, or the defaults
given to ``register_launcher``) into a submitit executor and answers the few questions the sweep
asks about it: how many jobs to keep in flight, how many torch threads each job gets, where a
submitted job stands in the scheduler's queue (and whether a waiting job can ever start), how to
cancel jobs, and a one-line description. ``sweeps/`` never branches on a launcher's name.

Adding one (see CONTRIBUTING.md): subclass ``Launcher``, set ``name`` and the behaviour flags,
implement ``executor`` (and ``queue``/``stuck``/``cancel`` for a scheduler), then
``register_launcher(MyLauncher(), defaults={...})``; ``entropyrl sweep launcher=<name>`` works::

    class Mine(Launcher):
        name = "mine"
        def executor(self, cfg, folder):
            return submitit.LocalExecutor(folder)
    register_launcher(Mine(), defaults={"max_parallel": 2})
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import submitit
from hydra.core.config_store import ConfigStore

from ..conf import cfg_get
from ..core.errors import UserError
from ..core.registry import Registry
from ..core.resources import available_cpus
from ..core.schema import defaults
from ..core.schema.launcher import LauncherName, LocalParallel, Ranks, Threads
from .warm_worker import Worker

# Where a job stands in a scheduler's queue (``QueueEntry.phase``).
WAITING, ACTIVE, ENDED = "waiting", "active", "ended"


@dataclass(frozen=True)
class QueueEntry:
    """One job as its scheduler sees it."""

    phase: str  # waiting (will or may still run) | active (running) | ended
    state: str  # the scheduler's own word, e.g. SLURM's PENDING, RUNNING, CANCELLED
    reason: str = ""  # why it waits, in the scheduler's words (SLURM's %r), e.g. Priority


#: The keys the base ``Launcher``'s methods read, with the defaults the run schema declares for them
#: (core/schema/launcher.py): a launcher a plugin registers may keep only its own keys in its section.
SHARED_KEYS: dict[str, Any] = {k: v for cls in (LauncherName, Ranks, Threads, LocalParallel) for k, v in defaults(cls).items()}


def declared(cfg: Any, key: str, declared_defaults: dict[str, Any] = SHARED_KEYS) -> Any:
    """``cfg``'s value of ``key`` (a null included: it means what its doc says), else the default
    ``declared_defaults`` holds for it (a schema's ``defaults``), never one written here."""
    if cfg is None:
        return declared_defaults[key]
    if hasattr(cfg, "get"):
        return cfg[key] if key in cfg else declared_defaults[key]
    return getattr(cfg, key) if hasattr(cfg, key) else declared_defaults[key]


class Launcher:
    """Base of every launcher; the defaults fit a launcher that runs jobs as local processes.

    Flags (class attributes):
      ``in_process``: jobs run inside the sweep process, one after another, when their result is
      asked for (submitit's DebugExecutor); their own train.log is their log.
      ``detached``: jobs belong to a scheduler and outlive the sweep process: ``--no-wait`` is
      allowed, Ctrl-C leaves them running, a re-run adopts the ones still in ``queue``.
    """

    name: str = ""
    in_process: bool = False
    detached: bool = False
    scheduler: str = ""  # how job states are labelled, e.g. "SLURM" -> "SLURM PENDING (Priority)"

    # The launcher keys that are numbers, checked when present:
    # key -> (integer, minimum, strict: > instead of >=, nullable). Subclasses add their own.
    numbers: dict[str, tuple[bool, float, bool, bool]] = {
        "max_parallel": (True, 1, False, False),
        "timeout_min": (False, 0, True, False),
        "max_num_timeout": (True, 0, False, False),
        "signal_delay_s": (True, 0, False, False),
        "nodes": (True, 1, False, False),
        "tasks_per_node": (True, 1, False, True),
        "gpus_per_node": (True, 0, False, True),
        "cpus_per_task": (True, 1, False, True),
        "mem_gb": (False, 0, True, True),
        "array_parallelism": (True, 1, False, False),
        "stuck_after_s": (False, 0, False, False),
    }

    # -- what every launcher provides -------------------------------------------------------------
    def check_values(self, cfg: Any) -> None:
        """Refuse (``UserError``) a launcher value of the wrong type or range, naming the key."""
        for key, (integer, minimum, strict, nullable) in self.numbers.items():
            if key in cfg:
                check_number(f"launcher.{key}", cfg[key], integer=integer, minimum=minimum, strict=strict, nullable=nullable)
        self.threads(cfg)
        tasks, gpus = self.tasks_per_node(cfg), int(cfg_get(cfg, "gpus_per_node", 0) or 0)
        if gpus and tasks > gpus:
            raise UserError(
                f"launcher.tasks_per_node={tasks} exceeds launcher.gpus_per_node={gpus} (one GPU per "
                f"rank); set launcher.tasks_per_node<={gpus} or launcher.gpus_per_node>={tasks}"
            )

    def tasks_per_node(self, cfg: Any) -> int:
        return tasks_per_node(cfg)

    def world_size(self, cfg: Any) -> int:
        """Data-parallel ranks of one job: ``launcher.nodes`` x ``tasks_per_node``."""
        return int(declared(cfg, "nodes")) * self.tasks_per_node(cfg)

    def executor(self, cfg: Any, folder: Path) -> submitit.Executor:
        """A submitit executor configured from the ``launcher`` config (``cfg``), logs under ``folder``."""
        raise NotImplementedError

    def parallelism(self, cfg: Any) -> int | None:
        """How many jobs the sweep process keeps submitted at once; None: submit all (the scheduler
        throttles them)."""
        n = int(declared(cfg, "max_parallel"))
        if n < 1:
            raise UserError(f"launcher.max_parallel must be >= 1 (got {n})")
        return n

    def threads(self, cfg: Any) -> int | None:
        """torch threads per job (``trainer.threads``), so parallel jobs do not fight over cores:
        ``launcher.threads_per_job`` (``auto`` = ``auto_threads``; 0 = torch's default = None)."""
        value = declared(cfg, "threads_per_job")
        if value == "auto":
            return self.auto_threads(cfg)
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise UserError(f"launcher.threads_per_job must be auto or an integer >= 0 (got {value!r})") from None
        if n < 0:
            raise UserError(f"launcher.threads_per_job must be auto or an integer >= 0 (got {n})")
        return n or None

    def auto_threads(self, cfg: Any) -> int | None:
        return None

    def describe(self, cfg: Any) -> str:
        return self.name

    def check(self, cfg: Any) -> None:
        """Refuse (``UserError``) a request that can never run, before anything is submitted."""

    def raise_job_errors(self, cfg: Any) -> bool:
        """Whether a failing job raises (the executor then marks it failed); False: it returns its error."""
        return True

    def submit(self, executor: submitit.Executor, callables: Sequence[Any]) -> list[submitit.Job]:
        return [executor.submit(c) for c in callables]

    # -- what a scheduler adds --------------------------------------------------------------------
    def queue(self, job_ids: Sequence[str]) -> dict[str, QueueEntry] | None:
        """``{job_id: QueueEntry}`` for the jobs the scheduler still knows (forgotten ones absent);
        None when there is no queue to ask (then the job's files and pid tell its state)."""
        return None

    def stuck(self, cfg: Any, entry: QueueEntry) -> str | None:
        """For a waiting job: why it can never start and which ``launcher.*`` key to change (one
        line), or None when the wait may clear by itself."""
        return None

    def cancel(self, job_ids: Sequence[str], handles: Sequence[submitit.Job]) -> None:
        """Stop these jobs (``handles``: the submitit jobs this process submitted)."""
        for job in handles:
            try:
                job.cancel(check=False)
            except Exception:  # noqa: BLE001 - already gone
                pass


class LocalLauncher(Launcher):
    """One submitit controller process per job, on this machine.

    Ctrl-C in a terminal sends SIGINT to the whole process group: to the sweep, to each job's
    training processes and to submitit's controller between them, which on SIGINT kills its tasks
    a second later (SIGKILL: no checkpoint, no summary, the job's MLflow run left RUNNING). So the
    controllers start with SIGINT ignored (``submit``) and the sweep alone stops its jobs
    (``following``: a stop signal to each training process, which ends its step, checkpoints and
    closes its run); ``cancel`` reaches a controller by SIGTERM, which it passes on to its tasks."""

    name = "local"

    def submit(self, executor: submitit.Executor, callables: Sequence[Any]) -> list[submitit.Job]:
        if threading.current_thread() is not threading.main_thread():
            return super().submit(executor, callables)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the controllers started here
        try:
            return super().submit(executor, callables)
        finally:
            signal.signal(signal.SIGINT, previous)

    def cancel(self, job_ids: Sequence[str], handles: Sequence[submitit.Job]) -> None:
        """SIGTERM to each job's controller, which passes it on to the job's processes (submitit's own
        cancel is a SIGINT, which the controller ignores: see the class docstring)."""
        for job in handles:
            process = getattr(job, "_process", None)
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(OSError):
                process.send_signal(signal.SIGTERM)

    def warm_start(self, cfg: Any) -> bool:
        """Whether jobs are forked from a warm worker: ``launcher.warm_start``, one rank per job."""
        return bool(cfg_get(cfg, "warm_start")) and self.tasks_per_node(cfg) == 1  # absent: cold

    def executor(self, cfg: Any, folder: Path) -> submitit.Executor:
        kind = WarmLocalExecutor if self.warm_start(cfg) else submitit.LocalExecutor
        ex = kind(folder, max_num_timeout=int(cfg["max_num_timeout"]))
        ex.update_parameters(
            timeout_min=float(cfg["timeout_min"]),
            signal_delay_s=int(cfg["signal_delay_s"]),
            tasks_per_node=self.tasks_per_node(cfg),
        )
        return ex

    def auto_threads(self, cfg: Any) -> int | None:
        """The machine's cores shared by the processes running at once (jobs x ranks)."""
        return max(1, available_cpus() // max(1, int(declared(cfg, "max_parallel")) * self.tasks_per_node(cfg)))

    def check(self, cfg: Any) -> None:
        nodes, tasks = int(declared(cfg, "nodes")), self.tasks_per_node(cfg)
        warm = cfg_get(cfg, "warm_start")
        if warm is not None and not isinstance(warm, bool):
            raise UserError(f"launcher.warm_start must be true or false (got {warm!r})")
        if nodes != 1:
            raise UserError(
                f"launcher.nodes={nodes}: launcher=local runs on this machine only; set launcher.nodes=1 "
                f"(or launcher=slurm for several nodes)"
            )
        parallel, cpus = max(1, int(declared(cfg, "max_parallel"))), available_cpus()
        if tasks * parallel > cpus:
            raise UserError(
                f"launcher.tasks_per_node={tasks} x launcher.max_parallel={parallel} processes exceed "
                f"the {cpus} CPUs this machine lets us use; set launcher.tasks_per_node<="
                f"{max(1, cpus // parallel)}" + (" or lower launcher.max_parallel" if parallel > 1 else "")
            )

    def describe(self, cfg: Any) -> str:
        tasks = self.tasks_per_node(cfg)
        start = "forked from a warm worker" if self.warm_start(cfg) else "started cold"
        ranks = f", {tasks} ranks each" if tasks > 1 else ""
        return f"local (at most {declared(cfg, 'max_parallel')} at once{ranks}), each job {start}"


class WarmLocalExecutor(submitit.LocalExecutor):
    """submitit's ``LocalExecutor`` whose job processes are forked from a warm worker
    (``warm_worker.py``), started at the first submission with this process's environment (the
    one a cold job imports its libraries with); controllers, job ids, logs and results as submitit's.
    The worker takes no new job once this executor is gone."""

    def __init__(self, folder: str | Path, max_num_timeout: int = 3) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout)
        self.worker: Worker | None = None

    @property
    def _submitit_command_str(self) -> str:
        if self.worker is None:
            gpus, visible = self.parameters.get("gpus_per_node", 0), self.parameters.get("visible_gpus", ())
            devices = ",".join(str(k) for k in (range(gpus) if visible == () else visible[:gpus]))
            self.worker = Worker(self.folder, {**os.environ, "CUDA_VISIBLE_DEVICES": devices})  # as a job's controller sets it
            weakref.finalize(self, self.worker.close)
        return self.worker.command()


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


def tasks_per_node(cfg: Any) -> int:
    """Ranks per node of one job: ``launcher.tasks_per_node``, else one per GPU (``gpus_per_node``),
    else 1."""
    value = declared(cfg, "tasks_per_node")
    if value is not None:
        return int(value)
    return int(cfg_get(cfg, "gpus_per_node", 0) or 0) or 1


def check_number(key: str, value: Any, *, integer: bool, minimum: float, strict: bool = False, nullable: bool = False) -> None:
    """``UserError`` unless ``value`` is a number (an integer if ``integer``) >= ``minimum``
    (> if ``strict``), or None when ``nullable``."""
    if value is None and nullable:
        return
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if is_number and (not integer or float(value).is_integer()) and (value > minimum if strict else value >= minimum):
        return
    kind = "an integer" if integer else "a number"
    raise UserError(
        f"{key}={value!r} is not allowed: {key} must be {kind} {'>' if strict else '>='} {minimum:g}"
        + (" or null" if nullable else "")
    )


_REGISTRY: Registry = Registry("launcher")
_BUILTINS_REGISTERED: list[bool] = []


def register_launcher(launcher: Launcher, defaults: dict | None = None) -> Launcher:
    """Make ``launcher=<launcher.name>`` usable by ``entropyrl sweep``.

    ``defaults``: the launcher's config keys, for a launcher without ``conf/launcher/<name>.yaml``
    (they become that config group option; ``name`` is added).
    """
    if not launcher.name:
        raise ValueError("a launcher needs a name")
    _builtins()[launcher.name] = launcher
    if defaults is not None:
        ConfigStore.instance().store(group="launcher", name=launcher.name, node={"name": launcher.name, **defaults})
    return launcher


#: Modules of launchers built on this one that register themselves when imported (``slurm.py`` ends
#: with its ``register_launcher``); imported on the registry's first use, so neither imports the other
#: while it loads.
LAUNCHER_MODULES = ("entropyrl.sweeps.slurm",)


def _builtins() -> dict[str, Launcher]:
    """The registry, with the shipped launchers in it (their configs are conf/launcher/<name>.yaml)."""
    if not _BUILTINS_REGISTERED:
        _BUILTINS_REGISTERED.append(True)
        for builtin in (DebugLauncher(), LocalLauncher()):
            _REGISTRY.setdefault(builtin.name, builtin)
        for module in LAUNCHER_MODULES:
            importlib.import_module(module)
    return _REGISTRY


def launcher_names() -> list[str]:
    return sorted(_builtins())


def find_launcher(name: str | None) -> Launcher | None:
    """The registered launcher called ``name``, or None (e.g. a sweep.json written by a launcher
    this process has not registered: its jobs are then followed through their files only)."""
    return _builtins().get(str(name)) if name else None


def get_launcher(cfg_or_name: Any) -> Launcher:
    """The launcher for a ``launcher`` config (its ``name``) or a name; ``UserError`` if unknown."""
    name = cfg_or_name if isinstance(cfg_or_name, str) else str(declared(cfg_or_name, "name"))
    return _builtins().lookup(name)
