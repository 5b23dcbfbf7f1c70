"""An HTTP reward (reward.url) against a real local server started here (http.server on a free
loopback port): a judge that answers, one that answers 500, one that is down at the start, and
one that starts failing mid-run."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from entropyrl.core.errors import UserError
from entropyrl.rewards import RewardRunner
from entropyrl.tasks.problem import Problem

from .test_rewards import TINY_RUN, _rows, _toy_source, _train


class Judge:
    """A reward server: rewards = response length / 10; answers 500 from request ``fail_from`` on."""

    def __init__(self, fail_from: int | None = None):
        self.requests: list[dict] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append(body)
                if judge.fail_from is not None and len(judge.requests) >= judge.fail_from:
                    self.send_response(500)
                    self.end_headers()
                    return
                out = json.dumps({"rewards": [len(r) / 10 for r in body["responses"]]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *_):
                pass

        self.fail_from = fail_from
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/reward"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _problems():
    return [Problem("add", "1+1=", "2", (1, 1), fields={"level": 3}), Problem("add", "2+2=", "4", (2, 2))]


def test_http_reward_answers_and_receives_the_batch():
    with Judge() as judge:
        runner = RewardRunner({"url": judge.url}, None)
        runner.bind(_toy_source())
        batch = runner.score(_problems(), ["1+1=", "2+2="], ["2", "412"], [0, 1])
    assert batch.components["http"] == [0.1, 0.3] and batch.total == [0.1, 0.3]
    sent = judge.requests[0]
    assert sent["prompts"] == ["1+1=", "2+2="] and sent["responses"] == ["2", "412"]
    assert sent["answer"] == ["2", "4"] and sent["level"] == [3, None] and sent["group"] == [0, 1]


def test_http_500_gives_the_fallback_after_retries_with_the_status_logged():
    lines = []
    with Judge(fail_from=1) as judge:
        runner = RewardRunner({"url": judge.url, "retries": 2, "backoff_s": 0.01, "fallback": -0.5}, None, log=lines.append)
        runner.bind(_toy_source())
        batch = runner.score(_problems(), ["a", "b"], ["2", "4"], [0, 1])
    assert batch.components["http"] == [-0.5, -0.5] and batch.fallbacks["http"] == {"http_error": 2}
    assert len(judge.requests) == 3  # one try + two retries
    assert any("HTTP 500" in line and "after 3 tries" in line for line in lines), lines


def test_http_judge_down_at_start_is_one_line_before_training(in_tmp):
    url = f"http://127.0.0.1:{_free_port()}/reward"
    with pytest.raises(UserError, match=r"reward.url=.*cannot connect to 127.0.0.1:\d+") as err:
        _train([*TINY_RUN, "output_dir=run", f"reward.url={url}"])
    assert "\n" not in str(err.value)
    assert not (in_tmp / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_http_judge_failing_mid_run_falls_back_and_the_run_finishes(in_tmp):
    with Judge(fail_from=2) as judge:
        summary = _train(
            [
                *TINY_RUN,
                "output_dir=run",
                f"reward.url={judge.url}",
                "reward.retries=1",
                "reward.backoff_s=0.01",
                "reward.functions=[{fn: 'builtin:toy', weight: 1.0}]",
            ]
        )
    assert summary["status"] == "FINISHED"
    first, second = _rows(in_tmp / "run")
    assert first["reward/http/fallback/http_error"] == 0 and first["reward/http/mean"] > 0
    assert second["reward/http/fallback/http_error"] == 16 and second["reward/http/mean"] == 0.0
    assert summary["reward_fallbacks"] == {"http": {"http_error": 16}}
    assert second["acc/mean"] == pytest.approx(second["reward/toy/mean"])
