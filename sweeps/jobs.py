"""The unit of work a launcher runs: one training job of a sweep.

``TrainJob`` is what submitit pickles and runs on the worker (a local process, a SLURM node, or
this process for the debug launcher). It is a ``submitit.helpers.Checkpointable``: on preemption or
timeout submitit requeues the same callable, and the trainer's ``trainer.resume=auto`` continues
from the job's latest checkpoint, counting steps on and logging into the same MLflow run (its id is
kept in ``<output_dir>/tracking.json``).

Each attempt writes ``<output_dir>/job.json`` (state running/done/failed/requeued, attempt number,
host, pid, scheduler job id, error) and appends its log to ``<output_dir>/train.log``; the
sweep's status and reports read these files.

A job of several ranks (``launcher.nodes`` x ``launcher.tasks_per_node``) runs this callable once
per rank (srun's tasks, or submitit's local tasks); the ranks train one data-parallel run, and rank
0 alone writes ``job.json``, ``train.log`` and the run's files (one MLflow run, one folder). The
other ranks log to ``train.rank<k>.log``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import submitit
from omegaconf import DictConfig, open_dict

from ..conf import compose
from ..core.files import atomic_write_text
from ..trainers.optim import check_optim
from ..trainers.parallel.process_group import launcher_env
from ..trainers.run.run_report import validation_text
from ..trainers.trainer import train

JOB_STATE_FILE = "job.json"
TRAIN_LOG = "train.log"
TRAIN_KIND = "train"

# Environment a job needs to behave like the submitting shell (passed explicitly: a SLURM node or
# a cluster with `--export=NONE` may not inherit it).
PASSED_ENV = (
    "ENTROPYRL_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "TRANSFORMERS_VERBOSITY",
    "TOKENIZERS_PARALLELISM",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
)


def job_environment() -> dict[str, str]:
    """The submitting process's environment entries a job must see (the model cache above all, so
    jobs reuse the warm-started tiny model instead of rebuilding it)."""
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    if "ENTROPYRL_CACHE" not in env:
        env["ENTROPYRL_CACHE"] = str(Path.home() / ".cache" / "entropyrl")
    env["ENTROPYRL_CACHE"] = str(Path(env["ENTROPYRL_CACHE"]).resolve())
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def job_kind(record: dict) -> str:
    """The kind of a sweep job record (``train`` unless its variant names another)."""
    return str((record.get("extra") or {}).get("kind") or TRAIN_KIND)


def read_job_state(output_dir: Path) -> dict:
    path = Path(output_dir) / JOB_STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_job_state(output_dir: Path, state: dict) -> None:
    path = Path(output_dir) / JOB_STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(state, indent=2))


def compose_job_config(overrides: list[str], tracking: dict | None = None, run_name: str | None = None) -> DictConfig:
    """One sweep job's training config: ``entropyrl train <overrides>`` composed, then the sweep's
    tracking (``{enabled, uri, experiment, parent_run_id, run_name, tags, retry_s, flush_wait_s}``) filled in when given.

    Used by the job itself and, at plan time, by ``planning.job_configs`` for every job.
    """
    cfg = compose("train", list(overrides))
    check_optim(cfg.optim)  # an unknown optim.name / optim.scheduler fails the plan, not the job
    if tracking is None:
        return cfg
    with open_dict(cfg):
        cfg.tracking.enabled = bool(tracking.get("enabled", True))
        for key in ("uri", "experiment", "parent_run_id", "retry_s", "flush_wait_s"):
            if tracking.get(key) is not None:
                cfg.tracking[key] = tracking[key]
        cfg.tracking.run_name = tracking.get("run_name") or run_name or cfg.tracking.get("run_name")
        tags = dict(cfg.tracking.get("tags") or {})
        tags.update({str(k): str(v) for k, v in (tracking.get("tags") or {}).items()})
        cfg.tracking.tags = tags
    return cfg


def _scheduler_job_id() -> str | None:
    try:
        env = submitit.JobEnvironment()
        return str(env.job_id)
    except RuntimeError:  # not inside a submitit job (called directly)
        return None


class TrainJob(submitit.helpers.Checkpointable):
    """Run (or resume) one sweep job: ``entropyrl train <overrides>`` plus the sweep's tracking.

    ``spec``: a ``JobSpec.to_dict()``; ``tracking``: ``{enabled, uri, experiment, parent_run_id,
    tags}``; ``env``: environment to apply first; ``raise_errors``: re-raise a training failure
    (so the scheduler marks the job failed) instead of returning ``{"status": "FAILED", ...}``.
    """

    def __init__(self, spec: dict, tracking: dict, env: dict | None = None, raise_errors: bool = True, echo: bool = True) -> None:
        self.spec = spec
        self.tracking = tracking
        self.env = dict(env or {})
        self.raise_errors = raise_errors
        self.echo = echo
        self._requeueing = False

    # -- helpers ------------------------------------------------------------------------------
    @property
    def output_dir(self) -> Path:
        return Path(self.spec["output_dir"])

    @property
    def rank(self) -> int:
        """This process's rank in the job (0 for a one-process job)."""
        return int(launcher_env()["rank"])

    def _log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        name = TRAIN_LOG if self.rank == 0 else f"train.rank{self.rank}.log"
        with (self.output_dir / name).open("a") as f:
            f.write(line + "\n")
        if self.echo:
            print(line, flush=True)

    def _state(self, **updates: Any) -> dict:
        if self.rank != 0:  # one job.json per job, however many ranks
            return updates
        state = read_job_state(self.output_dir)
        state.update(updates)
        write_job_state(self.output_dir, state)
        return state

    def config(self) -> DictConfig:
        """The composed training config of this job (tracking filled in from the sweep)."""
        return compose_job_config(self.spec["overrides"], self.tracking, run_name=f"{self.spec['variant']}-s{self.spec['seed']}")

    # -- the job ------------------------------------------------------------------------------
    def run(self, cfg: DictConfig) -> dict:
        """The work itself; returns a summary with ``status`` (FINISHED when it succeeded) and
        ``steps``. Another job kind overrides this (sweeps/job_kinds.py)."""
        return train(cfg, log=self._log)

    def __call__(self) -> dict:
        self._requeueing = False
        os.environ.update(self.env)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        previous = read_job_state(self.output_dir)
        attempt = int(previous.get("attempt", 0)) + 1
        sched_id = _scheduler_job_id()
        self._state(
            state="running",
            attempt=attempt,
            key=self.spec["key"],
            host=socket.gethostname(),
            pid=os.getpid(),
            scheduler_job_id=sched_id,
            started=time.time(),
            ended=None,
            error=None,
            traceback=None,
        )
        where = launcher_env()
        ranks = f", rank {where['rank']} of {where['world_size']}" if where["world_size"] > 1 else ""
        self._log(
            f"job {self.spec['key']} attempt {attempt} on {socket.gethostname()} (pid {os.getpid()}{ranks}"
            + (f", scheduler job {sched_id}" if sched_id else "")
            + f") python {sys.executable}"
        )
        try:
            summary = self.run(self.config())
            if summary.get("status") != "FINISHED":
                raise RuntimeError(f"training ended with status {summary.get('status')}")
        except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised for the scheduler
            if self._requeueing and isinstance(exc, SystemExit):
                # submitit exits the job after requeueing it (preemption/timeout): not a failure
                self._log("stopped for requeue; the next attempt resumes from the latest checkpoint")
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            error = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            tb = traceback.format_exc()
            self._log(f"FAILED: {error}\n{tb}")
            self._state(state="failed", ended=time.time(), error=error, traceback=tb[-4000:])
            if self.raise_errors or not isinstance(exc, Exception):
                raise
            return {"status": "FAILED", "error": error, "output_dir": str(self.output_dir)}
        self._state(state="done", ended=time.time(), mlflow_run_id=summary.get("mlflow_run_id"), steps=summary.get("steps"))
        self._log(f"done: {summary.get('steps')} steps, final {validation_text(summary)}")
        return {k: v for k, v in summary.items() if isinstance(v, (str, int, float, bool, type(None)))}

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on preemption/timeout: record it and requeue this same job (the
        trainer resumes from the latest checkpoint in the job's output_dir)."""
        self._requeueing = True
        try:
            self._state(state="requeued", ended=time.time())
            self._log("preempted or timed out: requeueing (resumes from the latest checkpoint)")
        except OSError:
            pass
        return super().checkpoint(*args, **kwargs)
