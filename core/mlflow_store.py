"""Where runs are tracked (``resolve_uri``) and where a local store keeps their artifacts
(``experiment_id``), and one process at a time through a local MLflow sqlite store's first use
(``store_lock``).

MLflow creates and migrates a sqlite store's tables the first time a process opens it. Two runs
started together on a fresh ``mlflow.db`` (two `entropyrl train` in one folder, a train beside an
eval) both run the migration and one of them dies ("table ... already exists"). ``store_lock(uri)`` serialises that opening, and the experiment lookup-or-create after
it, with an exclusive ``flock`` on the database file itself: sqlite uses POSIX record locks, which
``flock`` does not touch, and an empty file is a valid empty sqlite database.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

DEFAULT_URI = "sqlite:///mlflow.db"


def resolve_uri(tracking_cfg) -> str:
    """``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else ``mlflow.db`` in the working directory;
    a local store's path made absolute against the working directory of the moment (``absolute_uri``)."""
    return absolute_uri(str(tracking_cfg.get("uri") or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI))


def absolute_uri(uri: str) -> str:
    """A local store URI made independent of the working directory: jobs may run elsewhere, and
    MLflow caches one store per URI string for the life of the process, so a relative
    ``sqlite:///mlflow.db`` reused after a change of directory would write into the old folder's
    database."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path, sep, query = uri[len("sqlite:///") :].partition("?")
        if not path or path == ":memory:":
            return uri
        return "sqlite:///" + str(Path(path).resolve()) + sep + query
    if uri.startswith("file://"):
        return uri
    if "://" not in uri and not uri.startswith(("databricks", "sqlite:")):
        return Path(uri).resolve().as_uri()
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative or absolute), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock on a local sqlite store while inside; a no-op for any other URI
    (a tracking server serialises its own writes) or when the folder does not exist (MLflow's own
    error then names it)."""
    db = sqlite_path(uri)
    if db is None or not db.parent.is_dir():
        yield
        return
    with open(db, "ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def artifact_location(uri: str) -> str | None:
    """Where a new experiment of a local sqlite store keeps its artifacts: ``mlruns`` beside the
    database file. MLflow's own default, ``./mlruns/<experiment id>``, is in the working directory
    of whichever process creates the experiment, so a store elsewhere would leave artifact folders
    in the folder a run happened to start from. None (MLflow's default, the same folder) when the
    database is in the working directory, as the default ``sqlite:///mlflow.db`` is, and for any
    other store (a server or a file store decides)."""
    db = sqlite_path(absolute_uri(uri))
    if db is None or db.parent == Path.cwd().resolve():
        return None
    return str(db.parent / "mlruns")


def experiment_id(client, uri: str, name: str) -> str:
    """The id of experiment ``name`` in the store ``client`` opens (at ``uri``), created when
    missing with its artifacts where ``artifact_location`` says. The caller holds ``store_lock``."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return client.create_experiment(name, artifact_location=artifact_location(uri))


def mlflow_key(name: str) -> str:
    """MLflow-safe metric key: ``eval/aime24/avg@32`` -> ``eval/aime24/avg_at_32``."""
    return name.replace("@", "_at_")
