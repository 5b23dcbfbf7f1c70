"""Run tracking: MLflow (local sqlite by default, any server via MLFLOW_TRACKING_URI or
``tracking.uri``) plus ``<output_dir>/metrics.jsonl``, written side by side.

The one place the package talks to MLflow (``tests/e2e/test_orchestrator.py::test_mlflow_is_reached_only_through_core_tracking`` keeps it so):

- ``RunTracker``: one training job's run, opened in the job's process (``start``, ``log_metrics``,
  ``log_artifact``, ``set_tags``, ``finish``);
- ``TrackingStore``: runs addressed by id from any process: a sweep's (or the lab's) parent run,
  an eval's run (``open_run``, ``reopen``, ``log_params``, ``log_metrics``, ``log_artifact``,
  ``set_tags``, ``finish``).

A resumed job continues the *same* MLflow run (its id is kept in ``<output_dir>/tracking.json``)
and never logs a step twice: steps already in the run's history are skipped, so a crash and
resume (or a SLURM requeue) leave one continuous step sequence.

``metrics.jsonl`` is the record. What goes to MLflow passes through an ``Outbox``
(``core/outbox.py``): when the server stops answering mid-run, training goes on with one warning,
entries are queued on disk and delivered when it answers again, at the latest at the end of the
run or on resume; the run's final state is delivered last, so FINISHED means every step is there.
"""

# size: the one place the package talks to MLflow (a test keeps it so): the job's run and the run store share its offline and retry rules
from __future__ import annotations

import contextlib
import json
import math
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .errors import UserError
from .files import atomic_write_text
from .mlflow_store import experiment_id, mlflow_key, resolve_uri, store_lock
from .outbox import Outbox, short_http_retries


def server_answers(uri: str, timeout: float = 3.0) -> bool:
    """Whether an HTTP tracking server answers ``/health`` now (a local store always does)."""
    try:
        check_reachable(uri, timeout=timeout)
        return True
    except UserError:
        return False


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail fast (before any training) when an HTTP tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
            if resp.status >= 500:
                raise OSError(f"HTTP {resp.status}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(
            f"cannot reach the MLflow tracking server at {uri} ({reason}); start it "
            f"(mlflow server ...) or point MLFLOW_TRACKING_URI/tracking.uri elsewhere"
        ) from None


