"""How many CPU threads a run should use, so that runs sharing a machine do not oversubscribe it.

torch's default intra-op thread count is the number of cores it sees, which ignores CPU affinity
masks, container quotas, other jobs started beside it and anything else already busy. When a
run's threads outnumber the cores left to it, every parallel region waits for its slowest,
descheduled thread: on a busy 2-core machine 40 tiny-model steps took 14-31 s with torch's
default against 6 s with one thread. The default here (``trainer.threads: 0``) is instead

    threads = max(1, min(cpus // jobs, cpus - busy))

- ``cpus`` (``available_cpus``): the CPUs this process may run on: its affinity mask
  (``os.sched_getaffinity``), lowered by a cgroup CPU quota (v2 ``cpu.max``, v1
  ``cpu.cfs_quota_us / cpu.cfs_period_us``, the tightest along the cgroup's path), rounded down,
  at least 1.
- ``jobs`` (``jobs_sharing``): how many jobs run at once on these CPUs: ``$ENTROPYRL_JOBS`` (for
  launchers that start several jobs side by side; sweeps pass ``trainer.threads`` computed from
  ``available_cpus`` instead) times torchrun's ``$LOCAL_WORLD_SIZE``; 1 by default.
- ``busy`` (``busy_cpus``): CPUs already kept busy by other processes, counted from the kernel's
  instantaneous number of runnable tasks (``/proc/loadavg``) minus this process's own runnable
  threads, median of a few samples. Only used when this process may use the whole machine (no affinity mask narrower
  than the online CPUs, no quota): inside a container the count covers the host, not our share.

A count the user chose wins: ``trainer.threads=N``, else ``$OMP_NUM_THREADS`` set before the run.
``apply_threads`` sets torch's count and exports ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` /
``OPENBLAS_NUM_THREADS`` (unless the user set them) so that child processes (grading workers,
rollout engines) follow the same budget; ``ThreadBudget.refresh`` re-reads ``busy`` between
training steps, so a process started next to a running job also takes threads back from it.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

from .errors import UserError

__all__ = [
    "available_cpus",
    "affinity_cpus",
    "cgroup_cpu_limit",
    "parse_cpu_max",
    "parse_cfs_quota",
    "jobs_sharing",
    "busy_cpus",
    "default_threads",
    "user_threads",
    "apply_threads",
    "check_threads",
    "ThreadBudget",
    "available_memory_bytes",
    "JOBS_ENV",
    "THREAD_ENV_VARS",
]

JOBS_ENV = "ENTROPYRL_JOBS"
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_EXPORT_MARK = "_ENTROPYRL_OMP"  # the OMP_NUM_THREADS value we exported (not the user's choice)


# ---------------------------------------------------------------------------------------------
# what this process may use
# ---------------------------------------------------------------------------------------------
def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (all CPUs where the OS has no such call)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parse_cpu_max(text: str) -> float | None:
    """CPUs granted by a cgroup v2 ``cpu.max`` ("QUOTA PERIOD", "max PERIOD" = no limit)."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = float(parts[0])
        period = float(parts[1]) if len(parts) > 1 else 100_000.0
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """CPUs granted by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = no limit)."""
    try:
        quota, period = float(quota_text.strip()), float(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _ancestors(rel: str) -> list[str]:
    """``/a/b`` -> ``["/a/b", "/a", "/"]``: a quota anywhere up the tree applies."""
    parts = [p for p in rel.strip().split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_cpu_limit(proc_cgroup: str | None = None, root: str | os.PathLike = "/sys/fs/cgroup") -> float | None:
    """The tightest CPU quota (in CPUs) on this process's cgroup path, or None when unlimited.

    ``proc_cgroup``: the text of ``/proc/self/cgroup`` (read when None); ``root``: where the
    cgroup filesystems are mounted (v2 unified at the root; v1 controllers in ``cpu``,
    ``cpu,cpuacct``...). Paths that are not there (a container that mounts its own cgroup at the
    root) fall back to the mount's root files."""
    root = Path(root)
    text = proc_cgroup if proc_cgroup is not None else (_read(Path("/proc/self/cgroup")) or "")
    limits: list[float] = []
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if not hier:
            continue
        if controllers == "" and hier == "0":  # cgroup v2
            for base in (root, root / "unified"):
                for anc in _ancestors(rel):
                    got = _read(base / anc.lstrip("/") / "cpu.max")
                    if got is not None and (limit := parse_cpu_max(got)) is not None:
                        limits.append(limit)
        elif "cpu" in controllers.split(","):  # cgroup v1
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                base = root / name
                if not base.is_dir():
                    continue
                for anc in _ancestors(rel):
                    d = base / anc.lstrip("/")
                    quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                    if quota is not None and period is not None:
                        if (limit := parse_cfs_quota(quota, period)) is not None:
                            limits.append(limit)
                break
    return min(limits) if limits else None


def available_memory_bytes(
    meminfo: str | None = None, proc_cgroup: str | None = None, root: str | os.PathLike = "/sys/fs/cgroup"
) -> int | None:
    """Memory this process could still allocate, in bytes: the kernel's ``MemAvailable``
    (``/proc/meminfo``), lowered by the room left under a cgroup v2 ``memory.max`` on this process's
    cgroup path (``memory.max - memory.current``, the tightest); None when nothing can be read."""
    text = meminfo if meminfo is not None else (_read(Path("/proc/meminfo")) or "")
    free = None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            free = int(line.split()[1]) * 1024
    root = Path(root)
    cg = proc_cgroup if proc_cgroup is not None else (_read(Path("/proc/self/cgroup")) or "")
    for line in cg.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hier != "0" or controllers != "":
            continue
        for anc in _ancestors(rel):
            limit, used = _read(root / anc.lstrip("/") / "memory.max"), _read(root / anc.lstrip("/") / "memory.current")
            if limit is None or used is None or limit.strip() == "max":
                continue
            try:
                room = max(int(limit) - int(used), 0)
            except ValueError:
                continue
            free = room if free is None else min(free, room)
    return free


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, lowered by a cgroup quota (rounded down, >= 1)."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota + 1e-9)))
    return max(1, cpus)


def _whole_machine() -> bool:
    """True when this process may use every online CPU with no quota (so machine-wide load is ours)."""
    return affinity_cpus() >= (os.cpu_count() or 1) and cgroup_cpu_limit() is None


# ---------------------------------------------------------------------------------------------
# who else is using them
# ---------------------------------------------------------------------------------------------
def _positive_int(name: str) -> int:
    try:
        return max(1, int(os.environ.get(name, "1")))
    except ValueError:
        return 1


def jobs_sharing() -> int:
    """Jobs running at once on these CPUs: ``$ENTROPYRL_JOBS`` (set by launchers that run several
    jobs side by side) times ``$LOCAL_WORLD_SIZE`` (torchrun's processes on this node); 1 by default."""
    return _positive_int(JOBS_ENV) * _positive_int("LOCAL_WORLD_SIZE")


def parse_loadavg_running(text: str) -> int | None:
    """Runnable tasks in a ``/proc/loadavg`` line ("0.5 0.4 0.2 3/180 1234" -> 3)."""
    fields = text.split()
    if len(fields) < 4 or "/" not in fields[3]:
        return None
    try:
        return int(fields[3].split("/")[0])
    except ValueError:
        return None


def _own_running(task_dir: str = "/proc/self/task") -> int:
    """This process's threads that are runnable now (state R), the reading thread included."""
    running = 0
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return 1
    for tid in tasks:
        stat = _read(Path(task_dir) / tid / "stat") or ""
        # "tid (comm) S ...": the state follows the last ')' (comm may hold spaces or parentheses)
        if stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] == "R":
            running += 1
    return max(1, running)


def busy_cpus(samples: int = 5, interval: float = 0.02, loadavg: str = "/proc/loadavg", task_dir: str = "/proc/self/task") -> int:
    """CPUs kept busy by other processes right now: the kernel's runnable tasks minus this
    process's own runnable threads, median over ``samples`` reads. 0 where it cannot be read."""
    counts = []
    for i in range(max(1, samples)):
        got = parse_loadavg_running(_read(Path(loadavg)) or "")
        if got is not None:
            counts.append(max(0, got - _own_running(task_dir)))
        if i + 1 < samples:
            time.sleep(interval)
    return int(statistics.median(counts)) if counts else 0


def default_threads(cpus: int | None = None, jobs: int | None = None, busy: int | None = None, samples: int = 5) -> int:
    """``max(1, min(cpus // jobs, cpus - busy))``; see the module docstring for each term.
    ``samples``: reads of the run queue when ``busy`` is measured (20 ms apart)."""
    cpus = available_cpus() if cpus is None else max(1, int(cpus))
    jobs = jobs_sharing() if jobs is None else max(1, int(jobs))
    if busy is None:
        busy = busy_cpus(samples=samples) if _whole_machine() else 0
    return max(1, min(cpus // jobs, cpus - max(0, int(busy))))


# ---------------------------------------------------------------------------------------------
# applying it
# ---------------------------------------------------------------------------------------------
def user_threads() -> int | None:
    """``$OMP_NUM_THREADS`` when the user set it (a positive int), None otherwise. A value this
    module exported for child processes (``_ENTROPYRL_OMP``) is not the user's."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not value or value == os.environ.get(_EXPORT_MARK):
        return None
    try:
        n = int(value)
    except ValueError:
        return None
    return n if n > 0 else None


def _is_auto(requested) -> bool:
    return requested in (None, 0, "0", "auto", "")


def check_threads(requested, option: str = "trainer.threads") -> None:
    """A thread count setting is 0, "auto" or null (the CPUs left to the run) or a positive whole
    number; anything else is one ``UserError`` naming ``option``, never a silent 1."""
    if _is_auto(requested):
        return
    value = requested.strip() if isinstance(requested, str) else requested
    whole = isinstance(value, int) and not isinstance(value, bool)
    whole = whole or (isinstance(value, float) and value.is_integer()) or (isinstance(value, str) and value.isdigit())
    if not whole or int(value) < 1:
        raise UserError(
            f"{option}={requested!r} is not a thread count: give a positive integer, or 0 / auto for the CPUs left to the run"
        )


def apply_threads(requested: int | str | None = 0, *, export: bool = True, option: str = "trainer.threads") -> int:
    """Set torch's intra-op threads: ``requested``; for 0 / None / "auto" the user's
    ``$OMP_NUM_THREADS`` when set, else ``default_threads()``. With ``export``,
    ``OMP/MKL/OPENBLAS_NUM_THREADS`` are set for child processes unless already set.
    Returns the count used; ``UserError`` (naming ``option``) for a value that is no thread count."""
    import torch

    check_threads(requested, option)
    if _is_auto(requested):
        threads = user_threads() or default_threads()
    else:
        threads = max(1, int(requested))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if export:
        if "OMP_NUM_THREADS" not in os.environ:
            os.environ[_EXPORT_MARK] = str(threads)
        for var in THREAD_ENV_VARS:
            os.environ.setdefault(var, str(threads))
    return threads


class ThreadBudget:
    """The thread count of a running job: fixed when the user chose one (``trainer.threads=N`` or
    ``$OMP_NUM_THREADS``), otherwise re-read every ``every_s`` seconds (``refresh``, called between
    training steps) so the job gives threads back when something else starts beside it and takes
    them again when it stops."""

    def __init__(self, requested: int | str | None = 0, every_s: float = 5.0):
        self.auto = _is_auto(requested) and user_threads() is None
        self.every_s = float(every_s)
        self.threads = apply_threads(requested)
        self._last = time.monotonic()

    def refresh(self) -> int:
        if not self.auto or time.monotonic() - self._last < self.every_s:
            return self.threads
        self._last = time.monotonic()
        want = default_threads(samples=3)  # ~40 ms every every_s seconds
        if want != self.threads:
            import torch

            torch.set_num_threads(want)
            self.threads = want
        return self.threads
