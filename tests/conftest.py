"""Fixtures: the golden vectors and data the tests read (all inside the repository), an isolated
model cache per session, and no tracking URI leaking between tests."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"  # see tests/golden/README.md
PACKAGED_DATA = REPO / "data" / "benchmarks"  # the benchmark files shipped with the package
VERL_FIXTURES = REPO / "tests" / "fixtures" / "verl"  # see tests/fixtures/README.md

# One warm-started tiny model per test session, outside the user's cache (set before any import
# of entropyrl so subprocesses inherit it).
_CACHE = Path(os.environ.get("ENTROPYRL_TEST_CACHE", REPO / ".cache" / "test-models"))
_USER_CACHE = Path(os.environ.get("ENTROPYRL_CACHE", Path.home() / ".cache" / "entropyrl"))
os.environ["ENTROPYRL_CACHE"] = str(_CACHE)


def _seed_test_cache(source: Path, target: Path) -> None:
    """Copy into the tests' cache the whole warm-started tiny models the user's cache holds (the
    README runs `make run` before `make test`: its default model need not be warm-started twice).
    Copies, not links, so a test that damages an entry never touches the user's; only entries whose
    completion record verifies (``folder_damage``), each renamed into place whole; an entry the
    tests' cache has already, or another worker installs first, is left as it is."""
    if source.resolve() == target.resolve() or not source.is_dir():
        return
    from entropyrl.models.folders import RECORD, folder_damage

    for entry in sorted(source.glob("tiny-*")):
        if (target / entry.name).exists() or not (entry / RECORD).is_file() or folder_damage(entry):
            continue
        target.mkdir(parents=True, exist_ok=True)
        staging = target / f".{entry.name}-seed-{uuid.uuid4().hex}"
        try:
            shutil.copytree(entry, staging)
            if folder_damage(staging) is None:
                os.rename(staging, target / entry.name)
        except OSError:
            pass  # another worker's copy won, or the cache is not writable: the tests build it
        finally:
            shutil.rmtree(staging, ignore_errors=True)


