"""``entropyrl sweep``: plan the jobs of an ablation, open the MLflow parent run, submit what did
not finish yet, follow the jobs to the end and build the report.

Re-running a sweep on the same ``sweep_dir`` (or ``--resume``, which picks the latest sweep folder
of the ablation) submits only the jobs that are neither done nor still queued/running; finished
jobs are kept, failed ones are retried and continue from their last checkpoint.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from entropyrl.errors import UserError
from entropyrl.sweeps import launchers
from entropyrl.sweeps.ablation import JobSpec, expand, override_key, validate_jobs
from entropyrl.sweeps.jobs import TrainJob, job_environment, read_job_state, write_job_state
from entropyrl.sweeps.state import (DONE, FAILED, PENDING, RUNNING, JobStatus, job_status, load_sweep, pid_alive,
                                    save_sweep, slurm_states, sweep_file)

# Overrides that may differ between the first run of a sweep and its resumption.
FREE_KEYS = {"trainer.threads", "trainer.progress"}


@dataclass
class Plan:
    cfg: DictConfig
    sweep_dir: Path
    jobs: list[JobSpec]
    train_overrides: list[str]
    existing: dict | None          # sweep.json of a sweep already in sweep_dir

    def rows(self) -> list[dict]:
        """The job table (dry-run): key, variant, seed, state, overrides, output dir."""
        states: dict[str, JobStatus] = {}
        if self.existing:
            launcher = self.existing.get("launcher", {}).get("name", "local")
            recs = {r["key"]: r for r in self.existing.get("jobs", [])}
            sched = None
            if launcher == "slurm":
                sched = slurm_states([r.get("scheduler_job_id") for r in recs.values()])
            states = {k: job_status(r, sched, launcher) for k, r in recs.items()}
        return [{"key": j.key, "variant": j.variant, "seed": j.seed,
                 "state": states[j.key].state if j.key in states else "new",
                 "overrides": [o for o in j.overrides if override_key(o) not in ("output_dir", "trainer.seed")],
                 "output_dir": j.output_dir} for j in self.jobs]


# ---------------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------------
def absolute_uri(uri: str) -> str:
    """Make a local store URI independent of the working directory (jobs may run elsewhere)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    if uri.startswith("file://"):
        return uri
    if "://" not in uri and not uri.startswith(("databricks", "sqlite:")):
        return Path(uri).resolve().as_uri()
    return uri


def find_latest_sweep(cfg: DictConfig) -> Path:
    root = Path(str(cfg.sweep_dir)).parent
    prefix = f"{cfg.ablation.name}-"
    found = sorted((p for p in root.glob(f"{prefix}*") if (p / "sweep.json").exists()),
                   key=lambda p: (p / "sweep.json").stat().st_mtime)
    if not found:
        raise UserError(f"--resume: no earlier sweep of ablation {cfg.ablation.name} under {root}; "
                        f"pass sweep_dir=... or drop --resume to start one")
    return found[-1]


def plan(cfg: DictConfig, train_overrides: list[str], *, explicit_dir: bool, resume: bool) -> Plan:
    sweep_dir = Path(str(cfg.sweep_dir))
    if resume and not explicit_dir:
        sweep_dir = find_latest_sweep(cfg)
    sweep_dir = sweep_dir.resolve()
    existing = load_sweep(sweep_dir) if sweep_file(sweep_dir).exists() else None
    if resume and existing is None:
        raise UserError(f"--resume: {sweep_dir} holds no sweep (no sweep.json); drop --resume to start one")
    threads = launchers.threads_per_job(cfg.launcher)
    jobs = expand(cfg.ablation, seeds=cfg.seeds, sweep_dir=sweep_dir, budget=cfg.get("budget") or [],
                  train_overrides=train_overrides, only=cfg.get("variants"),
                  extra_overrides=[f"trainer.threads={threads}"] if threads else [])
    if existing is not None:
        _check_compatible(existing, jobs, sweep_dir, cfg)
    validate_jobs(jobs)
    return Plan(cfg, sweep_dir, jobs, list(train_overrides), existing)


