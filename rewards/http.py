"""A reward served over HTTP (``reward.url``): the batch as one JSON POST,
``{"prompts": [...], "responses": [...], <problem fields>...}``, answered by ``{"rewards": [...]}``.

Transport failures and non-2xx answers are retried ``reward.retries`` times with exponential
backoff (``reward.backoff_s``, doubling); past that the batch gets the fallback (reason
``http_error``, the server's status in the logged line). A server that cannot be reached when
the run starts is a one-line error before training (``check_reachable``).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
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
        raise UserError(f"reward.url={url}: cannot connect to {parsed.hostname}:{port} "
                        f"({exc.strerror or type(exc).__name__}): start the reward server or fix reward.url") from None


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def post_rewards(url: str, payload: dict, *, timeout: float | None, retries: int, backoff: float) -> list:
    """``rewards`` of the server's answer; raises ``CallFailed("http_error", ...)`` after the retries."""
    body = json.dumps({k: [_jsonable(v) for v in vs] for k, vs in payload.items()}).encode()
    last = ""
    for attempt in range(int(retries) + 1):
        if attempt:
            time.sleep(float(backoff) * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                data = json.loads(answer.read().decode() or "null")
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code} {exc.reason}"
            continue
        except (urllib.error.URLError, OSError) as exc:
            last = f"{type(getattr(exc, 'reason', exc)).__name__}: {getattr(exc, 'reason', exc)}"
            continue
        except ValueError:
            last = "the answer is not JSON"
            continue
        if not isinstance(data, dict) or "rewards" not in data:
            last = 'the answer has no "rewards" list'
            continue
        return data["rewards"]
    raise CallFailed("http_error", f"{url}: {last} (after {int(retries) + 1} tries)")
