"""``entropyrl sweep``, before anything runs: split the command line between the sweep and its
jobs, expand the ablation into jobs, compose and check every job's training config, check the
launcher's request, and open the sweep's MLflow parent run. ``following.run`` takes it from there.

Re-running a sweep on the same ``sweep_dir`` (or ``--resume``, which picks the latest sweep folder
of the ablation) plans the same jobs; the follower then submits only those neither done nor still
queued/running.
"""

# size: everything a sweep checks before it runs, in the order it checks it
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf

from ..conf import CONF_DIR, RUN_SCHEMAS, compose, config_groups, primary_defaults, to_plain
from ..core.errors import UserError
from ..core.mlflow_store import resolve_uri
from ..core.schema import defaults
from ..core.tracking import TrackingSettings, TrackingStore
from ..trainers.algos.algorithm import Algorithm
from ..trainers.async_rollout import check_async_settings
from .ablation import JOB_OWNED_KEYS, JobSpec, expand, override_key
from .job_kinds import job_class
from .jobs import compose_job_config, job_kind
from .launchers import Launcher, check_number, find_launcher, get_launcher
from .state import JobStatus, job_status, load_sweep, scheduler_ids, sweep_file

# Overrides that may differ between the first run of a sweep and its resumption.
FREE_KEYS = {"trainer.threads", "trainer.progress"}
TRAIN_PREFIX = "train."


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------
def _top_level_keys(config_name: str) -> set[str]:
    """The first components of every key a primary config can have: its own keys (its run schema's
    and any its YAML sets) and its groups."""
    raw = OmegaConf.load(CONF_DIR / f"{config_name}.yaml")
    keys = {str(k) for k in raw.keys() if k != "defaults"} | set(primary_defaults(config_name))
    keys |= set(defaults(RUN_SCHEMAS[config_name])) if config_name in RUN_SCHEMAS else set()
    return keys | {"hydra"}


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``(sweep_overrides, train_overrides)``.

    ``train.KEY=V`` (also ``+train.``/``~train.``) goes to every job's training config as ``KEY=V``;
    so does an override whose key belongs to the training config only (``trainer.total_steps=5``,
    ``algo=stare``, ``+val.x=1``). Everything else (ablation, launcher, tracking, seeds, ...) configures
    the sweep.
    """
    sweep_keys = _top_level_keys("sweep")
    train_keys = (_top_level_keys("train") | {g.split("/")[0] for g in config_groups()}) - sweep_keys
    sweep, train = [], []
    for o in overrides:
        head = o[: len(o) - len(o.lstrip("+~"))]
        body = o[len(head) :]
        if body.startswith(TRAIN_PREFIX):
            train.append(head + body[len(TRAIN_PREFIX) :])
        elif override_key(body).split(".")[0] in train_keys:
            train.append(o)
        else:
            sweep.append(o)
    return sweep, train


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------
@dataclass
class Plan:
    cfg: DictConfig
    sweep_dir: Path
    jobs: list[JobSpec]
    train_overrides: list[str]
    existing: dict | None  # sweep.json of a sweep already in sweep_dir
    launcher: Launcher
    command: str | None = None  # the command line that started it, for reports (the lab's)

    def rows(self) -> list[dict]:
        """The job table (dry-run): key, variant, seed, state, overrides, output dir."""
        states: dict[str, JobStatus] = {}
        if self.existing:
            old = find_launcher(self.existing.get("launcher", {}).get("name", "local"))
            recs = {r["key"]: r for r in self.existing.get("jobs", [])}
            queue = old.queue(scheduler_ids(list(recs.values()))) if old is not None else None
            states = {k: job_status(r, queue, old) for k, r in recs.items()}
        return [
            {
                "key": j.key,
                "variant": j.variant,
                "seed": j.seed,
                "state": states[j.key].state if j.key in states else "new",
                "overrides": [o for o in j.overrides if override_key(o) not in ("output_dir", "trainer.seed")],
                "output_dir": j.output_dir,
            }
            for j in self.jobs
        ]

    def sweep_record(self, tracking: dict) -> dict:
        """The sweep.json content: this plan merged into the existing sweep's records."""
        cfg, existing = self.cfg, self.existing or {}
        old_records = {r["key"]: r for r in existing.get("jobs", [])}
        records = []
        for job in self.jobs:
            rec = dict(old_records.get(job.key, {}))
            rec.update(job.to_dict())
            records.append(rec)
        records += [r for k, r in old_records.items() if k not in {j.key for j in self.jobs}]
        return {
            "sweep_id": existing.get("sweep_id") or f"{cfg.ablation.name}-{uuid.uuid4().hex[:8]}",
            "sweep_dir": str(self.sweep_dir),
            "created": existing.get("created") or time.time(),
            "ablation": OmegaConf.to_container(cfg.ablation, resolve=True),
            "seeds": sorted({j.seed for j in self.jobs}, key=[j.seed for j in self.jobs].index),
            "budget": [str(o) for o in (cfg.get("budget") or [])],
            "train_overrides": self.train_overrides,
            "launcher": OmegaConf.to_container(cfg.launcher, resolve=True),
            "tracking": tracking,
            "report": OmegaConf.to_container(cfg.report, resolve=True) if "report" in cfg else {},
            "command": self.command or existing.get("command"),
            "jobs": records,
        }


