"""The perf/ scripts are not a package: tests load them by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PERF = Path(__file__).resolve().parents[2] / "perf"


def load_perf(name: str):
    """``perf/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"perf_{name}", PERF / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
