"""`make bench`: run every benchmark suite (or those named), each recorded as it finishes.

Each module in this folder (except the scripts in ``SKIP``) exposes ``run() -> dict``; its result
is stored under the module's name (``token_stats``, ``grading``, ``rollout``, ...) in
bench-results.json, with the machine it ran on, and its own section of docs/performance.md is
rewritten from it (``perf/report.py``'s ``record``). A suite not run keeps its key and its section
as they were; so does a suite that fails (it measured nothing: the error is printed and the exit
status is 1). Before measuring, the page must have every wanted suite's markers. Ratios are always
measured against a baseline in the same run, since the machines are noisy.

    .venv/bin/python perf/run.py                 # all suites
    .venv/bin/python perf/run.py grading         # only some
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPORT = HERE.parent / "bench-results.json"
PAGE = HERE.parent / "docs" / "performance.md"
SKIP = {"run", "report", "gpu_check", "gpu_report", "__init__"}  # scripts, not suites


# Suites that need something `make install` does not provide: run by default only when it is there.
OPTIONAL = {  # `make bench-peers` installs TRL in .venv-peers; ENTROPYRL_PEERS_PYTHON names another interpreter
    "peers": Path(os.environ.get("ENTROPYRL_PEERS_PYTHON") or HERE.parent / ".venv-peers" / "bin" / "python")
}


def suites() -> list[str]:
    names = (p.stem for p in HERE.glob("*.py") if p.stem not in SKIP and not p.stem.startswith("_"))
    return sorted(n for n in names if n not in OPTIONAL or OPTIONAL[n].exists())


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"entropyrl_bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def machine() -> dict:
    """The machine a suite ran on, stored with its result."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str], results_path: Path | None = None, page: Path | None = None) -> int:
    """Run the ``argv`` suites (default: all), recording each into ``results_path`` (default
    bench-results.json) and its section of ``page`` (default docs/performance.md)."""
    results_path, page = results_path or REPORT, page or PAGE
    wanted = argv or suites()
    unknown = [name for name in wanted if not (HERE / f"{name}.py").exists() or name in SKIP or name.startswith("_")]
    if unknown:
        raise SystemExit(f"no bench suite {', '.join(unknown)}: choose from {', '.join(suites())}")
    report = load("report")
    report.check_sections(page, wanted)  # before minutes of measuring, not after
    failed = 0
    for name in wanted:
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        try:
            module = load(name)
            result = module.run()
        except Exception:  # noqa: BLE001 - one broken suite must not hide the others
            traceback.print_exc()
            print(f"{name} failed: its key in {results_path} and its section of {page} are left as they were", flush=True)
            failed += 1
            continue
        result["seconds"] = round(time.perf_counter() - started, 2)
        result[report.MACHINE] = machine()
        print(json.dumps(result, indent=2), flush=True)
        report.record(results_path, page, name, result, getattr(module, "render", None))
        print(f"wrote {name} into {results_path} and its section of {page}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