def find_latest_sweep(cfg: DictConfig) -> Path:
    root = Path(str(cfg.sweep_dir)).parent
    prefix = f"{cfg.ablation.name}-"
    found = sorted(
        (p for p in root.glob(f"{prefix}*") if (p / "sweep.json").exists()), key=lambda p: (p / "sweep.json").stat().st_mtime
    )
    if not found:
        raise UserError(
            f"--resume: no earlier sweep of ablation {cfg.ablation.name} under {root}; "
            f"pass sweep_dir=... or drop --resume to start one"
        )
    return found[-1]


def resume_overrides(
    cfg: DictConfig, sweep_ov: list[str], train_ov: list[str], *, explicit_dir: bool, log=print
) -> tuple[list[str], list[str]]:
    """For ``--resume``: the saved sweep's training overrides, seeds and budget wherever the command
    line gives none, so a bare ``entropyrl sweep ablation=X --resume`` continues the sweep as started."""
    sweep_dir = Path(str(cfg.sweep_dir)) if explicit_dir else find_latest_sweep(cfg)
    if not sweep_file(sweep_dir).exists():
        return sweep_ov, train_ov
    saved = load_sweep(sweep_dir)
    keys = {override_key(o) for o in sweep_ov}
    sweep_ov = list(sweep_ov)
    if not explicit_dir:
        sweep_ov.append(f"sweep_dir={sweep_dir.resolve()}")
    if "seeds" not in keys and saved.get("seeds"):
        sweep_ov.append(f"seeds=[{','.join(str(x) for x in saved['seeds'])}]")
    ran = list(dict.fromkeys(str(j["variant"]) for j in saved.get("jobs", []) if j.get("variant")))
    if "variants" not in keys and ran:
        sweep_ov.append("variants=[" + ",".join(json.dumps(v) for v in ran) + "]")
    if "budget" not in keys and saved.get("budget"):
        sweep_ov.append("budget=[" + ",".join(json.dumps(str(o)) for o in saved["budget"]) + "]")
    if not train_ov and saved.get("train_overrides"):
        train_ov = list(saved["train_overrides"])
        log(f"--resume: the sweep's own overrides: {' '.join(train_ov)}")
    sweep_ov += _saved_launcher(saved, sweep_ov, keys, str(cfg.launcher.name), log)
    return sweep_ov, train_ov


