"""The schema of the ``launcher`` group's keys: where a sweep's jobs run (``conf/launcher/``, composed by
``entropyrl sweep`` and ``entropyrl lab``; the training config has no ``launcher``).

Each launcher is one option with its own schema, stored as ``schema/launcher/<name>`` and listed first by
``conf/launcher/<name>.yaml``. Keys several launchers share are declared once, in a small base each
(``LauncherName``: all three; ``Ranks`` and ``Timeouts``: local and slurm; ``Threads``: all three); an
option whose default of a shared key differs sets it again in its own class, with the same rule and
doc, which keeps the key where its base put it. Each launcher's own keys are bases of their own too,
so that a schema reads in the order ``config show`` prints: a dataclass's fields follow the reversed
MRO, so ``SlurmLauncherSchema(SlurmChecks, Threads, SlurmJob, Timeouts, SlurmResources, Ranks,
SlurmQueue, LauncherName)`` reads ``name, partition, account, qos, nodes, tasks_per_node, ...``.

``LAUNCHER_SCHEMAS`` maps each launcher to its schema; validation's table holds the union of their
rules (a key is checked wherever it is set, whichever launcher the sweep picks). A launcher a plugin
registers (``sweeps.launchers.register_launcher(..., defaults={...})``) brings its keys as a
ConfigStore node of its own and has no schema here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..rules import BOOL, NONNEG_INT, OPT_STR, POS, POS_INT, STR, Rule, integer, number, owned
from . import key, owned_section

# The rule and doc of each key an option sets again with its own default: one object each, so the key
# has one rule in validation's union and one doc whichever launcher is picked.
_NAME_DOC = "the launcher (sweeps/launchers.py registry): local | slurm | debug"
_TIMEOUT_DOC = (
    "wall-clock limit per attempt (minutes): a job running longer is interrupted, checkpoints and is requeued "
    "(up to max_num_timeout times)"
)
_SIGNAL_DOC = "a job is signalled (USR2) this long before its time limit so it can checkpoint and requeue"
_THREADS = owned("sweeps/ (auto, 0: each job picks its own, or N threads)")
_THREADS_DOC = (
    "torch threads per job (trainer.threads): auto = the launcher's share (local: usable CPUs / (max_parallel x "
    "tasks_per_node); slurm: cpus_per_task); 0 = each job picks its own (the CPUs left to it)"
)


@dataclass
class LauncherName:
    """``name``, the first key of every launcher."""

    name: str = key("local", STR, _NAME_DOC)


@dataclass
class Ranks:
    """The ranks of a job (local and slurm): ``nodes`` x ``tasks_per_node`` data-parallel processes."""

    nodes: int = key(
        1,
        POS_INT,
        "nodes per job (local: this machine only); ranks per job = nodes x tasks_per_node (one MLflow run, one folder)",
    )
    tasks_per_node: int | None = key(
        None,
        integer(1, nullable=True),
        "data-parallel ranks per node (gloo on CPU; srun tasks on slurm): null = one per GPU on slurm (gpus_per_node), else 1",
    )


@dataclass
class Timeouts:
    """A job's time limit and its requeues (local and slurm)."""

    timeout_min: int = key(1440, POS_INT, _TIMEOUT_DOC)
    max_num_timeout: int = key(3, NONNEG_INT, "how many times a job past timeout_min (or preempted, on slurm) may be requeued")
    signal_delay_s: int = key(30, NONNEG_INT, _SIGNAL_DOC)


@dataclass
class Threads:
    """``threads_per_job``: the torch threads of each job (``trainer.threads``), every launcher's."""

    threads_per_job: int | str = key("auto", _THREADS, _THREADS_DOC)


@dataclass
class LocalParallel:
    """The local launcher's jobs in flight."""

    max_parallel: int = key(1, POS_INT, "jobs running at once")