os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# vLLM's engine shutdown at interpreter exit logs warnings after pytest closed its streams
# ("--- Logging error ---" tracebacks after the summary line); keep vLLM to errors in tests.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.pop("MLFLOW_TRACKING_URI", None)
# Tests see what a user sees: no data root unless a test sets one (benchmarks then come from the
# packaged copies, training sets from the hub, which is off).
os.environ.pop("ENTROPYRL_DATA", None)
# Under pytest-xdist (`make test` runs `-n 2`) the workers share the machine's cores: every run a
# worker starts, in-process or as a subprocess, takes its share (core/resources.jobs_sharing) instead
# of all of them, so the suite never oversubscribes threads.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("ENTROPYRL_JOBS", os.environ["PYTEST_XDIST_WORKER_COUNT"])
# (after the environment above: the seeding imports entropyrl)
_seed_test_cache(_USER_CACHE, _CACHE)


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The golden vectors the math must reproduce (float64, 1e-6)."""
    return GOLDEN


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """A data root laid out as users lay theirs out (what ``eval.data_root`` / ``data.data_root`` /
    ``$ENTROPYRL_DATA`` point at): the packaged benchmark files (``qwen-math-eval/``, ``math500/``,
    ``aime25/``) plus ``verl/`` from the test fixtures (a 200-row sample of DAPO-Math-17k and verl's
    AIME24 / AMC23 parquet files). Links, not copies: nothing is duplicated."""
    root = tmp_path_factory.mktemp("data-root")
    for entry in sorted(PACKAGED_DATA.iterdir()):
        (root / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (root / "verl").symlink_to(VERL_FIXTURES, target_is_directory=True)
    return root


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run the test from an empty working directory (MLflow's sqlite store and outputs land there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Small but real runs: the embedded model on the one-line toy tasks (6-token responses, where the
# default countdown task's run 32), a few steps, tiny batches.
FAST_TRAIN = [
    "data=toy",
    "trainer.total_steps=4",
    "trainer.prompts_per_step=8",
    "trainer.mini_batch_prompts=4",
    "trainer.val_every=2",
    "trainer.save_every=2",
    "val.prompts=16",
    "trainer.progress=false",
]


@pytest.fixture()
def cli_in_process(tmp_path, capsys, monkeypatch):
    """``run(*args)``: the CLI's ``main`` in this process, from ``tmp_path`` (the same code path as
    ``entropyrl ...`` without seconds of imports per case), as a ``CompletedProcess`` of its exit
    code, stdout and stderr."""

    def run(*args: str) -> subprocess.CompletedProcess:
        from entropyrl.cli.main import main

        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)

    return run


def _children_spawned_by(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` and that multiprocessing's spawn started (not its resource
    tracker). Reads /proc/*/stat, tolerating entries that vanish while it reads (threads and short-lived
    helpers come and go under a running trainer)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) != pid:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"spawn_main" in cmdline:
            out.append(int(entry.name))
    return sorted(out)


@pytest.fixture()
def spawned_children():
    """``spawned_children(pid)``: the pids of the processes multiprocessing spawned from ``pid``."""
    return _children_spawned_by


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture()
def free_port():
    """``free_port()``: a TCP port on 127.0.0.1 free now, for the rendezvous of the ranks a test starts."""
    return _free_port


@pytest.fixture()
def child_env():
    """``child_env()``: this process's environment for the processes (ranks) a test starts: one
    OpenMP thread unless set, output unbuffered (their lines arrive as they are printed)."""
    return _child_env


@pytest.fixture(scope="session")
def fast_train() -> list[str]:
    return list(FAST_TRAIN)


@pytest.fixture(autouse=True)
def _no_inherited_tracking_uri():
    """Each test starts with no tracking URI: `mlflow.set_tracking_uri` (called by any in-process
    run) also exports MLFLOW_TRACKING_URI, which later CLI subprocesses would silently inherit."""
    import sys

    if "mlflow" in sys.modules:
        sys.modules["mlflow"].set_tracking_uri(None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield


@pytest.fixture(autouse=True)
def _no_leaked_thread_env():
    """A run started in-process exports OMP/MKL/OpenBLAS thread counts for its children
    (``entropyrl.core.resources``); restore them after each test so later subprocesses (and scripts
    such as ``nproc`` in tests/slurm/start.sh) see the environment the suite started with."""
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "_ENTROPYRL_OMP")
    saved = {k: os.environ.get(k) for k in names}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# -- the SLURM test cluster ------------------------------------------------------------------------
# tests/slurm/start.sh starts it (idempotent) and stop.sh stops it; neither is safe to race, and a test
# that counts jobs must not see another test's. So the tests that use it run one at a time, across
# pytest-xdist workers too (a file lock held for the test), and the session that started the cluster
# stops it once, at its very end (the xdist controller, after every worker).
SLURM_DIR = REPO / "tests" / "slurm"
_SLURM_LOCK = Path(tempfile.gettempdir()) / "entropyrl-test-slurm.lock"


def pytest_configure(config):
    # one id per test session, inherited by the xdist workers (they start after this hook)
    os.environ.setdefault("ENTROPYRL_TEST_SESSION", uuid.uuid4().hex)


def _slurm_started_marker() -> Path:
    return Path(tempfile.gettempdir()) / f"entropyrl-test-slurm-started-{os.environ['ENTROPYRL_TEST_SESSION']}"


def _slurm_up() -> bool:
    return shutil.which("sinfo") is not None and subprocess.run(["sinfo"], capture_output=True, timeout=60).returncode == 0


@pytest.fixture()
def slurm_cluster():
    """The test SLURM cluster (partition `debug` of one node, partition `two` of two nodes), held by
    this test alone; started on first use, stopped at the end of the session that started it."""
    if os.geteuid() != 0:
        pytest.skip("SLURM tests need root to install and start slurmctld/slurmd (tests/slurm/start.sh)")
    if shutil.which("sinfo") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and apt-get is not available to install it")
    with open(_SLURM_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        was_up = _slurm_up()
        out = subprocess.run(["bash", str(SLURM_DIR / "start.sh")], capture_output=True, text=True, timeout=900)
        if out.returncode == 3:
            pytest.skip(out.stderr.strip().splitlines()[-1])
        assert out.returncode == 0, f"tests/slurm/start.sh failed:\n{out.stdout}\n{out.stderr}"
        if not was_up:
            _slurm_started_marker().touch()
        yield


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller stops the cluster after every worker is done
    marker = _slurm_started_marker()
    if marker.exists():
        subprocess.run(["bash", str(SLURM_DIR / "stop.sh")], capture_output=True, text=True, timeout=300)
        marker.unlink(missing_ok=True)