def _check_compatible(existing: dict, jobs: list[JobSpec], sweep_dir: Path, cfg: DictConfig) -> None:
    name = existing.get("ablation", {}).get("name")
    if name and name != cfg.ablation.name:
        raise UserError(f"{sweep_dir} holds a sweep of ablation {name}, not {cfg.ablation.name}; "
                        f"pick another sweep_dir=...")
    old = {r["key"]: r for r in existing.get("jobs", [])}
    for job in jobs:
        rec = old.get(job.key)
        if rec is None:
            continue
        a = [o for o in rec["overrides"] if override_key(o) not in FREE_KEYS]
        b = [o for o in job.overrides if override_key(o) not in FREE_KEYS]
        if a != b:
            diff = next((f"{x} -> {y}" for x, y in zip(a, b) if x != y), f"{a[len(b):] or b[len(a):]}")
            raise UserError(f"{sweep_dir} already holds job {job.key} with other training settings ({diff}); "
                            f"resume it unchanged or start a new sweep_dir=...")


def _tracking(cfg: DictConfig) -> dict:
    from entropyrl.trainers.tracking import resolve_uri

    t = cfg.tracking
    return {"enabled": bool(t.get("enabled", True)), "uri": absolute_uri(resolve_uri(t)),
            "experiment": str(t.experiment)}


# ---------------------------------------------------------------------------------------------
# MLflow parent run
# ---------------------------------------------------------------------------------------------
def open_parent_run(tracking: dict, sweep: dict) -> str | None:
    """Create the sweep's parent run (or mark the existing one RUNNING again); returns its id."""
    if not tracking["enabled"]:
        return None
    from mlflow.entities import Param, RunStatus
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking["uri"])
    try:
        run_id = tracking.get("parent_run_id")
        if run_id:
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            return run_id
        exp = client.get_experiment_by_name(tracking["experiment"])
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(tracking["experiment"])
        abl = sweep["ablation"]["name"]
        run = client.create_run(exp_id, run_name=f"sweep-{Path(sweep['sweep_dir']).name}", tags={
            "entropyrl.sweep_id": sweep["sweep_id"], "sweep_id": sweep["sweep_id"], "ablation": abl,
            "entropyrl.role": "sweep", "entropyrl.sweep_dir": sweep["sweep_dir"],
            "launcher": sweep["launcher"]["name"], "mlflow.note.content":
                f"Sweep of ablation `{abl}`: {len(sweep['jobs'])} jobs (child runs); report under artifacts/report."})
        params = {"ablation": abl, "seeds": json.dumps(sweep["seeds"]), "n_jobs": str(len(sweep["jobs"])),
                  "variants": json.dumps(list(dict.fromkeys(j["variant"] for j in sweep["jobs"])))[:6000],
                  "launcher": sweep["launcher"]["name"],
                  "every_job": " ".join([*sweep.get("budget", []), *sweep.get("train_overrides", [])])[:6000]}
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
        return run.info.run_id
    except Exception as exc:  # noqa: BLE001 - any store failure is the user's setup
        raise UserError(f"cannot open the sweep's MLflow parent run at {tracking['uri']}: "
                        f"{str(exc).strip().splitlines()[0]}") from None


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------
def run(plan_: Plan, *, wait: bool = True, log: Callable[[str], None] = print) -> dict:
    """Submit the plan's unfinished jobs, follow them (``wait``) and build the report.

    Returns ``{"sweep_dir", "sweep_id", "counts", "failed": [JobStatus...], "report": path|None}``.
    """
    from entropyrl.trainers.tracking import check_reachable

    cfg, sweep_dir = plan_.cfg, plan_.sweep_dir
    tracking = _tracking(cfg)
    if tracking["enabled"]:  # fail before anything is created or submitted
        check_reachable(tracking["uri"])
    existing = plan_.existing or {}
    old_tr = existing.get("tracking", {})
    if old_tr.get("uri") and tracking["enabled"] and old_tr.get("uri") != tracking["uri"]:
        raise UserError(f"{sweep_dir} tracks to {old_tr['uri']}, not {tracking['uri']}: its jobs' MLflow runs "
                        f"live there; pass tracking.uri={old_tr['uri']}")
    tracking["parent_run_id"] = old_tr.get("parent_run_id") if tracking["enabled"] else None
    launcher_cfg = OmegaConf.to_container(cfg.launcher, resolve=True)
    old_records = {r["key"]: r for r in existing.get("jobs", [])}
    records = []
    for job in plan_.jobs:
        rec = dict(old_records.get(job.key, {}))
        rec.update(job.to_dict())
        records.append(rec)
    records += [r for k, r in old_records.items() if k not in {j.key for j in plan_.jobs}]
    sweep = {
        "sweep_id": existing.get("sweep_id") or f"{cfg.ablation.name}-{uuid.uuid4().hex[:8]}",
        "sweep_dir": str(sweep_dir),
        "created": existing.get("created") or time.time(),
        "ablation": OmegaConf.to_container(cfg.ablation, resolve=True),
        "seeds": [int(s) for s in cfg.seeds],
        "budget": [str(o) for o in (cfg.get("budget") or [])],
        "train_overrides": plan_.train_overrides,
        "launcher": launcher_cfg,
        "tracking": tracking,
        "report": OmegaConf.to_container(cfg.report, resolve=True) if "report" in cfg else {},
        "jobs": records,
    }
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with _FolderLock(sweep_dir):
        return _run_locked(plan_, cfg, sweep_dir, sweep, tracking, existing, records, wait, log)


