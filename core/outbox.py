"""What the tracking server has not received yet, kept on disk until it answers again.

``metrics.jsonl`` is a run's record; MLflow gets a copy. When the server stops answering mid-run,
``Outbox.put`` appends each entry (metrics of a step, an artifact, the run's final state) to
``<output_dir>/tracking.queue.jsonl`` instead, says so once, and every ``retry_s`` seconds asks the
server's ``/health`` (a short timeout) whether it is back; when it is, the queue is delivered in
order and removed. ``flush(wait_s)`` at the end of a run waits a bounded time, saying so; what is
still queued then is delivered by the next run in that folder (a resume).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from .files import atomic_write_lines

#: MLflow's own HTTP retries (7 with backoff, 120 s timeout: minutes of silence per call when the
#: server is gone), made short for the tracker's calls; a user's own setting wins.
SHORT_HTTP_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def short_http_retries() -> None:
    for key, value in SHORT_HTTP_RETRIES.items():
        os.environ.setdefault(key, value)


class Outbox:
    """``deliver(entry)`` sends one entry (raises when the server does not take it);
    ``reachable()`` answers quickly whether the server is up."""

    def __init__(
        self,
        path: Path,
        deliver: Callable[[dict], None],
        reachable: Callable[[], bool],
        uri: str,
        log: Callable[[str], None],
        retry_s: float = 10.0,
    ):
        self.path, self.deliver, self.reachable, self.uri, self.log = Path(path), deliver, reachable, uri, log
        self.retry_s = retry_s
        self._next_try = 0.0
        self.pending = len(self._read())

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a line cut short by a crash: its step is in metrics.jsonl
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def keep(self, wanted: Callable[[dict], bool]) -> None:
        """Drop queued entries a resumed run recomputes (steps after its checkpoint, an old end state)."""
        entries = self._read()
        kept = [e for e in entries if wanted(e)]
        if len(kept) != len(entries):
            self._write(kept)

    def _write(self, entries: list[dict]) -> None:
        if entries:
            atomic_write_lines(self.path, (json.dumps(e) for e in entries))
        else:
            self.path.unlink(missing_ok=True)
        self.pending = len(entries)

    def _queue(self, entry: dict, exc: Exception | None = None) -> None:
        if self.pending == 0 and exc is not None:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            what = (
                f"the MLflow server at {self.uri} stopped answering"
                if self.uri.startswith(("http://", "https://"))
                else f"the MLflow store at {self.uri} refused a write"
            )
            self.log(
                f"warning: {what} ({reason}); training goes on, metrics.jsonl holds every step and what "
                f"MLflow misses is queued in {self.path}, delivered when it takes writes again"
            )
            self._next_try = time.monotonic() + self.retry_s
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        self.pending += 1

    def put(self, entry: dict) -> None:
        if self.pending and not self.flush():
            self._queue(entry)  # keep the order: nothing overtakes what waits
            return
        try:
            self.deliver(entry)
        except Exception as exc:  # noqa: BLE001 - any failure to deliver: queue it, training goes on
            self._queue(entry, exc)

    def flush(self, wait_s: float = 0.0) -> bool:
        """Deliver the queue if the server answers (asked at most every ``retry_s``, or for up to
        ``wait_s`` seconds); True when nothing is left queued."""
        if not self.pending:
            return True
        deadline = time.monotonic() + wait_s
        if wait_s > 0:
            self.log(f"waiting up to {wait_s:.0f} s for the MLflow server at {self.uri} to take {self.pending} queued entries")
        while True:
            now = time.monotonic()
            if now >= self._next_try or wait_s > 0:
                self._next_try = now + self.retry_s
                if self.reachable() and self._deliver_queue():
                    return True
            if now >= deadline:
                return False
            time.sleep(min(2.0, max(0.0, deadline - now)))

    def _deliver_queue(self) -> bool:
        entries = self._read()
        for i, entry in enumerate(entries):
            try:
                self.deliver(entry)
            except Exception:  # noqa: BLE001 - still away: keep what is left, in order
                self._write(entries[i:])
                return False
        self._write([])
        self.log(f"the MLflow server at {self.uri} answers again: delivered {len(entries)} queued entries")
        return True