def _hydra_value(v) -> str:
    """A plain value as a Hydra override value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    return json.dumps(str(v))


def _saved_launcher(saved: dict, sweep_ov: list[str], keys: set[str], asked: str, log) -> list[str]:
    """The overrides that give a resumed sweep the launcher it was started with (its name and every
    setting: partition, resources, threads per job), unless the command line names a launcher or
    one of its keys (then that one is used, and said). Threads per job left to ``auto`` are pinned to
    what the jobs ran with (their ``trainer.threads``), so a resumed job does not run with another
    thread count because the machine is busier or idler now."""
    launcher = dict(saved.get("launcher") or {})
    name = launcher.pop("name", None)
    if not name:
        return []
    if any(k == "launcher" or k.startswith("launcher.") for k in keys):
        if asked != name:
            log(f"--resume: launcher={asked} as given, instead of the sweep's own launcher={name}")
        return []
    try:
        known = set(compose("sweep", [*sweep_ov, f"launcher={name}"], validate=False).launcher)
    except UserError:
        log(f"--resume: the sweep's launcher={name} is not available here; using launcher={asked}")
        return []
    if launcher.get("threads_per_job") == "auto":
        ran = {
            o.split("=", 1)[1]
            for j in saved.get("jobs", [])
            for o in j.get("overrides", [])
            if override_key(str(o)) == "trainer.threads"
        }
        if len(ran) == 1 and (n := next(iter(ran))).isdigit() and int(n) > 0:
            launcher["threads_per_job"] = int(n)
    out = [f"launcher={name}"] + [
        f"launcher.{k}={_hydra_value(v)}" for k, v in launcher.items() if k in known and not isinstance(v, dict)
    ]
    log(
        f"--resume: the sweep's own launcher: {name} ("
        + ", ".join(f"{k}={v}" for k, v in launcher.items() if k in known and not isinstance(v, dict))
        + ")"
    )
    return out


def plan(cfg: DictConfig, train_overrides: list[str], *, explicit_dir: bool, resume: bool) -> Plan:
    """Every job of the sweep, each training config composed and checked, the launcher's request
    checked; raises ``UserError`` before anything is created or submitted."""
    sweep_dir = Path(str(cfg.sweep_dir))
    if resume and not explicit_dir:
        sweep_dir = find_latest_sweep(cfg)
    sweep_dir = sweep_dir.resolve()
    existing = load_sweep(sweep_dir) if sweep_file(sweep_dir).exists() else None
    if resume and existing is None:
        raise UserError(f"--resume: {sweep_dir} holds no sweep (no sweep.json); drop --resume to start one")
    launcher = get_launcher(cfg.launcher)
    check_sweep_values(cfg, launcher)
    threads = launcher.threads(cfg.launcher)
    jobs = expand(
        cfg.ablation,
        seeds=cfg.seeds,
        sweep_dir=sweep_dir,
        budget=cfg.get("budget") or [],
        train_overrides=train_overrides,
        only=cfg.get("variants"),
        extra_overrides=[f"trainer.threads={threads}"] if threads else [],
    )
    if existing is not None:
        _check_compatible(existing, jobs, sweep_dir, cfg)
    validate_jobs(
        jobs,
        world_size=launcher.world_size(cfg.launcher),
        gpus_per_node=int(cfg.launcher.get("gpus_per_node", 0) or 0),
        ranks_per_node=launcher.tasks_per_node(cfg.launcher),
    )
    launcher.check(cfg.launcher)
    return Plan(cfg, sweep_dir, jobs, list(train_overrides), existing, launcher)


def check_sweep_values(cfg: DictConfig, launcher: Launcher) -> None:
    """The sweep's own values (seeds, poll_seconds, report.*) and the launcher's, before anything."""
    seeds = cfg.seeds
    seeds = list(seeds) if isinstance(seeds, (list, tuple, ListConfig)) else [seeds]
    for seed in seeds:
        check_number("seeds", seed, integer=True, minimum=0)
    check_number("poll_seconds", cfg.poll_seconds, integer=False, minimum=0, strict=True)
    report = cfg.get("report") or {}
    if "entropy_threshold" in report:
        check_number("report.entropy_threshold", report["entropy_threshold"], integer=False, minimum=0)
    if "tail_frac" in report:
        check_number("report.tail_frac", report["tail_frac"], integer=False, minimum=0, strict=True)
        if float(report["tail_frac"]) > 1:
            raise UserError(f"report.tail_frac={report['tail_frac']} is not allowed: a fraction in (0, 1]")
    launcher.check_values(cfg.launcher)
    launcher.parallelism(cfg.launcher)


def _check_compatible(existing: dict, jobs: list[JobSpec], sweep_dir: Path, cfg: DictConfig) -> None:
    name = existing.get("ablation", {}).get("name")
    if name and name != cfg.ablation.name:
        raise UserError(f"{sweep_dir} holds a sweep of ablation {name}, not {cfg.ablation.name}; pick another sweep_dir=...")
    old = {r["key"]: r for r in existing.get("jobs", [])}
    for job in jobs:
        rec = old.get(job.key)
        if rec is None:
            continue
        a = [o for o in rec["overrides"] if override_key(o) not in FREE_KEYS]
        b = [o for o in job.overrides if override_key(o) not in FREE_KEYS]
        if a != b:
            raise UserError(
                f"{sweep_dir} already holds job {job.key} with other training settings "
                f"({override_diff(a, b)}); resume it unchanged (--resume alone reuses the sweep's own "
                f"overrides) or start a new sweep_dir=..."
            )


def override_diff(old: list[str], new: list[str]) -> str:
    """``trainer.total_steps: 3 -> 4; algo.stare.p: removed (was 0.2)``: two override lists compared by key."""
    a = {override_key(o): o.split("=", 1)[-1] for o in old}
    b = {override_key(o): o.split("=", 1)[-1] for o in new}
    parts = []
    for key in dict.fromkeys([*a, *b]):
        if key not in b:
            parts.append(f"{key}: removed (was {a[key]})")
        elif key not in a:
            parts.append(f"{key}: added ({b[key]})")
        elif a[key] != b[key]:
            parts.append(f"{key}: {a[key]} -> {b[key]}")
    return "; ".join(parts) or f"order {old} -> {new}"


# ---------------------------------------------------------------------------------------------
# every job's training config
# ---------------------------------------------------------------------------------------------
def job_configs(jobs: list[JobSpec]) -> Iterator[tuple[JobSpec, DictConfig]]:
    """``(job, its training config)`` for every job, as the job will compose it (``compose_job_config``).

    Jobs that differ only in the keys the sweep sets per job (seed, output_dir, ...) share one
    composition (an ablation of 17 variants x 3 seeds composes 17 times, not 51); those keys are
    then set on a copy. Raises ``UserError`` naming the variant whose overrides do not compose.
    """
    composed: dict[tuple[str, ...], DictConfig] = {}
    for job in jobs:
        shape = tuple(o for o in job.overrides if override_key(o) not in JOB_OWNED_KEYS)
        if shape not in composed:
            try:
                composed[shape] = compose_job_config(job.overrides)
            except UserError as exc:
                raise UserError(f"variant {job.variant}: {exc}") from None
            yield job, composed[shape]
            continue
        cfg = composed[shape].copy()
        own = [o for o in job.overrides if override_key(o) in JOB_OWNED_KEYS]
        with_own = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o.lstrip("+") for o in own]))
        yield job, with_own


def validate_jobs(jobs: list[JobSpec], world_size: int = 1, gpus_per_node: int = 0, ranks_per_node: int = 1) -> None:
    """Compose every job's training config now, and check its kind and its algorithm and
    interventions (``Algorithm.from_train_config``: the check a training run makes before it
    creates anything), so a mistake fails before anything is submitted; with ``world_size`` ranks
    per job, its prompt counts must split evenly over them; an asynchronous job
    (``trainer.staleness``) starts a rollout worker per rank, and a worker with GPUs of its own
    (``trainer.rollout_gpus``, one trainer rank) needs them beside the rank's (``gpus_per_node``,
    when the launcher asks for GPUs)."""
    for job in jobs:
        job_class(job_kind(job.to_dict()))
    for job, cfg in job_configs(jobs):
        try:
            Algorithm.from_train_config(cfg)
            _check_async_placement(cfg, world_size, gpus_per_node, ranks_per_node)
        except UserError as exc:
            raise UserError(f"variant {job.variant}: {exc}") from None
        for key in ("prompts_per_step", "mini_batch_prompts"):
            value = int(cfg.trainer[key]) if "trainer" in cfg and key in cfg.trainer else 0
            if world_size > 1 and value % world_size:
                raise UserError(
                    f"variant {job.variant}: trainer.{key}={value} must be a multiple of the job's "
                    f"{world_size} ranks (launcher.nodes x launcher.tasks_per_node); set "
                    f"train.trainer.{key} to a multiple of {world_size}"
                )


def _check_async_placement(cfg: DictConfig, world_size: int, gpus_per_node: int, ranks_per_node: int) -> None:
    if "trainer" not in cfg:
        return
    staleness, rollout_gpus = check_async_settings(cfg)
    if staleness and rollout_gpus and world_size > 1:
        raise UserError(
            f"trainer.rollout_gpus={rollout_gpus} gives one rollout worker GPUs of its own, but the job's {world_size} "
            f"ranks start one worker each, which share their ranks' GPUs; set trainer.rollout_gpus=0, or "
            f"launcher.nodes=1 launcher.tasks_per_node=1"
        )
    if rollout_gpus and gpus_per_node and ranks_per_node + rollout_gpus > gpus_per_node:
        raise UserError(
            f"trainer.rollout_gpus={rollout_gpus} beside {ranks_per_node} trainer rank(s) needs "
            f"{ranks_per_node + rollout_gpus} GPUs per node; the job asks for launcher.gpus_per_node={gpus_per_node}; "
            f"set launcher.gpus_per_node={ranks_per_node + rollout_gpus}"
        )


# ---------------------------------------------------------------------------------------------
# MLflow
# ---------------------------------------------------------------------------------------------
def tracking_settings(cfg: DictConfig) -> dict:
    """``{enabled, uri, experiment, run_name, tags, retry_s, flush_wait_s}`` of the sweep: its jobs log to
    the same place, with its tags and its waits for a server; ``run_name`` names the parent run."""
    t = cfg.tracking
    settings = TrackingSettings.from_config(t)
    return {
        "enabled": bool(settings.enabled),
        "uri": resolve_uri(t),
        "experiment": str(t.experiment),
        "run_name": t.get("run_name") or None,
        "tags": {str(k): str(v) for k, v in (to_plain(t.get("tags")) or {}).items()},
        "retry_s": settings.retry_s,
        "flush_wait_s": settings.flush_wait_s,
    }


def open_parent_run(tracking: dict, sweep: dict) -> str | None:
    """Create the sweep's parent run (or mark the existing one RUNNING again); returns its id."""
    if not tracking["enabled"]:
        return None
    store = TrackingStore(tracking["uri"])  # mlflow loads here: a --dry-run never pays for it
    try:
        run_id = tracking.get("parent_run_id")
        if run_id:
            store.reopen(run_id)
            return run_id
        abl = sweep["ablation"]["name"]
        tags = {
            **(tracking.get("tags") or {}),  # the user's, under ours
            "entropyrl.sweep_id": sweep["sweep_id"],
            "sweep_id": sweep["sweep_id"],
            "ablation": abl,
            "entropyrl.role": "sweep",
            "entropyrl.sweep_dir": sweep["sweep_dir"],
            "launcher": sweep["launcher"]["name"],
        }
        params = {
            "ablation": abl,
            "seeds": json.dumps(sweep["seeds"]),
            "n_jobs": str(len(sweep["jobs"])),
            "variants": json.dumps(list(dict.fromkeys(j["variant"] for j in sweep["jobs"]))),
            "launcher": sweep["launcher"]["name"],
            "every_job": " ".join([*sweep.get("budget", []), *sweep.get("train_overrides", [])]),
        }
        return store.open_run(
            tracking["experiment"],
            tracking.get("run_name") or f"sweep-{Path(sweep['sweep_dir']).name}",
            tags=tags,
            params=params,
            description=f"Sweep of ablation `{abl}`: {len(sweep['jobs'])} jobs (child runs); report under artifacts/report.",
        )
    except Exception as exc:  # noqa: BLE001 - any store failure is the user's setup
        raise UserError(
            f"cannot open the sweep's MLflow parent run at {tracking['uri']}: {str(exc).strip().splitlines()[0]}"
        ) from None


def close_parent_run(tracking: dict, status: str) -> None:
    """End the parent run (``FAILED``/``KILLED``) when the sweep stops without a report."""
    if not tracking.get("enabled") or not tracking.get("parent_run_id"):
        return
    try:
        TrackingStore(tracking["uri"]).finish(tracking["parent_run_id"], status=status)
    except Exception:  # noqa: BLE001 - the sweep's own error is the one to report
        pass
