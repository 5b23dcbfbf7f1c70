"""`make bench`: run every benchmark suite and merge the results into bench-results.json.

Each module in this folder (except this one) exposes ``run() -> dict``; its result is stored under
the module's name (``token_stats``, ``grading``, ``rollout``, ...). Ratios are always measured
against a baseline in the same run, since the machines are noisy.

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


def main(argv: list[str]) -> int:
    wanted = argv or suites()
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    failed = 0
    for name in wanted:
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        try:
            result = load(name).run()
        except Exception:  # noqa: BLE001 - one broken suite must not hide the others
            traceback.print_exc()
            result = {"error": traceback.format_exc(limit=3).splitlines()[-1]}
            failed += 1
        result["seconds"] = round(time.perf_counter() - started, 2)
        report[name] = result
        print(json.dumps(result, indent=2), flush=True)
    report["_machine"] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": __import__("os").cpu_count(),
    }
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {REPORT}")
    missing = [name for name in suites() if name not in report]
    if missing:  # a partial report would drop the other suites' tables from the page
        print(f"left docs/performance.md's measured section as it was: no results yet for {', '.join(missing)}")
    else:
        load("report").write(report, HERE.parent / "docs" / "performance.md")  # its measured section
        print("wrote docs/performance.md (measured section)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