class _FolderLock:
    """One `entropyrl sweep` process follows a sweep folder at a time (a second one would submit the
    same pending jobs again)."""

    def __init__(self, sweep_dir: Path):
        self.path = sweep_dir / ".sweep.lock"

    def __enter__(self):
        try:
            held = json.loads(self.path.read_text())
        except (OSError, ValueError):
            held = {}
        if held and pid_alive(held.get("pid"), held.get("host")) and held.get("pid") != os.getpid():
            raise UserError(f"another `entropyrl sweep` (pid {held['pid']}) is following {self.path.parent}; "
                            f"wait for it or stop it (`entropyrl status {self.path.parent}` shows the jobs)")
        self.path.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
        return self

    def __exit__(self, *exc):
        try:
            self.path.unlink()
        except OSError:
            pass
        return False


def _run_locked(plan_: Plan, cfg: DictConfig, sweep_dir: Path, sweep: dict, tracking: dict, existing: dict,
                records: list[dict], wait: bool, log: Callable[[str], None]) -> dict:
    save_sweep(sweep_dir, sweep)  # before the parent run: a crash leaves a resumable folder
    tracking["parent_run_id"] = open_parent_run(tracking, sweep)
    save_sweep(sweep_dir, sweep)
    if tracking["parent_run_id"]:
        log(f"MLflow parent run {tracking['parent_run_id']} (experiment {tracking['experiment']}, {tracking['uri']})")

    name = sweep["launcher"]["name"]
    keys = {j.key for j in plan_.jobs}
    sched = slurm_states([r.get("scheduler_job_id") for r in records]) if name == "slurm" else None
    todo, adopted, done = [], [], []
    for rec in records:
        if rec["key"] not in keys:
            continue
        st = job_status(rec, sched, existing.get("launcher", {}).get("name", name))
        if st.state == DONE:
            done.append(rec["key"])
        elif st.state in (RUNNING, PENDING) and _still_owned(rec, st, name, sched):
            adopted.append(rec)
        else:
            todo.append(rec)
    log(f"sweep {sweep['sweep_id']}: {len(plan_.jobs)} jobs ({len(done)} done, {len(adopted)} still queued/running, "
        f"{len(todo)} to run) on {launchers.describe(cfg.launcher)} -> {sweep_dir}")
    follower = _Follower(sweep, sweep_dir, cfg, tracking, log)
    try:
        follower.go(todo, adopted, wait)
    except KeyboardInterrupt:
        follower.interrupted()
        raise
    counts, failed = follower.counts()
    result = {"sweep_dir": str(sweep_dir), "sweep_id": sweep["sweep_id"], "counts": counts, "failed": failed,
              "report": None, "parent_run_id": tracking["parent_run_id"]}
    if wait:
        from entropyrl.sweeps.report import build_report

        rep = build_report(sweep_dir, log=log)
        result["report"] = rep["report"]
        result["report_data"] = rep
    return result