def flatten(cfg: Any, prefix: str = "") -> dict[str, str]:
    """``{"algo.clip.low": "0.2", ...}``: a nested config as MLflow params."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    out: dict[str, str] = {}
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = json.dumps(cfg) if isinstance(cfg, (list, tuple)) else str(cfg)
    return out


@dataclass(frozen=True)
class TrackingSettings:
    """The ``tracking`` keys the tracker reads, each default declared once: the value of
    the run schema's ``core/schema/tracking.py`` (a test holds them equal), for a section built by hand that leaves
    one out. A key missing or null takes its default."""

    enabled: bool = True  # false: no MLflow run; metrics.jsonl and the run's files only
    retry_s: float = 10.0  # server gone mid-run: ask it every this many seconds
    flush_wait_s: float = 60.0  # end of a run with entries still queued: wait at most this long

    @classmethod
    def from_config(cls, section) -> TrackingSettings:
        values = {f.name: section.get(f.name) for f in fields(cls)} if section is not None else {}
        return cls(**{k: v for k, v in values.items() if v is not None})


class RunTracker:
    """One training job's run: MLflow + metrics.jsonl. ``enabled=false`` keeps only the jsonl."""

    def __init__(self, tracking_cfg, output_dir: Path, log=print):
        self.cfg = tracking_cfg
        self.log = log
        self.output_dir = Path(output_dir)
        self.metrics_path = self.output_dir / "metrics.jsonl"
        self.state_path = self.output_dir / "tracking.json"
        self.settings = TrackingSettings.from_config(tracking_cfg)
        self.enabled = bool(self.settings.enabled)
        self.run_id: str | None = None
        self.uri = resolve_uri(tracking_cfg)
        self._logged_through = -1  # MLflow already holds steps <= this (from before a resume)
        self._mlflow = None
        self._client = None
        self.outbox: Outbox | None = None  # what MLflow has not received yet (tracking.queue.jsonl)
        self.queue_path = self.output_dir / "tracking.queue.jsonl"
        self._lines: list[str] | None = None  # this run's copy of metrics.jsonl (read at its first step)
        self._size = 0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, full_cfg, run_name: str, resume_step: int | None) -> None:
        """Open (or re-open, when resuming) the run; log params and tags on a fresh run."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._truncate_jsonl(resume_step)
        if not self.enabled:
            return
        check_reachable(self.uri)
        short_http_retries()  # seconds, not minutes, per call when the server goes away
        import mlflow

        self._mlflow = mlflow
        mlflow.set_tracking_uri(self.uri)
        previous = read_run_link(self.state_path)
        if resume_step is None:
            self.queue_path.unlink(missing_ok=True)
        try:
            with store_lock(self.uri):  # first use of a fresh sqlite store: one process at a time
                # the client opens (and on a fresh sqlite file, creates) the store: inside the lock
                self._client = mlflow.tracking.MlflowClient(self.uri)
                self.outbox = Outbox(
                    self.queue_path,
                    self._deliver,
                    lambda: server_answers(self.uri),
                    self.uri,
                    self.log,
                    retry_s=float(self.settings.retry_s or TrackingSettings.retry_s),
                )
                # a run link without a checkpoint to resume from: the run died before its first save
                # (or while starting). Its steps are computed again from step 1, so a run that holds
                # steps is not reopened (MLflow would keep the old values of those steps): a new run
                # replaces it and the old one is ended and tagged superseded; one that holds none
                # (killed while starting) is reused, not left RUNNING beside a new one.
                replaced = None
                if previous.get("run_id") and resume_step is None and self._holds_steps(previous):
                    replaced, previous = previous, {}
                if previous.get("run_id"):
                    run = mlflow.start_run(run_id=previous["run_id"])
                    self.run_id = run.info.run_id
                    # what an earlier process queued, up to the checkpoint (later steps are recomputed)
                    self.outbox.keep(
                        lambda e: e.get("kind") == "artifact"
                        or (e.get("kind") == "metrics" and int(e.get("step", 0)) <= int(resume_step or 0))
                    )
                    self.outbox.flush(wait_s=0.01)
                    self._logged_through = self._max_logged_step()
                    if resume_step is None:  # reused after a kill while starting: its params may be partial
                        self._log_params(full_cfg)
                else:
                    mlflow.set_experiment(experiment_id=experiment_id(self._client, self.uri, str(self.cfg.experiment)))
                    tags = {str(k): str(v) for k, v in (self.cfg.get("tags") or {}).items()}
                    tags["entropyrl.output_dir"] = str(self.output_dir.resolve())
                    parent = self.cfg.get("parent_run_id")
                    if parent:
                        tags["mlflow.parentRunId"] = str(parent)
                    run = mlflow.start_run(run_name=run_name, tags=tags)
                    self.run_id = run.info.run_id
                    # the link first: a kill from here on leaves a run the next start finds and reuses
                    atomic_write_text(self.state_path, json.dumps({"run_id": self.run_id, "uri": self.uri}))
                    self._log_params(full_cfg)
                    if replaced:
                        self._supersede(replaced["run_id"])
                    if parent:  # a sweep job run again from scratch (its folder deleted): the earlier child
                        for earlier in self._siblings_named(str(parent), run_name):
                            self._supersede(earlier)
        except Exception as exc:  # noqa: BLE001 - any store failure is the user's setup
            if isinstance(exc, UserError):
                raise
            elsewhere = previous.get("uri")
            hint = (
                f"this run was tracked in {elsewhere} (tracking.json): resume it with tracking.uri={elsewhere}"
                if elsewhere and elsewhere != self.uri
                else "check MLFLOW_TRACKING_URI/tracking.uri"
            )
            raise UserError(f"cannot open an MLflow run at {self.uri}: {str(exc).splitlines()[0]} ({hint})") from None

        atomic_write_text(self.state_path, json.dumps({"run_id": self.run_id, "uri": self.uri}))
        self._check_artifact_folder()

    def _check_artifact_folder(self) -> None:
        """A local artifact folder this process cannot write: one line now, naming it, before any
        training, and the run ended FAILED; not a queue of artifacts that can never be delivered."""
        path = local_artifact_path(self._client.get_run(self.run_id).info.artifact_uri)
        if path is None:  # a server or an object store: its own errors, delivered or queued
            return
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".entropyrl-write-check"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            with contextlib.suppress(Exception):
                self._client.set_terminated(self.run_id, status="FAILED")
            _pop_active_run(self._mlflow)
            raise UserError(
                f"cannot write MLflow artifacts to {path} ({exc.strerror or type(exc).__name__}): make that folder "
                f"writable, or track elsewhere (tracking.uri=<another sqlite file or an MLflow server>; a sqlite "
                f"store keeps its artifacts in mlruns beside its database file)"
            ) from None

    def _log_params(self, full_cfg) -> None:
        items = list(flatten(full_cfg).items())
        for i in range(0, len(items), 100):
            self._mlflow.log_params({k: v[:6000] for k, v in items[i : i + 100]})

    def _holds_steps(self, previous: dict) -> bool:
        """Whether the linked run logged any step (a run in another store counts as holding some:
        it cannot be looked at, and is not reopened from this one)."""
        if previous.get("uri", self.uri) != self.uri:
            return True
        return bool(self._client.get_metric_history(previous["run_id"], "entropy"))

    def _supersede(self, old_run_id: str) -> None:
        """The run this one replaces: tagged ``entropyrl.superseded_by`` and, if still RUNNING (its
        process died without a word), ended FAILED. A store that refuses is not worth failing over."""
        try:
            self._client.set_tag(old_run_id, "entropyrl.superseded_by", self.run_id)
            old = self._client.get_run(old_run_id)
            if old.info.run_name and not old.info.run_name.endswith("(superseded)"):  # two children of one name
                self._client.set_tag(old_run_id, "mlflow.runName", f"{old.info.run_name} (superseded)")  # read apart
            if old.info.status == "RUNNING":
                self._client.set_terminated(old_run_id, status="FAILED")
            self.log(
                f"MLflow run {old_run_id} (this folder's earlier attempt, before any checkpoint) is superseded by {self.run_id}"
            )
        except Exception:  # noqa: BLE001 - a run deleted from the store, a store that went away
            pass

    def _siblings_named(self, parent_run_id: str, run_name: str) -> list[str]:
        """Other child runs of the same sweep parent under the same name (the same job, earlier)."""
        try:
            experiment = self._client.get_run(parent_run_id).info.experiment_id
            found = self._client.search_runs(
                [experiment],
                filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' and attributes.run_name = '{run_name}'",
            )
        except Exception:  # noqa: BLE001 - a parent deleted from the store: nothing to mark
            return []
        return [r.info.run_id for r in found if r.info.run_id != self.run_id and "entropyrl.superseded_by" not in r.data.tags]

    def _max_logged_step(self) -> int:
        client = self._mlflow.tracking.MlflowClient()
        history = client.get_metric_history(self.run_id, "entropy")
        return max((m.step for m in history), default=-1)

    def _truncate_jsonl(self, resume_step: int | None) -> None:
        """Drop metrics.jsonl lines after the checkpoint we resume from (they are recomputed), and a
        half-written line a killed run left behind (written again atomically)."""
        if not self.metrics_path.exists():
            return
        if resume_step is None:
            self.metrics_path.unlink()
            return
        rows, damaged = parse_metrics(self.metrics_path.read_text(errors="replace"))
        if damaged:
            self.log(f"warning: {self.metrics_path}: dropped {damaged} incomplete line(s) left by an interrupted write")

        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows if r.get("step", -1) <= resume_step))

    def _guard_record(self) -> None:
        """metrics.jsonl deleted or cut short under a live run: write it again from this run's copy."""
        if self._lines is None:
            self._lines = [json.dumps(r) for r in read_metrics(self.output_dir)]
            self._size = max(self._record_size(), 0)
            return
        if self._record_size() < self._size:
            atomic_write_text(self.metrics_path, "".join(line + "\n" for line in self._lines))
            self.log(
                f"warning: {self.metrics_path} was deleted or cut short while the run wrote it: written "
                f"again from the run's own copy ({len(self._lines)} steps)"
            )

    def _record_size(self) -> int:
        """metrics.jsonl's size now; -1 when it is not there (deleted at any moment, even between
        two looks)."""
        try:
            return self.metrics_path.stat().st_size
        except FileNotFoundError:
            return -1

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One row of ``metrics.jsonl`` and the same metrics to MLflow, under the same names: MLflow
        rejects '@', so ``val/math500/avg@4`` is ``val/math500/avg_at_4`` in the file as well, and a
        name found in one is found in the other."""
        clean = {mlflow_key(k): float(v) for k, v in metrics.items() if v is not None}
        line = json.dumps({"step": step, **{k: (v if math.isfinite(v) else None) for k, v in clean.items()}})
        self._guard_record()
        with self.metrics_path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            self._size = os.fstat(f.fileno()).st_size  # of what was written to, even if deleted since
        self._lines.append(line)
        if self.outbox is not None and step > self._logged_through:
            finite = {k: v for k, v in clean.items() if math.isfinite(v)}
            self.outbox.put({"kind": "metrics", "step": step, "time": int(time.time() * 1000), "metrics": finite})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self.outbox is not None and Path(path).exists():
            self.outbox.put({"kind": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    @property
    def online(self) -> bool:
        """Whether MLflow holds everything sent so far (nothing queued)."""
        return self.outbox is None or self.outbox.pending == 0

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Tag the run (no-op when tracking is off or the run was never opened)."""
        if self.enabled and self.run_id and self.online:  # a server that went away: no tag, no stall
            TrackingStore(self.uri).set_tags(self.run_id, tags)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run with ``status``, delivered after everything queued before it (waiting a
        bounded ``tracking.flush_wait_s`` for a server that went away)."""
        if self.outbox is None:
            return
        self.outbox.put({"kind": "end", "status": status})
        if self.outbox.pending and not self.outbox.flush(wait_s=float(self.settings.flush_wait_s or 0)):
            away = "server" if self.uri.startswith(("http://", "https://")) else "store"
            self.log(
                f"warning: the MLflow {away} at {self.uri} did not take them: {self.outbox.pending} entries "
                f"(metrics, files, the run's {status} state) stay queued in {self.queue_path}; running the same "
                f"command again (same output_dir) delivers them"
            )
        active = self._mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            _pop_active_run(self._mlflow)  # its end state went (or waits) through the outbox

    def _deliver(self, entry: dict) -> None:
        """Send one outbox entry to the run (raises when the server does not take it)."""
        from mlflow.entities import Metric

        kind = entry.get("kind")
        if kind == "metrics":
            metrics = [Metric(k, v, int(entry.get("time", 0)), int(entry["step"])) for k, v in entry["metrics"].items()]
            for i in range(0, len(metrics), 500):
                self._client.log_batch(self.run_id, metrics=metrics[i : i + 500])
        elif kind == "artifact" and Path(entry["path"]).exists():
            self._client.log_artifact(self.run_id, entry["path"], artifact_path=entry.get("artifact_path"))
        elif kind == "end":
            self._client.set_terminated(self.run_id, status=str(entry["status"]))


def local_artifact_path(artifact_uri: str | None) -> Path | None:
    """The folder of a local artifact URI (``file://...`` or a plain path), else None."""
    if not artifact_uri:
        return None
    if artifact_uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(artifact_uri).path))
    if "://" in artifact_uri or ":" in artifact_uri.split("/", 1)[0]:
        return None
    return Path(artifact_uri)


