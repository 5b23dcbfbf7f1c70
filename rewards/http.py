"""A reward served over HTTP (``reward.url``): the batch as one JSON POST,
``{"prompts": [...], "responses": [...], <problem fields>...}``, answered by ``{"rewards": [...]}``.

Transport failures and non-2xx answers are retried ``reward.retries`` times with exponential
backoff (``reward.backoff_s``, doubling); past that the batch gets the fallback (reason
``http_error``, the server's status in the logged line). ``reward.timeout_s`` is a wall-clock
deadline for the whole batch, retries included (reason ``timeout``), however slowly the server
sends its answer. A server that cannot be reached when
the run starts is a one-line error before training (``check_reachable``).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlparse

from ..core.errors import UserError
from .calls import CallFailed


def check_reachable(url: str, timeout: float = 5.0) -> None:
    """``UserError`` unless something listens at ``url``'s host and port."""
    parsed = urlparse(str(url))
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserError(f"reward.url={url}: not an http(s) URL (e.g. http://127.0.0.1:8000/reward)")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            pass
    except OSError as exc:
        raise UserError(
            f"reward.url={url}: cannot connect to {parsed.hostname}:{port} "
            f"({exc.strerror or type(exc).__name__}): start the reward server or fix reward.url"
        ) from None


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


class _Overran(Exception):
    """The exchange did not complete before the batch's deadline."""


def _exchange(url: str, body: bytes, left: float | None) -> tuple[int, str, bytes]:
    """``(status, reason, body)`` of one POST, or ``_Overran`` when it is not complete within
    ``left`` seconds. The exchange runs in a helper thread; at the deadline its socket is shut down,
    which ends the thread's blocked read at once (a server dripping its answer cannot hold it)."""
    parsed = urlparse(url)
    cls = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    conn = cls(parsed.hostname, parsed.port, timeout=left)
    target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
    box: dict = {}

    def exchange():
        try:
            conn.request("POST", target, body=body, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            box["answer"] = (answer.status, answer.reason, answer.read())
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            box["error"] = exc

    worker = threading.Thread(target=exchange, daemon=True, name="entropyrl-judge")
    worker.start()
    worker.join(left)
    if worker.is_alive():
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        conn.close()
        worker.join(5.0)
        raise _Overran()
    conn.close()
    if "error" in box:
        raise box["error"]
    return box["answer"]


def post_rewards(url: str, payload: dict, *, timeout: float | None, retries: int, backoff: float) -> list:
    """``rewards`` of the server's answer. ``timeout`` is a wall-clock deadline for the whole batch,
    retries and their pauses included: past it ``CallFailed("timeout", ...)``; after the retries
    ``CallFailed("http_error", ...)``."""
    body = json.dumps({k: [_jsonable(v) for v in vs] for k, vs in payload.items()}).encode()
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    overran = CallFailed("timeout", f"{url}: no complete answer within {timeout} s (reward.timeout_s, for the whole batch)")
    last = ""
    for attempt in range(int(retries) + 1):
        if attempt:
            pause = float(backoff) * 2 ** (attempt - 1)
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise overran
            time.sleep(pause)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise overran
        try:
            status, reason, raw = _exchange(url, body, left)
        except _Overran:
            raise overran from None
        except (OSError, http.client.HTTPException) as exc:
            last = f"{type(exc).__name__}: {exc}"
            continue
        if not 200 <= status < 300:
            last = f"HTTP {status} {reason}"
            continue
        try:
            data = json.loads(raw.decode() or "null")
        except ValueError:
            last = "the answer is not JSON"
            continue
        if not isinstance(data, dict) or "rewards" not in data:
            last = 'the answer has no "rewards" list'
            continue
        return data["rewards"]
    raise CallFailed("http_error", f"{url}: {last} (after {int(retries) + 1} tries)")
