"""``entropyrl sweep``, once planned: write sweep.json, open the MLflow parent run, submit what did
not finish yet through the plan's launcher, follow the jobs to the end (a live line of job counts;
a job that can never start stops the sweep) and build the report.

Finished jobs are kept; failed ones are retried and continue from their last checkpoint; jobs a
previous `entropyrl sweep` left queued or running are adopted, not submitted twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from ..conf import cfg_get
from ..core.errors import UserError
from ..core.folder_lock import FolderLock
from ..core.tracking import check_reachable
from ..trainers.run.run_report import validation_text
from .job_kinds import job_class
from .jobs import TRAIN_KIND, TrainJob, job_environment, job_kind, read_job_state, write_job_state
from .launchers import WAITING, Launcher, QueueEntry, find_launcher
from .planning import Plan, close_parent_run, open_parent_run, tracking_settings
from .report import build_report
from .state import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    JobStatus,
    close_lost_runs,
    count_states,
    job_status,
    pid_alive,
    save_sweep,
    scheduler_ids,
    sweep_status,
)

Log = Callable[[str], None]


class JobsCannotStart(UserError):
    """A submitted job waits for something that will never come (the scheduler's reason and the
    launcher key to change are in the message); the sweep's jobs were cancelled."""


def run(plan_: Plan, *, wait: bool = True, log: Log = print, progress: Log | None = None) -> dict:
    """Submit the plan's unfinished jobs, follow them (``wait``) and build the report.

    ``progress`` receives the live line of job counts at every poll (``None``: not shown).
    Returns ``{"sweep_dir", "sweep_id", "counts", "failed": [JobStatus...], "report": path|None}``.
    """
    cfg, sweep_dir = plan_.cfg, plan_.sweep_dir
    tracking = tracking_settings(cfg)
    if tracking["enabled"]:  # fail before anything is created or submitted
        check_reachable(tracking["uri"])
    existing = plan_.existing or {}
    old_tr = existing.get("tracking", {})
    if old_tr.get("uri") and tracking["enabled"] and old_tr.get("uri") != tracking["uri"]:
        raise UserError(
            f"{sweep_dir} tracks to {old_tr['uri']}, not {tracking['uri']}: its jobs' MLflow runs "
            f"live there; pass tracking.uri={old_tr['uri']}"
        )
    tracking["parent_run_id"] = old_tr.get("parent_run_id") if tracking["enabled"] else None
    sweep = plan_.sweep_record(tracking)
    lock = FolderLock(
        sweep_dir,
        "`entropyrl sweep`",
        name=".sweep.lock",
        key="sweep_dir",
        hint=f"wait for it or stop it (`entropyrl status {sweep_dir}` shows the jobs)",
    )
    with lock:  # one follower per sweep folder: a second one would submit the same jobs again
        return _run_locked(plan_, sweep, tracking, wait, log, progress)