def _pop_active_run(mlflow) -> None:
    """Leave the fluent API's active run without a call to a server that is away (its end state is
    queued); otherwise MLflow's exit hook would mark it FINISHED."""
    from mlflow.environment_variables import MLFLOW_RUN_ID

    with contextlib.suppress(Exception):  # private API: at worst the exit hook ends it
        stack = mlflow.tracking.fluent._active_run_stack.get()
        if stack:
            MLFLOW_RUN_ID.unset()
            stack.pop()


class TrackingStore:
    """Runs of one tracking store (``uri``), addressed by run id, for runs that are not one
    process's active run: the parent run of a sweep or of the lab (opened by the sweep process,
    ended by its report), an eval's run, tags on a finished training run.

    MLflow is imported on first use (about two seconds), so a dry run never pays for it. Store
    failures raise MLflow's own exceptions; the caller decides whether they are fatal.
    """

    PARAM_CHARS = 6000  # MLflow's limit on a param value

    def __init__(self, uri: str):
        self.uri = uri
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(self.uri)
        return self._client

    def experiment_id(self, name: str) -> str:
        """The id of experiment ``name``, created when missing (one process at a time on a fresh
        sqlite store: ``store_lock``)."""
        with store_lock(self.uri):
            return experiment_id(self.client, self.uri, name)

    def open_run(
        self,
        experiment: str,
        run_name: str,
        *,
        tags: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        parent_run_id: str | None = None,
        description: str | None = None,
    ) -> str:
        """Create a RUNNING run (a child of ``parent_run_id`` when given) with its tags and
        params; returns its id."""
        all_tags = {str(k): str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = str(parent_run_id)
        if description:
            all_tags["mlflow.note.content"] = description
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=all_tags)
        if params:
            self.log_params(run.info.run_id, params)
        return run.info.run_id

    def reopen(self, run_id: str) -> None:
        """Mark an ended run RUNNING again (a resumed sweep)."""
        from mlflow.entities import RunStatus

        self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(str(k), str(v)[: self.PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        """Finite values only, keys made MLflow-safe (``mlflow_key``)."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [
            Metric(mlflow_key(k), float(v), ts, step) for k, v in metrics.items() if v is not None and math.isfinite(float(v))
        ]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i : i + 500])

    def log_artifact(self, run_id: str, path: Path | str, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            self.client.log_artifact(run_id, str(path), artifact_path=artifact_path)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, str(k), str(v))

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED."""
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # callers say where it is
        self.client.set_terminated(run_id, status=status)


def end_abandoned_run(output_dir: Path, reason: str) -> str | None:
    """The MLflow run of a run whose process died without a word (a sweep's lost job), if still
    RUNNING: ended FAILED and tagged ``entropyrl.ended_by`` with ``reason``. Returns its id when it
    was ended here; None when there is no link, it had ended, or the store cannot be reached (the
    next look tries again)."""
    link = Path(output_dir) / "tracking.json"
    if not link.exists():
        return None
    try:
        info = json.loads(link.read_text())
        store = TrackingStore(str(info["uri"]))
        run_id = str(info["run_id"])
        if store.client.get_run(run_id).info.status != "RUNNING":
            return None
        store.set_tags(run_id, {"entropyrl.ended_by": reason[:500]})
        store.finish(run_id, "FAILED")
        return run_id
    except Exception:  # noqa: BLE001 - a damaged link, a store away: nothing to close now
        return None


def parse_metrics(text: str) -> tuple[list[dict], int]:
    """``(rows, damaged)``: the JSON objects of a metrics.jsonl text and how many lines were not
    complete JSON objects (a write cut short by a crash)."""
    rows, damaged = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            damaged += 1
            continue
        if isinstance(row, dict) and valid_step(row.get("step")):
            rows.append(row)
        else:
            damaged += 1
    return rows, damaged


def valid_step(step: Any) -> bool:
    """Whether ``step`` is what a metrics.jsonl line carries: an integer >= 0 (not "3", not 3.0)."""
    return isinstance(step, int) and not isinstance(step, bool) and step >= 0


OVERWRITE_HINT = "or start over with trainer.resume=overwrite (deletes the old run's files)"


def check_metrics_file(path: Path) -> None:
    """``UserError`` naming the file and line when a complete line of metrics.jsonl is not a step's
    record (not an object, or without an integer ``step``): a resume would misread it. A line cut
    short by a crash (not JSON) is left to the resume, which drops it with a warning."""
    path = Path(path)
    if not path.exists():
        return
    for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict):
            found = f"a JSON {type(row).__name__}, not an object"
        elif "step" not in row:
            found = 'no "step"'
        elif not valid_step(row["step"]):
            found = f'"step": {json.dumps(row["step"])[:40]}'
        else:
            continue
        raise UserError(
            f'{path}:{lineno}: not a step\'s record ({found}; each line needs an integer "step"): '
            f"fix or delete that line to continue the run, {OVERWRITE_HINT}"
        )


def read_run_link(path: Path) -> dict:
    """``{"run_id", "uri"}`` of ``tracking.json`` (the MLflow run a job continues), or ``{}`` when
    there is none; ``UserError`` naming the file when it is damaged (truncated, not an object)."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(errors="replace"))
        why = "" if isinstance(data, dict) and isinstance(data.get("run_id"), str) and data["run_id"] else "no run_id"
    except json.JSONDecodeError as exc:
        why = f"not valid JSON: {exc.msg} at line {exc.lineno}"
    if why:
        raise UserError(
            f"{path}: a damaged MLflow run link ({why}): delete it to continue the run in a new MLflow "
            f"run (metrics.jsonl keeps every step), {OVERWRITE_HINT}"
        )
    return data


def read_metrics(output_dir: Path) -> list[dict]:
    """The rows of ``<output_dir>/metrics.jsonl`` (incomplete lines from a crash are skipped)."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return parse_metrics(path.read_text(errors="replace"))[0]
