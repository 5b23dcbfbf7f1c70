"""Tool sessions and STARE's tool-use recipe switches, through the multi-turn driver with a scripted
engine (each response's turns are fixed text, so every case is exact) and, for sessions, the real
sandboxed executor.

- ``tools.session=trajectory``: a variable set in one call is defined in the next call of the same
  response, not in ``stateless`` and not in another response; a replayed call that fails or
  passes a limit makes the new call an error without stopping the rollout;
- a bad session value is one line naming the valid ones.
"""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.evals.code.sandbox import SandboxLimits
from entropyrl.evals.code.tool_executor import REPLAY_NOTE, SandboxToolExecutor, check_tools
from entropyrl.rollout.multi_turn import ToolResult, ToolRollout

PAD, EOS = 0, 1


class CharTokenizer:
    """One token per character (id = code point); 0 pads, 1 ends a response."""

    pad_token_id, eos_token_id = PAD, EOS

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids if int(i) > EOS)

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.decode(r.tolist() if hasattr(r, "tolist") else r) for r in rows]


class ScriptedEngine:
    """Answers each prompt's sequence with the next of its scripted turns (text; a turn ending in
    ``<eos>`` ends the response). One response per prompt (``n=1``)."""

    model = None

    def __init__(self, scripts: dict[str, list[str]]):
        self.tokenizer = CharTokenizer()
        self.scripts = {p: list(turns) for p, turns in scripts.items()}

    def generate_ids(self, sequences, *, seed, temperature, top_p, max_new_tokens, stop, stop_strings):
        out = []
        for seq in sequences:
            text = self.tokenizer.decode(seq)
            prompt = next(p for p in self.scripts if text.startswith(p))
            turn = self.scripts[prompt].pop(0)
            ids = [ord(c) for c in turn.removesuffix("<eos>")] + ([EOS] if turn.endswith("<eos>") else [])
            out.append((ids[:max_new_tokens], None))
        return out

    def sync_weights(self):
        pass

    def close(self):
        pass


def hermes_call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "</tool_call>"


def tools_cfg(**over):
    base = compose("train", ["tools=code_interpreter"]).tools
    return OmegaConf.merge(base, OmegaConf.create(over))


def drive(scripts: dict[str, list[str]], executor, budget: int = 2000, **tools):
    engine = ScriptedEngine(scripts)
    rollout_cfg = OmegaConf.create({"max_new_tokens": budget, "temperature": 1.0, "top_p": 1.0})
    return ToolRollout(engine, tools_cfg(**tools), executor, rollout_cfg).generate(list(scripts), n=1, seed=0)


def outputs(text: str) -> list[str]:
    """The tool outputs (hermes) of one response, in order."""
    return [part.split("\n</tool_response>")[0] for part in text.split("<tool_response>\n")[1:]]


# -- sessions: real sandboxed calls ---------------------------------------------------------------
LIMITS = SandboxLimits(wall_seconds=4.0, cpu_seconds=4, memory_mb=512, processes=16)


@pytest.fixture(scope="module")
def sandbox():
    return SandboxToolExecutor(LIMITS, workers=2)


def two_responses():
    return {
        "A:": [hermes_call("x = 41"), hermes_call("print(x + 1)"), "done<eos>"],
        "B:": [hermes_call("y = 1"), hermes_call("print(x)"), "done<eos>"],
    }


def test_trajectory_session_keeps_a_responses_variables_and_only_its_own(sandbox):
    roll = drive(two_responses(), sandbox, session="trajectory", max_calls=3)
    a, b = (outputs(t) for t in roll.texts)
    assert a == ["", "42"], roll.texts[0]
    assert "NameError: name 'x' is not defined" in b[1], roll.texts[1]  # B never sees A's x
    assert roll.tools.calls.tolist() == [2, 2] and roll.tools.errors.tolist() == [0, 1]


def test_stateless_session_forgets_between_calls(sandbox):
    roll = drive(two_responses(), sandbox, session="stateless", max_calls=3)
    a = outputs(roll.texts[0])
    assert "NameError: name 'x' is not defined" in a[1], roll.texts[0]
    assert roll.tools.errors.tolist() == [1, 1]


def test_a_replay_that_fails_or_passes_a_limit_is_the_new_calls_error(sandbox):
    # a replay that raises: the new call is not run, its output says why, it counts as an error
    raised, ok = sandbox(["print(1)", "print(x)"], histories=[["1 / 0"], ["x = 3"]])
    assert raised.error and raised.reason == "replay" and raised.output.startswith(REPLAY_NOTE)
    assert "ZeroDivisionError" in raised.output and "1\n" not in raised.output
    assert (ok.output, ok.error) == ("3\n", False)
    # each call alone fits the wall-clock limit, the replay and the new call together do not:
    # the rollout goes on, the call is an error, and the rest of the response is generated
    slow = "import time\ntime.sleep(2.5)"
    roll = drive({"S:": [hermes_call(slow), hermes_call(slow), "done<eos>"]}, sandbox, session="trajectory", max_calls=3)
    first, second = outputs(roll.texts[0])
    assert first == "" and "time limit" in second and "replay" in second, roll.texts[0]
    assert roll.tools.errors.tolist() == [1] and roll.texts[0].endswith("done")


def test_failed_calls_are_not_replayed(sandbox):
    script = {"F:": [hermes_call("x = 1\n1 / 0"), hermes_call("print('x' in dir())"), "done<eos>"]}
    roll = drive(script, sandbox, session="trajectory", max_calls=3)
    assert outputs(roll.texts[0])[1] == "False"


def test_bad_session_is_one_line_naming_the_valid_ones():
    with pytest.raises(UserError, match=r"tools.session=kernel is not allowed: it must be one of stateless, trajectory"):
        compose("train", ["tools=code_interpreter", "tools.session=kernel"])
    with pytest.raises(UserError, match=r"unknown tools.session=kernel; valid: stateless, trajectory"):
        check_tools(OmegaConf.create({"enabled": True, "format": "hermes", "session": "kernel", "executor": {}}))
    with pytest.raises(UserError, match=r"valid: stateless, trajectory"):
        drive({"A:": ["done<eos>"]}, lambda codes: [], session="kernel")
    assert compose("train", ["tools=code_interpreter", "tools.session=trajectory"]).tools.session == "trajectory"


def test_a_stateless_executor_without_histories_still_works():
    """A custom executor that takes only the codes keeps working under the default session."""
    seen = []

    def executor(codes):
        seen.extend(codes)
        return [ToolResult("ok", error=False) for _ in codes]

    roll = drive({"A:": [hermes_call("1"), hermes_call("2"), "done<eos>"]}, executor, max_calls=3)
    assert seen == ["1", "2"] and outputs(roll.texts[0]) == ["ok", "ok"]
    assert torch.equal(roll.tools.errors, torch.tensor([0]))