def _still_owned(rec: dict, st: JobStatus, launcher: str, sched: dict | None) -> bool:
    """A queued/running job a previous `entropyrl sweep` submitted that will finish on its own."""
    if launcher == "slurm":
        return st.scheduler_job_id is not None and sched is not None and str(st.scheduler_job_id) in sched
    js = read_job_state(Path(rec["output_dir"]))
    return js.get("state") == "running" and bool(pid_alive(js.get("pid"), js.get("host")))


class _Follower:
    """Submits jobs (keeping at most the launcher's limit in flight) and reports each as it ends."""

    def __init__(self, sweep: dict, sweep_dir: Path, cfg: DictConfig, tracking: dict, log):
        self.sweep, self.sweep_dir, self.cfg, self.tracking, self.log = sweep, sweep_dir, cfg, tracking, log
        self.launcher = sweep["launcher"]
        self.name = self.launcher["name"]
        self.records = {r["key"]: r for r in sweep["jobs"]}
        self.env = job_environment()
        self.poll = float(cfg.get("poll_seconds", 2.0))
        self.inflight: dict[str, object] = {}    # key -> submitit job (None when adopted)
        self.final: dict[str, JobStatus] = {}
        self.lost_polls: dict[str, int] = {}
        self.total = 0
        self.executor = None

    # -- submission ---------------------------------------------------------------------------
    def _callable(self, rec: dict) -> TrainJob:
        spec = {k: rec[k] for k in ("key", "variant", "seed", "overrides", "output_dir")}
        tags = {"sweep_id": self.sweep["sweep_id"], "ablation": self.sweep["ablation"]["name"],
                "variant": rec["variant"], "seed": rec["seed"], "entropyrl.sweep_dir": str(self.sweep_dir)}
        tracking = {**{k: self.tracking[k] for k in ("enabled", "uri", "experiment", "parent_run_id")},
                    "run_name": f"{rec['variant']}-s{rec['seed']}", "tags": tags}
        debug = self.name == "debug"
        return TrainJob(spec, tracking, env=self.env,
                        raise_errors=(not debug) or bool(self.launcher.get("post_mortem", False)), echo=not debug)

    def _prepare(self, rec: dict) -> None:
        out = Path(rec["output_dir"])
        out.mkdir(parents=True, exist_ok=True)
        old = read_job_state(out)
        if old:
            with (out / "job.history.jsonl").open("a") as f:
                f.write(json.dumps(old) + "\n")
        write_job_state(out, {"state": "submitted", "attempt": int(old.get("attempt", 0)), "submitted": time.time(),
                              "key": rec["key"]})

    def _submit(self, recs: list[dict]) -> None:
        if not recs:
            return
        if self.executor is None:
            self.executor = launchers.make_executor(self.launcher, self.sweep_dir / "logs")
        for rec in recs:
            self._prepare(rec)
        if self.name == "slurm":
            with self.executor.batch():
                jobs = [self.executor.submit(self._callable(rec)) for rec in recs]
        else:
            jobs = [self.executor.submit(self._callable(rec)) for rec in recs]
        for rec, sj in zip(recs, jobs):
            if self.name == "debug":  # in this process: the job's own train.log is its log
                rec["scheduler_job_id"], rec["stdout"], rec["stderr"] = None, None, None
            else:
                rec["scheduler_job_id"] = str(sj.job_id)
                rec["stdout"], rec["stderr"] = str(sj.paths.stdout), str(sj.paths.stderr)
            rec["submitted"] = time.time()
            rec["submissions"] = int(rec.get("submissions", 0)) + 1
            self.inflight[rec["key"]] = sj
            self.log(f"submitted {rec['key']}" + (f" (job {sj.job_id})" if self.name != "debug" else ""))
        save_sweep(self.sweep_dir, self.sweep)

    # -- following ----------------------------------------------------------------------------
    def go(self, todo: list[dict], adopted: list[dict], wait: bool) -> None:
        self.total = len(todo) + len(adopted)
        for rec in adopted:
            self.inflight[rec["key"]] = None
        limit = launchers.max_in_flight(self.launcher)
        queue = list(todo)
        if self.name == "debug":
            for rec in queue:
                self._submit([rec])
                sj = self.inflight[rec["key"]]
                sj.results()  # runs the job here
                self._check()
            return
        if limit is None:
            self._submit(queue)
            queue = []
        if not wait:
            if queue:
                self._submit(queue)
            return
        while True:
            free = (limit - len(self.inflight)) if limit is not None else len(queue)
            if queue and free > 0:
                self._submit(queue[:free])
                queue = queue[free:]
            self._check()
            if not queue and not self.inflight:
                break
            time.sleep(self.poll)

    def _check(self) -> None:
        sched = None
        if self.name == "slurm":
            ids = [self.records[k].get("scheduler_job_id") for k in self.inflight]
            sched = slurm_states(ids)
        for key in list(self.inflight):
            rec, sj = self.records[key], self.inflight[key]
            st = job_status(rec, sched, self.name)
            if st.state not in (DONE, FAILED) and self.name == "local" and sj is not None and sj.done():
                st = job_status(rec, sched, self.name)  # re-read: it may have just written job.json
                if st.state not in (DONE, FAILED):
                    st.state, st.detail = FAILED, f"lost: job process ended without reporting ({_exc_line(sj)})"
            if st.state == FAILED and st.detail.startswith("lost:"):
                # give the scheduler/file system one more poll before declaring a job lost
                self.lost_polls[key] = self.lost_polls.get(key, 0) + 1
                if self.lost_polls[key] < 2:
                    continue
            if st.state in (DONE, FAILED):
                del self.inflight[key]
                self.final[key] = st
                self._announce(st)

    def _announce(self, st: JobStatus) -> None:
        n = len(self.final)
        if st.state == DONE:
            s = _summary(Path(st.output_dir))
            self.log(f"[{n}/{self.total}] done {st.key}: {s.get('steps')} steps, entropy "
                     f"{_f(s.get('entropy/first_tenth'))} -> {_f(s.get('entropy/last_tenth'))}, "
                     f"val acc {_f(s.get('final/val/acc'))}")
        else:
            self.log(f"[{n}/{self.total}] FAILED {st.key}: {st.detail} (log: {st.log})")

    def interrupted(self) -> None:
        if self.name == "local":
            for sj in self.inflight.values():
                if sj is not None:
                    try:
                        sj.cancel()
                    except Exception:  # noqa: BLE001
                        pass
            self.log(f"interrupted: local jobs stopped; continue with `entropyrl sweep ... sweep_dir={self.sweep_dir}` "
                     f"(jobs resume from their checkpoints)")
        elif self.name == "slurm":
            self.log(f"interrupted: SLURM jobs keep running; `entropyrl status {self.sweep_dir}`, then "
                     f"`entropyrl report {self.sweep_dir}`")

    def counts(self) -> tuple[dict, list[JobStatus]]:
        from entropyrl.sweeps.state import sweep_status

        _, statuses = sweep_status(self.sweep_dir)
        counts = {s: sum(1 for st in statuses if st.state == s) for s in (DONE, RUNNING, PENDING, FAILED)}
        return counts, [st for st in statuses if st.state == FAILED]


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
