"""A short ``entropyrl train`` subprocess for the suites that time training steps (``async``,
``tools``): one torch thread, no tracking, no validation, no checkpoint before the end, no samples
table; the rows of its ``metrics.jsonl`` after the first ``warmup`` steps (start-up and warm-up
costs left out)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def timed_steps(folder: Path, name: str, steps: int, warmup: int, overrides: list[str]) -> list[dict]:
    """Train ``steps`` steps into ``folder/name`` with ``overrides`` (the suite's task and batch)."""
    out = folder / name
    cmd = [
        sys.executable,
        "-m",
        "entropyrl.cli.main",
        "train",
        f"output_dir={out}",
        f"trainer.total_steps={steps}",
        "trainer.threads=1",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "trainer.samples_every=0",
        "trainer.progress=false",
        "val.prompts=0",
        "tracking.enabled=false",
        *overrides,
    ]
    subprocess.run(cmd, check=True, cwd=folder, capture_output=True, text=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][warmup:]