@dataclass
class LocalWarmStart:
    """The local launcher's forked jobs (sweeps/warm_worker.py)."""

    warm_start: bool = key(
        True,
        BOOL,
        (
            "fork each job from a per-sweep process that has imported torch, transformers and the trainer once "
            "(seconds less per job); false: a fresh process per job. Jobs of tasks_per_node>1 start cold"
        ),
    )


@dataclass
class SlurmQueue:
    """Where the slurm launcher's jobs queue (sbatch's partition, account and qos)."""

    partition: str | None = key(None, OPT_STR, "null = the cluster's default partition")
    account: str | None = key(None, OPT_STR, "sbatch --account; null = your default account")
    qos: str | None = key(None, OPT_STR, "sbatch --qos; null = the partition's default")


@dataclass
class SlurmResources:
    """What the slurm launcher requests per node and per rank."""

    gpus_per_node: int = key(0, NONNEG_INT, "GPUs requested per node (sbatch --gpus-per-node); 0 = none")
    cpus_per_task: int = key(4, POS_INT, "per rank")
    mem_gb: float | None = key(16, number(0, open_low=True, nullable=True), "per node; null = the cluster's default")


@dataclass
class SlurmJob:
    """The slurm launcher's job array and the script each job runs."""

    array_parallelism: int = key(16, POS_INT, "at most this many jobs of the sweep run at once")
    job_name: str = key("entropyrl", STR, "the SLURM job name (squeue)")
    setup: list[str] = key([], Rule("str_list"), "shell lines run before each job, e.g. [module load cuda/12.4, source ~/env.sh]")
    additional_parameters: dict[str, Any] = owned_section(
        owned("submitit (any other sbatch option)"),
        "any other sbatch option, e.g. {constraint: a100, exclude: node12, mail-type: END}",
        {},
    )
    python: str | None = key(None, OPT_STR, "interpreter for the jobs; null = the one running `entropyrl sweep`")
    use_srun: bool = key(True, BOOL, "run the job through srun inside the sbatch script (submitit's default)")


@dataclass
class SlurmChecks:
    """What the slurm launcher checks before and after it submits."""

    check_request: bool = key(
        True, BOOL, "before submitting, compare cpus/mem/gpus/nodes/time with sinfo's nodes; false = submit anyway"
    )
    stuck_after_s: float = key(
        20,
        POS,
        (
            "a job pending this long for a reason that never clears (PartitionConfig, InvalidAccount, ...) stops "
            "the sweep: its jobs are cancelled and the launcher key to change is named"
        ),
    )


@dataclass
class DebugKeys:
    """The debug launcher's own key."""

    post_mortem: bool = key(False, BOOL, "true: pdb opens on the first failing job (else it is reported and the sweep goes on)")


@dataclass
class LocalLauncherSchema(LocalWarmStart, Timeouts, Threads, Ranks, LocalParallel, LauncherName):
    """``launcher`` with ``launcher=local``: jobs as local processes (submitit's LocalExecutor), at most
    ``max_parallel`` at once."""

    name: str = key("local", STR, _NAME_DOC)


@dataclass
class SlurmLauncherSchema(SlurmChecks, Threads, SlurmJob, Timeouts, SlurmResources, Ranks, SlurmQueue, LauncherName):
    """``launcher`` with ``launcher=slurm``: one SLURM job array through submitit, a task per (variant, seed)."""

    name: str = key("slurm", STR, _NAME_DOC)
    timeout_min: int = key(240, POS_INT, _TIMEOUT_DOC)
    signal_delay_s: int = key(90, NONNEG_INT, _SIGNAL_DOC)


@dataclass
class DebugLauncherSchema(Threads, DebugKeys, LauncherName):
    """``launcher`` with ``launcher=debug``: the jobs in this process, one after another (submitit's DebugExecutor)."""

    name: str = key("debug", STR, _NAME_DOC)
    threads_per_job: int | str = key(0, _THREADS, _THREADS_DOC)


#: Each launcher's schema: ``{option of conf/launcher/: schema}``.
LAUNCHER_SCHEMAS = {"local": LocalLauncherSchema, "slurm": SlurmLauncherSchema, "debug": DebugLauncherSchema}
