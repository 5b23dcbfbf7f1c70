"""What a sweep is and where each of its jobs stands, from files in the sweep folder (plus the
launcher's scheduler queue when it has one, e.g. SLURM's).

``<sweep_dir>/sweep.json`` (written only by the ``entropyrl sweep`` process) holds the plan: sweep
id, ablation, launcher, tracking (MLflow URI, experiment, parent run id), report settings and one
record per job (key, variant, seed, training overrides, output dir, scheduler job id, log paths).
Each job writes its own ``<output_dir>/job.json`` (see ``jobs.py``). A job's state is one of
``pending`` (not submitted, or queued), ``running``, ``done``, ``failed``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UserError
from ..core.files import atomic_write_text
from ..core.tracking import end_abandoned_run
from .jobs import TRAIN_LOG, read_job_state
from .launchers import ACTIVE, ENDED, WAITING, Launcher, QueueEntry, find_launcher

SWEEP_FILE = "sweep.json"
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


# ---------------------------------------------------------------------------------------------
# sweep.json
# ---------------------------------------------------------------------------------------------
def sweep_file(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / SWEEP_FILE


def load_sweep(sweep_dir: Path) -> dict:
    path = sweep_file(sweep_dir)
    if not path.exists():
        raise UserError(
            f"{sweep_dir} is not a sweep folder (no {SWEEP_FILE}); pass the folder "
            f"`entropyrl sweep` printed, e.g. outputs/sweeps/gate-20260101-120000"
        )
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); restore it or start a new sweep_dir") from None
    if not isinstance(data, dict) or not data.get("sweep_id") or not isinstance(data.get("jobs"), list):
        raise UserError(
            f"{path} holds no sweep (no sweep_id and jobs list: emptied or cut short); restore it, "
            f"or start the sweep again with a new sweep_dir"
        )
    return data


def save_sweep(sweep_dir: Path, state: dict) -> None:
    path = sweep_file(sweep_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(state, indent=2, default=str))


# ---------------------------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------------------------
def pid_alive(pid: int | None, host: str | None) -> bool | None:
    """Whether process ``pid`` on ``host`` is alive; ``None`` when it is on another host."""
    if not pid:
        return None
    if host and host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------
# one job's state
# ---------------------------------------------------------------------------------------------
@dataclass
class JobStatus:
    key: str
    variant: str
    seed: int
    state: str  # pending | running | done | failed
    detail: str  # e.g. "step 12/40", "SLURM PENDING (requeued)", the error line
    log: str  # the most useful log file
    output_dir: str
    scheduler_job_id: str | None = None
    attempt: int = 0


def _last_step(output_dir: Path) -> int | None:
    path = output_dir / "metrics.jsonl"
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            tail = f.read().decode(errors="replace").strip().splitlines()
        return int(json.loads(tail[-1])["step"]) if tail else None
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _total_steps(record: dict, output_dir: Path) -> int | None:
    """The job's ``trainer.total_steps``: from the resolved ``config.yaml`` its run wrote at start (a
    preset such as ``experiment=lab_stare`` sets it there), else a literal override, else None."""
    found = _configured_steps(output_dir / "config.yaml")
    if found is not None:
        return found
    for o in reversed(record.get("overrides", [])):
        if o.startswith("trainer.total_steps="):
            try:
                return int(o.split("=", 1)[1])
            except ValueError:
                return None
    return None


_STEPS_READ: dict[tuple[str, int], int | None] = {}  # (config.yaml, its mtime) -> total_steps: read once


def _configured_steps(path: Path) -> int | None:
    try:
        key = (str(path), path.stat().st_mtime_ns)
    except OSError:
        return None
    if key not in _STEPS_READ:
        import yaml

        try:
            steps = (yaml.safe_load(path.read_text()) or {}).get("trainer", {}).get("total_steps")
            _STEPS_READ[key] = int(steps) if steps is not None else None
        except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
            _STEPS_READ[key] = None
    return _STEPS_READ[key]


def log_path(record: dict, output_dir: Path) -> str:
    """The submitit stderr log when the launcher has one (tracebacks land there), else train.log."""
    for key in ("stderr", "stdout"):
        p = record.get(key)
        if p and Path(p).exists():
            return p
    return str(output_dir / TRAIN_LOG)


def job_status(record: dict, queue: dict[str, QueueEntry] | None = None, launcher: Launcher | None = None) -> JobStatus:
    """Combine the job's own files, the sweep's record and the launcher's queue into one state.

    ``queue``: the launcher's ``queue()`` answer (``None`` = unknown or no queue); ``launcher``: the
    sweep's launcher (``None``: not registered here, files only). A job whose files say it is
    running but whose scheduler job is gone (or whose local process died) is ``failed`` (lost).
    """
    out = Path(record["output_dir"])
    js = read_job_state(out)
    sched_id = js.get("scheduler_job_id") or record.get("scheduler_job_id")
    attempt = int(js.get("attempt", 0))
    log = log_path(record, out)
    last, total = _last_step(out), _total_steps(record, out)
    progress = "" if last is None else f"step {last}/{total}" if total is not None else f"step {last}"
    detached = bool(launcher is not None and launcher.detached)
    label = (launcher.scheduler or launcher.name) if launcher is not None else "scheduler"

    def mk(state: str, detail: str) -> JobStatus:
        return JobStatus(record["key"], record["variant"], int(record["seed"]), state, detail, log, str(out), sched_id, attempt)

    state = js.get("state")
    if state == "done":
        return mk(DONE, f"{js.get('steps', last)} steps")
    if state == "failed":
        return mk(FAILED, js.get("error") or "failed")
    entry = None
    if detached and queue is not None and sched_id:
        entry = queue.get(str(sched_id), QueueEntry(ENDED, "GONE"))
    word = (f"{label} {entry.state}" + (f" ({entry.reason})" if entry.reason else "")) if entry else ""
    if state in ("running", "requeued"):
        if entry is not None:
            if entry.phase == ACTIVE:
                return mk(RUNNING, progress or word)
            if entry.phase == WAITING:
                return mk(PENDING, f"{word}, requeued: resumes at its last checkpoint")
            return mk(FAILED, f"lost: job stopped without reporting ({label} {entry.state}); see the log")
        if not detached:
            alive = pid_alive(js.get("pid"), js.get("host"))
            if alive is False:
                return mk(FAILED, "lost: job process died without reporting; see the log")
        return mk(RUNNING, progress or "running")
    # never started (or its job.json is gone)
    if entry is not None:
        if entry.phase == WAITING:
            return mk(PENDING, word)
        if entry.phase == ACTIVE:
            return mk(RUNNING, f"{word} (starting)")
        return mk(FAILED, f"lost: {label} job ended before the job started ({label} {entry.state}); see the log")
    summary = out / "summary.json"
    if summary.exists():  # a run finished by other means (e.g. `entropyrl train` on the folder)
        try:
            if json.loads(summary.read_text()).get("status") == "FINISHED":
                return mk(DONE, f"{last} steps")
        except ValueError:
            pass
    if record.get("submitted"):
        return mk(PENDING, "submitted")
    return mk(PENDING, "not submitted")


def scheduler_ids(records: list[dict]) -> list[str]:
    """The scheduler job ids of these jobs, from the sweep's records and the jobs' own files (a
    requeued job may report a newer one)."""
    ids = [r.get("scheduler_job_id") for r in records]
    ids += [read_job_state(Path(r["output_dir"])).get("scheduler_job_id") for r in records]
    return [str(i) for i in ids if i]


def sweep_status(sweep_dir: Path) -> tuple[dict, list[JobStatus]]:
    """The sweep's plan and the current state of each of its jobs."""
    sweep = load_sweep(sweep_dir)
    launcher = find_launcher(sweep.get("launcher", {}).get("name", "local"))
    records = sweep.get("jobs", [])
    queue = launcher.queue(scheduler_ids(records)) if launcher is not None and launcher.detached else None
    return sweep, [job_status(r, queue, launcher) for r in records]


def close_lost_runs(statuses: list[JobStatus]) -> list[str]:
    """End FAILED the MLflow runs of jobs found lost (their process died without reporting) that
    are still RUNNING; the ids of the runs ended."""
    ended = []
    for st in statuses:
        if st.state == FAILED and st.detail.startswith("lost:"):
            run_id = end_abandoned_run(Path(st.output_dir), f"{st.key}: {st.detail}")
            if run_id:
                ended.append(run_id)
    return ended


def count_states(statuses: list[JobStatus]) -> dict[str, int]:
    return {s: sum(1 for st in statuses if st.state == s) for s in (DONE, RUNNING, PENDING, FAILED)}


def now() -> float:
    return time.time()
