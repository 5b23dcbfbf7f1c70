"""The word-problem task (data=word_problems): the generator is seeded, its answers are right (checked by
reading the story back, independently of how it was written), the difficulty knob changes the
problems, and the source grades a boxed answer or a final number with the math grader."""

from __future__ import annotations

import random
import re

import pytest

from entropyrl.core.errors import UserError
from entropyrl.tasks.word_problems import LEVELS, make_word_problem

EVENT = re.compile(
    r"(?:has (?P<start>\d+) )|(?:(?:buys|finds|gets) (?P<gain>\d+) more )|(?:(?:gives|loses|uses) (?P<loss>\d+) )"
    r"|(?:buys (?P<k>\d+) \w+ with (?P<m>\d+) \w+ in each one)"
)


def read_back(text: str) -> tuple[int, list[int]]:
    """The final count a reader gets from the story, and the numbers it draws (start, gains, groups;
    a loss is drawn up to the count so far, so it is left out)."""
    total, numbers = 0, []
    for m in EVENT.finditer(text):
        if m["start"]:
            total = int(m["start"])
        elif m["gain"]:
            total += int(m["gain"])
        elif m["loss"]:
            total -= int(m["loss"])
            assert total >= 0, text  # never more taken away than there is
        else:
            total += int(m["k"]) * int(m["m"])
        numbers += [int(x) for x in (m["start"], m["gain"], m["k"], m["m"]) if x]
    return total, numbers


@pytest.mark.parametrize("difficulty", sorted(LEVELS))
def test_answers_are_what_the_story_says_and_seeded(difficulty):
    for seed in range(200):
        problem = make_word_problem(random.Random(seed), difficulty)
        total, _ = read_back(problem.prompt)
        assert problem.answer == str(total), problem.prompt
        assert problem.prompt.endswith("have now?") and problem.task == "word_problem"
        assert problem == make_word_problem(random.Random(seed), difficulty)  # same seed, same problem
    assert len({make_word_problem(random.Random(s), difficulty).prompt for s in range(50)}) > 40


def test_difficulty_changes_the_events_and_the_numbers():
    def stats(difficulty):
        problems = [make_word_problem(random.Random(s), difficulty) for s in range(300)]
        events = max(p.prompt.count(".") - 1 for p in problems)  # sentences after "X has N items."
        largest = max(max(read_back(p.prompt)[1]) for p in problems)
        groups = any("in each one" in p.prompt for p in problems)
        losses = any(re.search(r"(gives|loses|uses) \d", p.prompt) for p in problems)
        return events, largest, losses, groups

    assert stats(1) == (1, 10, False, False)  # one gain
    assert stats(2) == (1, 10, True, False)
    assert stats(3) == (2, 10, True, False)
    medium, hard = stats(4), stats(5)
    assert medium[0] == 2 and medium[2:] == (True, True) and 10 < medium[1] <= 20
    assert hard[0] == 3 and 20 < hard[1] <= 50


@pytest.mark.parametrize("bad", [0, 6, "two", 2.5, None])
def test_an_unknown_difficulty_is_one_error_naming_the_valid_values(bad):
    with pytest.raises(UserError, match=r"data.difficulty=.* is not a difficulty: use one of 1, 2, 3, 4, 5"):
        make_word_problem(random.Random(0), bad)


def _source(*overrides, tokenizer=None):
    from entropyrl.conf import compose
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    cfg = compose("train", ["data=word_problems", *overrides])
    return build_prompt_source(cfg.data, seed=3, tokenizer=tokenizer)


class ChatTokenizer:
    chat_template = "<chat>"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages) + "<|assistant|>"


