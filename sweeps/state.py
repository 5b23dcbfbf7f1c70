"""What a sweep is and where each of its jobs stands, from files in the sweep folder (plus SLURM's
queue when there is one).

``<sweep_dir>/sweep.json`` (written only by the ``entropyrl sweep`` process) holds the plan: sweep
id, ablation, launcher, tracking (MLflow URI, experiment, parent run id), report settings and one
record per job (key, variant, seed, training overrides, output dir, scheduler job id, log paths).
Each job writes its own ``<output_dir>/job.json`` (see ``jobs.py``). A job's state is one of
``pending`` (not submitted, or queued), ``running``, ``done``, ``failed``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from entropyrl.errors import UserError
from entropyrl.sweeps.jobs import TRAIN_LOG, read_job_state

SWEEP_FILE = "sweep.json"
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"

# SLURM job states (squeue %T) in which the job will still run or is running.
SLURM_WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD",
                 "SUSPENDED", "RESIZING", "SPECIAL_EXIT", "PREEMPTED"}
SLURM_ACTIVE = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED"}


# ---------------------------------------------------------------------------------------------
# sweep.json
# ---------------------------------------------------------------------------------------------
def sweep_file(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / SWEEP_FILE


def load_sweep(sweep_dir: Path) -> dict:
    path = sweep_file(sweep_dir)
    if not path.exists():
        raise UserError(f"{sweep_dir} is not a sweep folder (no {SWEEP_FILE}); pass the folder "
                        f"`entropyrl sweep` printed, e.g. outputs/sweeps/gate-20260101-120000")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); restore it or start a new sweep_dir") from None


def save_sweep(sweep_dir: Path, state: dict) -> None:
    path = sweep_file(sweep_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2, default=str))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# scheduler queries
# ---------------------------------------------------------------------------------------------
def slurm_available() -> bool:
    return shutil.which("squeue") is not None


def slurm_states(job_ids: list[str]) -> dict[str, str] | None:
    """``{job_id: STATE}`` from ``squeue -t all`` for the given ids (array tasks as ``123_4``).

    Jobs SLURM has forgotten are absent. ``None`` when SLURM cannot be asked (no squeue, no
    controller): callers then rely on files only.
    """
    ids = sorted({str(j) for j in job_ids if j})
    if not ids or not slurm_available():
        return {} if not ids else None
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(ids)],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        # squeue errors out when *every* id is unknown ("Invalid job id specified"): all forgotten.
        return {} if "Invalid job id" in out.stderr else None
    states: dict[str, str] = {}
    for line in out.stdout.splitlines():
        if "|" in line:
            jid, st = line.strip().split("|", 1)
            states[jid] = st.split()[0] if st else st
    return states


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
    state: str                    # pending | running | done | failed
    detail: str                   # e.g. "step 12/40", "SLURM PENDING (requeued)", the error line
    log: str                      # the most useful log file
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


def _total_steps(record: dict) -> int | None:
    for o in reversed(record.get("overrides", [])):
        if o.startswith("trainer.total_steps="):
            try:
                return int(o.split("=", 1)[1])
            except ValueError:
                return None
    return None


def log_path(record: dict, output_dir: Path) -> str:
    """The submitit stderr log when the launcher has one (tracebacks land there), else train.log."""
    for key in ("stderr", "stdout"):
        p = record.get(key)
        if p and Path(p).exists():
            return p
    return str(output_dir / TRAIN_LOG)


def job_status(record: dict, scheduler: dict[str, str] | None = None, launcher: str = "local") -> JobStatus:
    """Combine the job's own files, the sweep's record and (for SLURM) the queue into one state.

    ``scheduler``: the ``slurm_states`` answer (``None`` = unknown). A job whose files say it is
    running but whose scheduler job is gone (or whose local process died) is ``failed`` (lost).
    """
    out = Path(record["output_dir"])
    js = read_job_state(out)
    sched_id = js.get("scheduler_job_id") or record.get("scheduler_job_id")
    attempt = int(js.get("attempt", 0))
    log = log_path(record, out)
    last, total = _last_step(out), _total_steps(record)
    progress = f"step {last}/{total}" if last is not None else ""

    def mk(state: str, detail: str) -> JobStatus:
        return JobStatus(record["key"], record["variant"], int(record["seed"]), state, detail, log, str(out),
                         sched_id, attempt)

    state = js.get("state")
    if state == "done":
        return mk(DONE, f"{js.get('steps', last)} steps")
    if state == "failed":
        return mk(FAILED, js.get("error") or "failed")
    sq = None
    if launcher == "slurm" and scheduler is not None and sched_id:
        sq = scheduler.get(str(sched_id), "GONE")
    if state in ("running", "requeued"):
        if sq is not None:
            if sq in SLURM_ACTIVE:
                return mk(RUNNING, progress or f"SLURM {sq}")
            if sq in SLURM_WAITING:
                return mk(PENDING, f"SLURM {sq} (requeued, resumes at its last checkpoint)")
            return mk(FAILED, f"lost: job stopped without reporting (SLURM {sq}); see the log")
        if launcher != "slurm":
            alive = pid_alive(js.get("pid"), js.get("host"))
            if alive is False:
                return mk(FAILED, "lost: job process died without reporting; see the log")
        return mk(RUNNING, progress or "running")
    # never started (or its job.json is gone)
    if sq is not None:
        if sq in SLURM_WAITING:
            return mk(PENDING, f"SLURM {sq}")
        if sq in SLURM_ACTIVE:
            return mk(RUNNING, f"SLURM {sq} (starting)")
        return mk(FAILED, f"lost: SLURM job ended before the job started (SLURM {sq}); see the log")
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


def sweep_status(sweep_dir: Path) -> tuple[dict, list[JobStatus]]:
    """The sweep's plan and the current state of each of its jobs."""
    sweep = load_sweep(sweep_dir)
    launcher = sweep.get("launcher", {}).get("name", "local")
    records = sweep.get("jobs", [])
    scheduler = None
    if launcher == "slurm":
        scheduler = slurm_states([r.get("scheduler_job_id") for r in records]
                                 + [read_job_state(Path(r["output_dir"])).get("scheduler_job_id") for r in records])
    return sweep, [job_status(r, scheduler, launcher) for r in records]


def now() -> float:
    return time.time()
