"""Reward values by contract: a reward function or an HTTP judge returns a list of real numbers of
the batch's length; anything else (a dict read through its keys, a string read by character, a
nested list, ...) is one error line naming the function and what it returned. Numpy arrays of
numbers and booleans are numbers."""

from __future__ import annotations

import json
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from entropyrl.core.errors import UserError
from entropyrl.rewards import RewardRunner

from .test_rewards import _problems, _toy_source

SHAPES = """
import numpy as np

def as_dict(responses, **_):
    return {i: 1.0 for i in range(len(responses))}

def as_string(responses, **_):
    return "1" * len(responses)

def nested(responses, **_):
    return [[1.0] for _ in responses]

def with_none(responses, **_):
    return [None] + [1.0] * (len(responses) - 1)

def numeric_strings(responses, **_):
    return ["1.0"] * len(responses)

def as_set(responses, **_):
    return {0.0, 1.0, 2.0}

def numpy_array(responses, **_):
    return np.arange(len(responses), dtype=np.float32) / 2

def numpy_matrix(responses, **_):
    return np.zeros((len(responses), 1))

def bools(responses, answer, **_):
    return [r == a for r, a in zip(responses, answer)]

def numpy_bools(responses, answer, **_):
    return np.array([r == a for r, a in zip(responses, answer)])

def too_many(responses, **_):
    return [1.0] * (len(responses) + 1)
"""


@pytest.fixture()
def shapes(tmp_path):
    path = tmp_path / "shapes.py"
    path.write_text(textwrap.dedent(SHAPES))
    return path


def _score(ref):
    runner = RewardRunner({"functions": [{"fn": ref}]}, None)
    runner.bind(_toy_source())
    try:
        return runner.score(_problems(), ["p"] * 3, ["1", "9", "3"], [0, 1, 2])
    finally:
        runner.close()


@pytest.mark.parametrize(
    "name, said",
    [
        ("as_dict", "returned dict {0: 1.0, 1: 1.0, 2: 1.0}, not a list"),
        ("as_string", "returned str '111', not a list"),
        ("as_set", "returned set"),
        ("nested", "whose item 0 is list [1.0]"),
        ("with_none", "whose item 0 is NoneType None"),
        ("numeric_strings", "whose item 0 is str '1.0'"),
        ("numpy_matrix", "returned ndarray of shape (3, 1)"),
        ("too_many", "returned 4 values for 3 responses"),
    ],
)
def test_a_reward_that_breaks_the_contract_is_one_line_naming_it_and_what_it_returned(shapes, name, said):
    with pytest.raises(UserError) as err:
        _score(f"{shapes}:{name}")
    msg = str(err.value)
    assert "\n" not in msg and f"{shapes}:{name}" in msg and said in msg, msg
    assert "return a list of 3 real numbers, one per response" in msg


def test_numpy_arrays_and_booleans_are_numbers(shapes):
    assert _score(f"{shapes}:numpy_array").components["numpy_array"] == [0.0, 0.5, 1.0]
    assert _score(f"{shapes}:bools").components["bools"] == [1.0, 0.0, 1.0]  # answers 1, 2, 3
    assert _score(f"{shapes}:numpy_bools").components["numpy_bools"] == [1.0, 0.0, 1.0]


class _DictJudge:
    """A real HTTP judge answering ``{"rewards": {"0": 1.0, ...}}``: a dict keyed by position."""

    def __enter__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                out = json.dumps({"rewards": {str(i): 1.0 for i in range(len(body["responses"]))}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/reward"

    def __exit__(self, *_):
        self.server.shutdown()
        self.server.server_close()


def test_an_http_judge_answering_a_dict_is_refused_naming_the_url():
    with _DictJudge() as url:
        runner = RewardRunner({"url": url}, None)
        runner.bind(_toy_source())
        with pytest.raises(UserError) as err:
            runner.score(_problems(), ["p"] * 3, ["1", "9", "3"], [0, 1, 2])
    msg = str(err.value)
    assert "\n" not in msg and url in msg and "returned dict {'0': 1.0" in msg and "not a list" in msg
