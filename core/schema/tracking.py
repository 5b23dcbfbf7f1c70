"""The schema of the ``tracking`` group's keys: where a run's metrics and files are logged (``conf/tracking/``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..rules import BOOL, MAPPING, NONNEG, OPT_STR, STR, choice
from . import key


@dataclass
class TrackingSchema:
    """``tracking``: MLflow tracking. A local sqlite store under the working directory by default; the
    MLFLOW_TRACKING_URI environment variable, or ``tracking.uri=``, points elsewhere (e.g. a team
    ``mlflow server``)."""

    name: str = key("mlflow", choice("mlflow"), "the tracker: MLflow (the one there is; another name is refused)")
    enabled: bool = key(True, BOOL, "false: no MLflow run; metrics.jsonl and the run's files only")
    uri: str | None = key(None, OPT_STR, "null: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working dir")
    experiment: str = key("entropyrl", STR, "the MLflow experiment the runs go to")
    run_name: str | None = key(
        None,
        OPT_STR,
        (
            "null: <algo>[-<model>][-<data>][-async<k>]-s<seed>, the parts that differ from the default run "
            "(trainers/run/names.py)"
        ),
    )
    parent_run_id: str | None = key(None, OPT_STR, "set by sweeps: this run becomes a child of that run")
    tags: dict[str, Any] = key({}, MAPPING, "tags set on each run, e.g. {team: rl}")
    retry_s: float = key(10, NONNEG, "server gone mid-run: ask it every this many seconds (metrics queued meanwhile)")
    flush_wait_s: float = key(60, NONNEG, "end of a run with entries still queued: wait at most this long, then keep them")
