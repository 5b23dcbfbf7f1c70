"""Tool sessions and STARE's tool-use recipe switches, through the multi-turn driver with a scripted
engine (each response's turns are fixed text, so every case is exact) and, for sessions, the real
sandboxed executor.

- ``tools.session=trajectory``: a variable set in one call is defined in the next call of the same
  response, not in ``stateless`` and not in another response; a replayed call that fails or
  passes a limit makes the new call an error without stopping the rollout;
- a bad session value is one line naming the valid ones;
- the driver counts repeated calls (the same code twice in a response) and void turns (neither a
  closed call nor a final answer), per response;
- ``tools.mask_repeated`` / ``tools.drop_void_turns`` (beside ``tools.mask_invalid_calls``) take
  exactly those responses out of the loss (mask 0, no gradient) while their rewards stay in their
  group's baseline; the counts are metrics.
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
from entropyrl.evals.grading.answer_extraction import extract_answer
from entropyrl.rollout.base import TOKEN_KINDS, Rollout, ToolTrace, cat_rollouts
from entropyrl.rollout.multi_turn import ToolResult, ToolRollout
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.algos.step_batch import StepBatch
from entropyrl.trainers.settings import StepSettings
from entropyrl.trainers.stats.tool_stats import left_out_rows, loss_mask, tool_use_metrics

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
    return ToolRollout(engine, tools_cfg(**tools), executor, rollout_cfg, final_answer=extract_answer).generate(
        list(scripts), n=1, seed=0
    )


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
        "A:": [hermes_call("x = 41\nprint('set x')"), hermes_call("print(x + 1)"), "done<eos>"],
        "B:": [hermes_call("y = 1"), hermes_call("print(x)"), "done<eos>"],
    }


def test_trajectory_session_keeps_a_responses_variables_and_only_its_own(sandbox):
    roll = drive(two_responses(), sandbox, session="trajectory", max_calls=3)
    a, b = (outputs(t) for t in roll.texts)
    assert a == ["set x", "42"], roll.texts[0]  # the replay of call 1 defines x and prints nothing
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


# -- what the recipe switches read: repeated calls and void turns -----------------------------------
def ok_executor(codes):
    return [ToolResult("ok", error=False) for _ in codes]


def test_the_driver_counts_repeated_calls_and_void_turns():
    scripts = {
        "repeat:": [hermes_call("print(1)"), hermes_call("  print(1)\n"), "so \\boxed{1}<eos>"],
        "distinct:": [hermes_call("print(1)"), hermes_call("print(2)"), "Answer: 2<eos>"],
        "malformed twice:": ["<tool_call>{bad</tool_call>", "<tool_call>{bad</tool_call>", "Answer: 3<eos>"],
        "no answer:": [hermes_call("print(1)"), "I give up.<eos>"],
        "answered at once:": ["The answer is \\boxed{7}.<eos>"],
        "cut mid-turn:": ["let me think " * 200],
        "calls to the end:": [hermes_call(f"print({i})") for i in range(4)],
    }
    roll = drive(scripts, ok_executor, budget=2000, max_calls=3, max_turns=4)
    trace = roll.tools
    names = list(scripts)
    assert dict(zip(names, trace.repeated.tolist())) == {
        "repeat:": 1,
        "distinct:": 0,
        "malformed twice:": 0,  # no code: never a repeat
        "no answer:": 0,
        "answered at once:": 0,
        "cut mid-turn:": 0,
        "calls to the end:": 0,
    }
    assert dict(zip(names, trace.void.tolist())) == {
        "repeat:": 0,
        "distinct:": 0,
        "malformed twice:": 0,
        "no answer:": 1,  # stopped with neither a call nor an answer
        "answered at once:": 0,
        "cut mid-turn:": 1,  # the budget ran out inside a turn without an answer
        "calls to the end:": 0,  # every turn closed a call (the last one unanswered: truncated, not void)
    }
    assert trace.malformed.tolist()[2] == 2 and bool(roll.truncated[5]) and bool(roll.truncated[6])
    m = tool_use_metrics(trace, roll.response_mask)
    assert m["tools/repeated_frac"] == pytest.approx(1 / 7) and m["tools/void_frac"] == pytest.approx(2 / 7)
    # the counts travel with the rows (dynamic sampling concatenates batches, the trainer selects rows)
    both = cat_rollouts([roll, roll.select(torch.tensor([3, 0]))], PAD)
    assert both.tools.void.tolist() == [0, 0, 0, 1, 0, 1, 0, 1, 0] and both.tools.repeated.tolist()[-1] == 1


def test_answer_pattern_decides_what_a_final_answer_is():
    scripts = {"digits:": ["it is 3<eos>"], "words:": ["it is three<eos>"], "boxed:": ["\\boxed{3}<eos>"]}
    assert drive(scripts, ok_executor).tools.void.tolist() == [1, 1, 0]  # null: the math grader's answer
    assert drive(scripts, ok_executor, answer_pattern=r"\d\s*$").tools.void.tolist() == [0, 1, 1]
    with pytest.raises(UserError, match=r"tools.answer_pattern='\(' is not a regular expression"):
        drive(scripts, ok_executor, answer_pattern="(")
    arith = compose("train", ["data=tool_arith", "tools=code_interpreter"]).tools.answer_pattern
    assert drive({"M=1+2=M": ["3<eos>"]}, ok_executor, answer_pattern=arith).tools.void.tolist() == [0]


# -- the switches: out of the loss, still in the baseline -------------------------------------------
TOOL = TOKEN_KINDS.index("tool")


def hand_built(B=8, T=10, seed=0) -> Rollout:
    """Two groups of four responses, a tool output at columns 3-4, and per row: a malformed call
    (row 1), a repeated call (rows 2 and 5), a void turn (rows 4 and 6)."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.zeros(B, T, dtype=torch.long)
    kind[:, 3:5] = TOOL
    kind[:, 5:] = TOKEN_KINDS.index("post_tool")
    zeros = torch.zeros(B, dtype=torch.long)
    trace = ToolTrace(
        kind,
        (torch.arange(T) >= 3).long().expand(B, T).clone(),
        torch.full((B,), 2),
        torch.ones(B, dtype=torch.long),
        zeros.clone(),
        malformed=zeros.index_fill(0, torch.tensor([1]), 1),
        repeated=zeros.index_fill(0, torch.tensor([2, 5]), 1),
        void=zeros.index_fill(0, torch.tensor([4, 6]), 1),
    )
    return Rollout(
        torch.zeros(B, 2, dtype=torch.long),
        torch.ones(B, 2, dtype=torch.long),
        torch.randint(2, 50, (B, T), generator=g),
        torch.ones(B, T, dtype=torch.long),
        [""] * B,
        torch.zeros(B, dtype=torch.bool),
        tools=trace,
    )


