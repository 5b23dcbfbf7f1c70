"""The progress line of a sweep or a lab: each running job's step beside the job counts, rewritten on a
terminal, and into a log (no terminal) printed when the counts change or as a heartbeat, not once a step."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from entropyrl.cli.common import live_line
from entropyrl.sweeps.following import _Follower
from entropyrl.sweeps.state import JobStatus


def _status(key: str, state: str, detail: str) -> JobStatus:
    return JobStatus(key, key.split("/")[0], 0, state, detail, "log", "out", "1", 1)


def test_the_line_names_each_running_jobs_step():
    lines: list[str] = []
    follower = SimpleNamespace(progress=lines.append, final={}, queued=1, total=3)
    _Follower._show(follower, [_status("grpo/s0", "running", "step 9/80"), _status("stare/s0", "running", "step 3/80")])
    assert lines == ["jobs: 0 done, 2 running, 1 pending, 0 failed (of 3); grpo/s0 step 9/80, stare/s0 step 3/80"]


def test_into_a_log_the_line_prints_when_its_counts_change_or_as_a_heartbeat():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=60)
    with live_line(console, every_s=3600) as show:
        show("jobs: 0 done, 1 running (of 1); a step 1/9")
        show("jobs: 0 done, 1 running (of 1); a step 2/9")  # the same counts within the hour: not printed
        show("jobs: 1 done, 0 running (of 1)")
    assert out.getvalue().splitlines() == ["jobs: 0 done, 1 running (of 1); a step 1/9", "jobs: 1 done, 0 running (of 1)"]
    out = io.StringIO()
    with live_line(Console(file=out, force_terminal=False), every_s=0) as show:
        for step in (1, 2):
            show(f"jobs: 0 done, 1 running (of 1); a step {step}/9")
    assert out.getvalue().splitlines() == [
        "jobs: 0 done, 1 running (of 1); a step 1/9",
        "jobs: 0 done, 1 running (of 1); a step 2/9",
    ]
