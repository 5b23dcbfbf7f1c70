"""Shared fixtures: where ../shared lives, an isolated model cache and MLflow store per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# One warm-started tiny model per test session, outside the user's cache (set before any import
# of entropyrl so subprocesses inherit it).
_CACHE = Path(os.environ.get("ENTROPYRL_TEST_CACHE", REPO / ".cache" / "test-models"))
os.environ["ENTROPYRL_CACHE"] = str(_CACHE)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# vLLM's engine shutdown at interpreter exit logs warnings after pytest closed its streams
# ("--- Logging error ---" tracebacks after the summary line); keep vLLM to errors in tests.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.setdefault("ENTROPYRL_DATA", str(SHARED / "data"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"../shared not found at {SHARED}: tests need the shared data and golden vectors")
    return SHARED


@pytest.fixture(scope="session")
def golden_dir(shared_dir) -> Path:
    return shared_dir / "golden"


@pytest.fixture(scope="session")
def data_dir(shared_dir) -> Path:
    return shared_dir / "data"


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run the test from an empty working directory (MLflow's sqlite store and outputs land there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Small but real runs: the embedded model, a few steps, tiny batches.
FAST_TRAIN = [
    "trainer.total_steps=4", "trainer.prompts_per_step=8", "trainer.mini_batch_prompts=4",
    "trainer.val_every=2", "trainer.save_every=2", "val.prompts=16", "trainer.progress=false",
]


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
