"""The tool task the tool does not solve (data=tool_countdown): each problem has exactly one right sign
pattern, the grader reads the expression the response ends with (never executes it) and refuses
anything but the prompt's numbers in order, and the warm start's traces check every pattern and
answer right (or, as label noise, wrong) after each check."""

from __future__ import annotations

import random

import pytest
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.tasks import builtin

DATA = compose("train", ["data=tool_countdown", "tools=code_interpreter"]).data


def problems(n: int = 300, seed: int = 0):
    return builtin.sample_problems(DATA, n, random.Random(seed))


def pattern_values(problem):
    a, b, c, _ = problem.params
    return {s: builtin._signed(a, b, c, s) for s in builtin.SIGN_PATTERNS}


def test_each_problem_has_one_right_pattern_and_its_prompt_names_the_target():
    for p in problems():
        a, b, c, target = p.params
        assert p.prompt == f"{a}:{b}:{c}M{target}:" and target > 0
        assert all(100 <= x <= 999 for x in (a, b, c))
        right = [code for code, value in pattern_values(p).values() if value == target]
        assert right == [p.answer]
        assert set(p.prompt + p.answer) <= set(builtin.ALPHABET)


def test_the_stream_is_seeded_and_every_pattern_occurs():
    assert [p.prompt for p in problems(50, 3)] == [p.prompt for p in problems(50, 3)]
    assert [p.prompt for p in problems(50, 3)] != [p.prompt for p in problems(50, 4)]
    seen = {p.answer[len(str(p.params[0]))] + p.answer[len(f"{p.params[0]}+{p.params[1]}")] for p in problems(400)}
    assert seen == set(builtin.SIGN_PATTERNS)


def test_the_grader_reads_only_the_final_expression_of_the_prompts_numbers():
    p = builtin.Problem("tool_countdown", "482:937:120M1299:", "482+937-120", (482, 937, 120, 1299))
    right = [
        "482+937-120",
        "M=482-937+120=M:-335:482+937-120",
        "M=482+937-120=M:1299:482+937-120 ",
        "M=482+937+120=M:1539: 482+937-120",
    ]
    wrong = [
        "",
        "1299",  # the target itself is not an answer
        "M=482+937-120=M:1299:",  # a check that hit, but no answer
        "M=482+937-120=M:1299:1299",
        "482+937-120:482-937+120",  # only the last expression counts
        "482-937+120",
        "1482+937-120",  # not the prompt's numbers
        "0482+937-120",  # a non-canonical spelling of them
        "5-482+937-120",  # the tail of a longer expression
        "482+937-120+0",
        "937+482-120",  # another order (same value)
        "482+937-120=1299",
        "M=482+937-120=M",
    ]
    for response in right:
        assert builtin.reward(p, response) == 1.0, response
    for response in wrong:
        assert builtin.reward(p, response) == 0.0, response


def test_warm_start_traces_check_every_pattern_and_are_graded_as_labelled():
    tags = OmegaConf.to_container(DATA.tool_tags)
    for p in problems(100):
        values = pattern_values(p)
        good = builtin.correct_answers(p, DATA)
        assert len(good) == 4 and all(builtin.reward(p, t) == 1.0 for t in good)
        # each trace's call and output are what the sandbox gives for that call
        for trace, (code, value) in zip(good, values.values()):
            assert trace.startswith(
                f"{tags['call_open']}{code}{tags['call_close']}{tags['output_open']}{value}{tags['output_close']}"
            )
        rng = random.Random(1)
        for _ in range(5):
            noisy = builtin.wrong_answer(p, rng, DATA)
            assert noisy.startswith(tags["call_open"]) and builtin.reward(p, noisy) == 0.0
        # without tags (the task answered in one go) the answer and the noise are bare expressions
        bare = OmegaConf.create({"tasks": ["tool_countdown"], "max_operand": 999})
        assert builtin.correct_answers(p, bare) == [p.answer]
        assert builtin.reward(p, builtin.wrong_answer(p, rng, bare)) == 0.0


@pytest.mark.parametrize("key", ["tools.max_calls", "tools.max_turns", "rollout.max_new_tokens"])
def test_the_data_preset_fits_one_call_and_an_answer_in_the_context(key):
    cfg = compose("train", ["data=tool_countdown", "tools=code_interpreter"])
    assert cfg.tools.format == "tir" and cfg.tools.tags.call_open == "M="
    longest = max(len(p.prompt) + max(len(t) for t in builtin.correct_answers(p, cfg.data)) for p in problems())
    assert longest + 1 <= cfg.model.arch.max_position_embeddings  # + EOS
    assert max(len(t) for p in problems() for t in builtin.correct_answers(p, cfg.data)) < cfg.rollout.max_new_tokens
    assert {"tools.max_calls": 1, "tools.max_turns": 2, "rollout.max_new_tokens": 40}[key] == OmegaConf.select(cfg, key)


@pytest.mark.parametrize("missing", ["max_number", "max_target"])
def test_a_countdown_task_without_its_bounds_is_refused_not_guessed(missing):
    data = {"tasks": ["countdown3"], "max_number": 9, "max_target": 40}
    del data[missing]
    with pytest.raises(UserError, match=r"countdown3: it needs data.max_number and data.max_target"):
        builtin.sample_problems(OmegaConf.create(data), 2, random.Random(0))
    assert builtin.sample_problems(OmegaConf.create({**data, missing: 40 if missing == "max_target" else 9}), 2, random.Random(0))
