"""reward.timeout_s is a wall-clock deadline per batch: an HTTP judge that drips its answer is cut
at it, and an in-process function that spins is stopped at it (its process killed), leaving no
thread or process running behind."""

from __future__ import annotations

import json
import multiprocessing as mp
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from entropyrl.rewards import RewardRunner

from .test_rewards import _problems, _toy_source

SPIN = """
import os

def spins(responses, **_):
    while True:
        pass

def dies(responses, **_):
    os._exit(3)

def fine(responses, **_):
    return [0.5] * len(responses)
"""


@pytest.fixture()
def spin(tmp_path):
    path = tmp_path / "spin.py"
    path.write_text(textwrap.dedent(SPIN))
    return path


class _DripJudge:
    """A real HTTP judge that sends a correct answer one byte per 0.3 s (headers first)."""

    def __init__(self, drip_headers: bool = False):
        self.drip_headers = drip_headers

    def __enter__(self):
        drip_headers = self.drip_headers

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                out = json.dumps({"rewards": [1.0] * len(body["responses"])}).encode()
                head = (f"HTTP/1.1 200 OK\r\nContent-Length: {len(out)}\r\n\r\n").encode()
                try:
                    if not drip_headers:
                        self.wfile.write(head)
                        self.wfile.flush()
                    for b in (head if drip_headers else b"") + out:
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                        time.sleep(0.3)
                except OSError:
                    pass

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/reward"

    def __exit__(self, *_):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("drip_headers", [False, True])
def test_a_dripping_judge_is_cut_at_the_deadline_for_the_batch(drip_headers):
    with _DripJudge(drip_headers) as url:
        runner = RewardRunner({"url": url, "timeout_s": 1.5, "retries": 2, "backoff_s": 0.1}, None, log=lambda *_: None)
        runner.bind(_toy_source())
        started = time.monotonic()
        batch = runner.score(_problems(), ["p"] * 3, ["1", "9", "3"], [0, 1, 2])
        took = time.monotonic() - started
    assert batch.fallbacks["http"] == {"timeout": 3} and batch.components["http"] == [0.0] * 3
    assert took < 3.0, took  # one deadline for the batch, not per byte or per try
    assert not [t for t in threading.enumerate() if t.name == "entropyrl-judge"]


def test_a_spinning_function_is_stopped_at_the_deadline_leaving_nothing_running(spin):
    runner = RewardRunner({"functions": [{"fn": f"{spin}:spins", "timeout_s": 0.5}], "fallback": 0.25}, None, log=lambda *_: None)
    runner.bind(_toy_source())
    for _ in range(3):
        started = time.monotonic()
        batch = runner.score(_problems(), ["p"] * 3, ["1", "9", "3"], [0, 1, 2])
        assert batch.fallbacks["spins"] == {"timeout": 3} and batch.components["spins"] == [0.25] * 3
        assert time.monotonic() - started < 2.5
    assert not [t for t in threading.enumerate() if t.name == "entropyrl-reward"]
    assert not mp.active_children()
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(1.0)
    assert time.process_time() - cpu < 0.3 * (time.monotonic() - wall)  # nothing spins in this process


def test_a_function_that_ends_its_process_gets_the_fallback_and_the_next_batch_runs(spin):
    runner = RewardRunner(
        {"functions": [{"fn": f"{spin}:dies", "timeout_s": 5}, {"fn": f"{spin}:fine", "timeout_s": 5}]}, None, log=lambda *_: None
    )
    runner.bind(_toy_source())
    for _ in range(2):
        batch = runner.score(_problems(), ["p"] * 3, ["1", "9", "3"], [0, 1, 2])
        assert batch.fallbacks["dies"] == {"exception": 3} and batch.components["fine"] == [0.5] * 3
