"""metrics.jsonl under a live run: deleted at any moment, even between the run's write and its
next look at the file, it is written again from the run's own copy, never a failed run."""

from __future__ import annotations

import json
from pathlib import Path

from entropyrl.core.tracking import RunTracker


class _DeletedAfterEachWrite(type(Path())):
    """A path whose file is deleted the moment each append closes (before the writer can look)."""

    def open(self, mode="r", *args, **kwargs):
        f = super().open(mode, *args, **kwargs)
        if "a" not in mode:
            return f
        path, close = self, f.close

        def close_and_delete():
            close()
            path.unlink()

        f.close = close_and_delete
        return f


def test_a_record_deleted_right_after_a_write_is_written_again(tmp_path):
    logs: list[str] = []
    tracker = RunTracker({"enabled": False}, tmp_path, log=logs.append)
    tracker.start({}, "run", None)
    tracker.log_metrics(1, {"entropy": 1.0})
    tracker.metrics_path = _DeletedAfterEachWrite(tracker.metrics_path)
    tracker.log_metrics(2, {"entropy": 0.9})  # its file is gone as soon as it is written
    assert not tracker.metrics_path.exists()
    tracker.metrics_path = Path(tracker.metrics_path)
    tracker.log_metrics(3, {"entropy": 0.8})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert any("was deleted or cut short" in line for line in logs)