@pytest.mark.parametrize(
    "switches,out",
    [
        ({}, []),
        ({"invalid_calls": True}, [1]),
        ({"repeated": True}, [2, 5]),
        ({"void_turns": True}, [4, 6]),
        ({"invalid_calls": True, "repeated": True, "void_turns": True}, [1, 2, 4, 5, 6]),
    ],
)
def test_each_switch_leaves_exactly_its_responses_out_of_the_loss(switches, out):
    roll = hand_built()
    mask, left_out = loss_mask(roll, **{"invalid_calls": False, "repeated": False, "void_turns": False, **switches})
    rows = [i for i in range(8) if mask[i].sum() == 0]
    assert rows == out
    assert (left_out is None) == (not switches) and (left_out is None or left_out.nonzero().flatten().tolist() == out)
    kept = [i for i in range(8) if i not in out]
    assert torch.equal(mask[kept], roll.policy_mask[kept].float())  # the other rows: the policy mask as before
    assert mask[:, 3:5].sum() == 0  # tool outputs stay out either way
    assert left_out_rows(roll.tools, **switches).nonzero().flatten().tolist() == out


def test_left_out_rewards_still_enter_the_group_baseline_and_get_no_gradient():
    roll = hand_built()
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    group_ids = torch.arange(8) // 4
    mask, left_out = loss_mask(roll, invalid_calls=True, repeated=True, void_turns=True)
    algo = Algorithm.from_config({}, max_response_length=10)
    adv = algo.advantages(rewards, group_ids, mask)
    full = algo.advantages(rewards, group_ids, roll.policy_mask.float())
    kept = (~left_out).nonzero().flatten()
    # the kept rows' advantages are those of the whole group: the left-out rewards are in the baseline
    assert torch.allclose(adv[kept], full[kept])
    # ... and not those of groups of the kept rows alone (row 7 is the only one of its group kept)
    only_kept = algo.advantages(rewards[kept], group_ids[kept], mask[kept])
    assert not torch.allclose(adv[7], only_kept[-1])
    assert adv[left_out].abs().sum() == 0  # mask 0: no advantage on their tokens
    # the loss: no gradient reaches a left-out response, some reaches the others
    g = torch.Generator().manual_seed(1)
    old_logp = -torch.rand(8, 10, generator=g) * 3
    entropy = torch.rand(8, 10, generator=g)
    batch = StepBatch(
        roll, rewards, rewards, group_ids, mask=mask, old_logp=old_logp, entropy=entropy, sampler_logp=None, advantages=adv
    )
    algo.begin_step(0.5)
    selected = algo.select(batch, "batch")
    logp = (old_logp + 0.1).requires_grad_(True)
    algo.micro_loss(selected, logp=logp, entropy=entropy).loss.backward()
    assert logp.grad[left_out].abs().sum() == 0
    assert (logp.grad[kept].abs().sum(-1) > 0).sum() >= 1


def test_the_switches_are_config_keys_the_trainer_reads():
    cfg = compose("train", ["tools=code_interpreter", "tools.mask_repeated=true", "tools.drop_void_turns=true"])
    assert StepSettings.from_config(cfg).tool_switches == {"invalid_calls": False, "repeated": True, "void_turns": True}
    assert StepSettings.from_config(compose("train", [])).tool_switches == dict.fromkeys(
        ("invalid_calls", "repeated", "void_turns"), False
    )
    with pytest.raises(UserError, match="tools.drop_void_turns=maybe is not allowed"):
        compose("train", ["tools=code_interpreter", "tools.drop_void_turns=maybe"])