def test_source_prompts_are_seeded_chat_messages_with_the_instruction():
    source = _source(tokenizer=ChatTokenizer())
    first = source.sample(4, step=7)
    assert first == _source().sample(4, step=7) and first != source.sample(4, step=8)
    assert source.validation(5) == source.validation(5) and source.validation(5) != source.sample(5, step=0)
    prompt = source.prompt(first[0])
    assert prompt.startswith("<|user|>" + first[0].prompt + "\n") and prompt.endswith("<|end|><|assistant|>")
    assert "\\boxed{}" in prompt
    bare = _source("data.instruction=null", "data.chat_template=false")
    assert bare.prompt(first[0]) == first[0].prompt  # no template, no instruction: the story itself
    with pytest.raises(UserError, match="data.difficulty"):
        _source("data.difficulty=9")


def test_rewards_read_the_box_else_the_last_number():
    from entropyrl.trainers.data.word_problems import final_answer

    source = _source()
    (problem,) = source.sample(1, step=0)
    right = problem.answer
    wrong = str(int(right) + 1)
    responses = [
        f"So the answer is \\boxed{{{right}}}.",
        f"{right} - 1 = {wrong}, so the answer is \\boxed{{{wrong}}}",  # the box decides, not the last number
        f"First 3 + 4 = 7. Then she has {right} apples.",  # no box: the last number
        f"She has {right} apples, then finds {wrong}.",
        "I do not know.",
        "",
    ]
    assert source.rewards([problem] * len(responses), responses) == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert final_answer("she has 1,234 apples.") == "1234" and final_answer("none") is None


def test_the_task_sets_its_rollout_defaults_and_refuses_the_embedded_tokenizer():
    from entropyrl.conf import compose
    from entropyrl.models.tiny import build_tokenizer

    cfg = compose("train", ["data=word_problems"])
    assert cfg.data.kind == "word_problems" and cfg.data.difficulty == 1
    assert cfg.rollout.temperature == 0.7 and cfg.rollout.max_new_tokens == 64
    assert compose("train", ["data=word_problems", "rollout.temperature=1.0"]).rollout.temperature == 1.0
    with pytest.raises(UserError, match="data=word_problems needs a model whose tokenizer reads English"):
        _source(tokenizer=build_tokenizer())


def test_the_real_model_preset_validates_on_gsm8k_which_ships_with_the_repository():
    from entropyrl.conf import compose
    from entropyrl.evals.benchmarks import load_benchmark

    cfg = compose("train", ["experiment=smollm2_word_problems"])
    assert cfg.model.name == "smollm2-135m" and cfg.data.name == "word_problems"
    assert list(cfg.val.benchmarks) == ["gsm8k"] and cfg.val.limit == 32 and cfg.val.max_new_tokens == 256
    assert compose("train", ["experiment=smollm2_word_problems", "algo=stare"]).algo.name == "stare"
    problems = load_benchmark("gsm8k", limit=cfg.val.limit)  # the repository's copy: no download
    assert len(problems) == 32 and all(p.prompt and p.answer.strip().lstrip("-").replace(",", "").isdigit() for p in problems)
    # the task alone keeps validation on its own held-out prompts
    assert list(compose("train", ["data=word_problems"]).val.benchmarks) == []


class DigitsOnlyTokenizer:
    """A character tokenizer that silently drops what it cannot encode (as the embedded one does once saved)."""

    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text if c.isdigit() or c in " +-=:"]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_a_tokenizer_that_drops_letters_is_refused_and_one_that_reads_english_is_not():
    from entropyrl.trainers.data.word_problems import reads_english

    assert not reads_english(DigitsOnlyTokenizer())
    with pytest.raises(UserError, match="data=word_problems needs a model whose tokenizer reads English"):
        _source(tokenizer=DigitsOnlyTokenizer())
    assert reads_english(ChatTokenizer())  # nothing to check on a tokenizer that cannot encode


def test_a_data_section_without_a_difficulty_is_refused_not_guessed():
    with pytest.raises(UserError, match=r"needs data.difficulty .*word_problems.yaml sets 1"):
        _source("~data.difficulty")