def _run_locked(plan_: Plan, sweep: dict, tracking: dict, wait: bool, log: Log, progress: Log | None) -> dict:
    sweep_dir, existing, launcher = plan_.sweep_dir, plan_.existing or {}, plan_.launcher
    save_sweep(sweep_dir, sweep)  # before the parent run: a crash leaves a resumable folder
    tracking["parent_run_id"] = open_parent_run(tracking, sweep)
    save_sweep(sweep_dir, sweep)
    if tracking["parent_run_id"]:
        log(f"MLflow parent run {tracking['parent_run_id']} (experiment {tracking['experiment']}, {tracking['uri']})")

    keys = {j.key for j in plan_.jobs}
    records = [r for r in sweep["jobs"] if r["key"] in keys]
    # the jobs already in the folder were submitted by the launcher recorded there
    previous = find_launcher(existing.get("launcher", {}).get("name")) or launcher
    queue = previous.queue(scheduler_ids(records))
    todo, adopted, done = [], [], []
    for rec in records:
        st = job_status(rec, queue, previous)
        if st.state == DONE:
            done.append(rec["key"])
        elif st.state in (RUNNING, PENDING) and _still_owned(rec, st, previous, queue):
            adopted.append(rec)
        else:
            todo.append(rec)
    log(
        f"sweep {sweep['sweep_id']}: {len(plan_.jobs)} jobs ({len(done)} done, {len(adopted)} still queued/running, "
        f"{len(todo)} to run) on {launcher.describe(plan_.cfg.launcher)} -> {sweep_dir}"
    )
    follower = _Follower(sweep, sweep_dir, plan_.cfg, launcher, tracking, log, progress)
    try:
        follower.go(todo, adopted, wait)
    except KeyboardInterrupt:
        follower.interrupted()
        close_parent_run(tracking, "KILLED")
        raise
    except BaseException:  # JobsCannotStart, a launcher's refusal (sbatch missing or refusing), a crash
        close_parent_run(tracking, "FAILED")
        raise
    _, statuses = sweep_status(sweep_dir)
    result = {
        "sweep_dir": str(sweep_dir),
        "sweep_id": sweep["sweep_id"],
        "counts": count_states(statuses),
        "failed": [st for st in statuses if st.state == FAILED],
        "report": None,
        "parent_run_id": tracking["parent_run_id"],
    }
    if wait:
        try:  # the report finishes the parent run; a stop or a failure in it closes the parent here
            rep = build_report(sweep_dir, log=log)
        except BaseException as exc:
            close_parent_run(tracking, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
            log(f"the report was not written; the jobs' results are kept: `entropyrl report {sweep_dir}` writes it")
            raise
        result["report"] = rep["report"]
        result["report_data"] = rep
    return result


def _still_owned(rec: dict, st: JobStatus, launcher: Launcher, queue: dict | None) -> bool:
    """A queued/running job a previous `entropyrl sweep` submitted that will finish on its own."""
    if launcher.detached:
        return st.scheduler_job_id is not None and queue is not None and str(st.scheduler_job_id) in queue
    js = read_job_state(Path(rec["output_dir"]))
    return js.get("state") == "running" and bool(pid_alive(js.get("pid"), js.get("host")))


class _Follower:
    """Submits jobs (keeping at most the launcher's limit in flight) and reports each as it ends."""

    def __init__(
        self, sweep: dict, sweep_dir: Path, cfg: DictConfig, launcher: Launcher, tracking: dict, log: Log, progress: Log | None
    ):
        self.sweep, self.sweep_dir, self.cfg, self.tracking, self.log = sweep, sweep_dir, cfg, tracking, log
        self.launcher, self.launcher_cfg = launcher, cfg.launcher
        self.progress = progress
        self.records = {r["key"]: r for r in sweep["jobs"]}
        self.env = job_environment()
        self.poll = float(cfg.poll_seconds)
        # a job must wait this long for a reason that cannot clear before the sweep gives up on it
        self.stuck_after = float(cfg_get(self.launcher_cfg, "stuck_after_s", 20.0))
        self.inflight: dict[str, object] = {}  # key -> submitit job (None when adopted)
        self.final: dict[str, JobStatus] = {}
        self.lost_polls: dict[str, int] = {}
        self.stuck_since: dict[str, float] = {}
        self.queued = 0  # not submitted yet (held back by the parallelism)
        self.total = 0
        self.executor = None

    # -- submission ---------------------------------------------------------------------------
    def _callable(self, rec: dict) -> TrainJob:
        spec = {k: rec[k] for k in ("key", "variant", "seed", "overrides", "output_dir")}
        spec["extra"] = dict(rec.get("extra") or {})
        tags = {
            **(self.tracking.get("tags") or {}),  # the sweep's own tracking.tags, under the job's
            "sweep_id": self.sweep["sweep_id"],
            "ablation": self.sweep["ablation"]["name"],
            "variant": rec["variant"],
            "seed": rec["seed"],
            "entropyrl.sweep_dir": str(self.sweep_dir),
        }
        tracking = {
            **{k: self.tracking[k] for k in ("enabled", "uri", "experiment", "parent_run_id")},
            **{k: self.tracking[k] for k in ("retry_s", "flush_wait_s") if self.tracking.get(k) is not None},
            "run_name": f"{rec['variant']}-s{rec['seed']}",
            "tags": tags,
        }
        in_process = self.launcher.in_process  # its own train.log is its log; the terminal stays the sweep's
        return job_class(job_kind(rec))(
            spec, tracking, env=self.env, raise_errors=self.launcher.raise_job_errors(self.launcher_cfg), echo=not in_process
        )

    def _prepare(self, rec: dict) -> None:
        out = Path(rec["output_dir"])
        out.mkdir(parents=True, exist_ok=True)
        old = read_job_state(out)
        if old:
            with (out / "job.history.jsonl").open("a") as f:
                f.write(json.dumps(old) + "\n")
        write_job_state(
            out, {"state": "submitted", "attempt": int(old.get("attempt", 0)), "submitted": time.time(), "key": rec["key"]}
        )

    def _submit(self, recs: list[dict]) -> None:
        if not recs:
            return
        if self.executor is None:
            folder = self.sweep_dir / "logs"
            folder.mkdir(parents=True, exist_ok=True)
            self.executor = self.launcher.executor(self.launcher_cfg, folder)
        for rec in recs:
            self._prepare(rec)
        jobs = self.launcher.submit(self.executor, [self._callable(rec) for rec in recs])
        for rec, sj in zip(recs, jobs):
            if self.launcher.in_process:
                rec["scheduler_job_id"], rec["stdout"], rec["stderr"] = None, None, None
            else:
                rec["scheduler_job_id"] = str(sj.job_id)
                rec["stdout"], rec["stderr"] = str(sj.paths.stdout), str(sj.paths.stderr)
            rec["submitted"] = time.time()
            rec["submissions"] = int(rec.get("submissions", 0)) + 1
            self.inflight[rec["key"]] = sj
            self.log(f"submitted {rec['key']}" + ("" if self.launcher.in_process else f" (job {sj.job_id})"))
        save_sweep(self.sweep_dir, self.sweep)

    # -- following ----------------------------------------------------------------------------
    def go(self, todo: list[dict], adopted: list[dict], wait: bool) -> None:
        self.total = len(todo) + len(adopted)
        for rec in adopted:
            self.inflight[rec["key"]] = None
        limit = self.launcher.parallelism(self.launcher_cfg)
        queue = list(todo)
        if self.launcher.in_process:
            for rec in queue:
                self._submit([rec])
                self.inflight[rec["key"]].results()  # runs the job here
                self._check()
            return
        if limit is None or not wait:
            self._submit(queue)
            queue = []
        if not wait:
            return
        while True:
            free = limit - len(self.inflight) if limit is not None else len(queue)
            if queue and free > 0:
                self._submit(queue[:free])
                queue = queue[free:]
            self.queued = len(queue)
            self._check()
            if not queue and not self.inflight:
                break
            time.sleep(self.poll)

    def _check(self) -> None:
        queue = self.launcher.queue([self.records[k].get("scheduler_job_id") for k in self.inflight])
        states: list[JobStatus] = []
        for key in list(self.inflight):
            rec, sj = self.records[key], self.inflight[key]
            st = job_status(rec, queue, self.launcher)
            if st.state not in (DONE, FAILED) and not self.launcher.detached and sj is not None and sj.done():
                st = job_status(rec, queue, self.launcher)  # re-read: it may have just written job.json
                if st.state not in (DONE, FAILED):
                    st.state, st.detail = FAILED, f"lost: job process ended without reporting ({_exc_line(sj)})"
            if st.state == FAILED and st.detail.startswith("lost:"):
                # give the scheduler/file system one more poll before declaring a job lost
                self.lost_polls[key] = self.lost_polls.get(key, 0) + 1
                if self.lost_polls[key] < 2:
                    states.append(st)
                    continue
            if st.state in (DONE, FAILED):
                del self.inflight[key]
                self.final[key] = st
                close_lost_runs([st])  # a job that died without a word: its MLflow run not left RUNNING
                self._announce(st)
            else:
                states.append(st)
                self._watch_waiting(key, queue)
        self._show(states)

    def _watch_waiting(self, key: str, queue: dict[str, QueueEntry] | None) -> None:
        """Stop the sweep when a job has waited ``stuck_after_s`` for a reason that cannot clear."""
        entry = (queue or {}).get(str(self.records[key].get("scheduler_job_id")))
        why = self.launcher.stuck(self.launcher_cfg, entry) if entry is not None and entry.phase == WAITING else None
        if why is None:
            self.stuck_since.pop(key, None)
            return
        since = self.stuck_since.setdefault(key, time.time())
        if time.time() - since < self.stuck_after:
            return
        ids = [str(self.records[k].get("scheduler_job_id")) for k in self.inflight]
        self.launcher.cancel(ids, [sj for sj in self.inflight.values() if sj is not None])
        label = self.launcher.scheduler or self.launcher.name
        raise JobsCannotStart(
            f"job {key} ({label} job {self.records[key].get('scheduler_job_id')}) cannot start: {label} "
            f"{entry.state} ({entry.reason}): {why}; cancelled the sweep's {len(ids)} unfinished job(s); "
            f"rerun with the same sweep_dir={self.sweep_dir} to continue"
        )

    def _show(self, states: list[JobStatus]) -> None:
        if self.progress is None:
            return
        done = sum(1 for st in self.final.values() if st.state == DONE)
        failed = len(self.final) - done
        running = sum(1 for st in states if st.state == RUNNING)
        pending = len(states) - running + self.queued
        reasons = sorted({st.detail for st in states if st.state == PENDING and "(" in st.detail})
        steps = [f"{st.key} {st.detail}" for st in states if st.state == RUNNING and st.detail.startswith("step ")]
        self.progress(
            f"jobs: {done} done, {running} running, {pending} pending, {failed} failed"
            + (f" [{', '.join(reasons)[:120]}]" if reasons else "")
            + f" (of {self.total})"
            + (f"; {', '.join(steps[:4])}{', ...' if len(steps) > 4 else ''}" if steps else "")
        )

    def _announce(self, st: JobStatus) -> None:
        n = len(self.final)
        kind = job_kind(self.records.get(st.key, {}))
        if st.state == DONE and kind != TRAIN_KIND:
            self.log(f"[{n}/{self.total}] done {st.key} ({kind}): {st.detail}")
        elif st.state == DONE:
            s = _summary(Path(st.output_dir))
            self.log(
                f"[{n}/{self.total}] done {st.key}: {s.get('steps')} steps, entropy "
                f"{_f(s.get('entropy/first_tenth'))} -> {_f(s.get('entropy/last_tenth'))}, "
                f"{validation_text(s)}"
            )
        else:
            self.log(f"[{n}/{self.total}] FAILED {st.key}: {st.detail} (log: {st.log})")

    def interrupted(self) -> None:
        if self.launcher.detached:
            self.log(
                f"interrupted: {self.launcher.name} jobs keep running; `entropyrl status {self.sweep_dir}`, then "
                f"`entropyrl report {self.sweep_dir}`"
            )
            return
        if self.launcher.in_process:
            return
        # SIGINT to each training process itself (not to submitit's controller, which would SIGKILL
        # it a second later): it finishes its step, checkpoints and ends its MLflow run KILLED
        pids = []
        for key in self.inflight:
            js = read_job_state(Path(self.records[key]["output_dir"]))
            if js.get("pid") and pid_alive(js.get("pid"), js.get("host")):
                with contextlib.suppress(OSError):
                    os.kill(int(js["pid"]), signal.SIGINT)
                    pids.append(int(js["pid"]))
        deadline = time.monotonic() + float(cfg_get(self.launcher_cfg, "stop_wait_s", 120.0))
        while time.monotonic() < deadline and any(pid_alive(pid, None) for pid in pids):  # no orphan left
            time.sleep(0.2)
        handles = [sj for sj in self.inflight.values() if sj is not None]
        self.launcher.cancel([], [sj for sj in handles if not _ended(sj)])  # what did not stop by itself
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(pid_alive(pid, None) for pid in pids):
            time.sleep(0.2)
        for pid in pids:  # deaf to both (a SIGINT before its handlers were set is ignored): no orphan left
            if pid_alive(pid, None):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self.log(
            f"interrupted: {self.launcher.name} jobs stopped at their last step (checkpointed); resuming "
            f"{self.sweep_dir} continues them from there"
        )


def _ended(sj) -> bool:
    try:
        return bool(sj.done())
    except Exception:  # noqa: BLE001 - a job whose state cannot be read has gone
        return True


def _summary(output_dir: Path) -> dict:
    try:
        return json.loads((output_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _exc_line(sj) -> str:
    try:
        exc = sj.exception()
    except Exception as e:  # noqa: BLE001
        exc = e
    if exc is None:
        return "no result"
    return (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
