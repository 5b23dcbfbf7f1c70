"""Reward functions from config (rewards/): a user module written here (outside the package)
weighted with the built-in verifier, per-component metrics, and fallbacks for a function that
raises, hangs or returns NaN. Real training runs of the embedded model, a few steps each."""

from __future__ import annotations

import json
import math
import os
import pickle
import textwrap
from pathlib import Path

import pytest

from entropyrl.core.errors import UserError
from entropyrl.rewards import RewardRunner, problem_fields
from entropyrl.tasks.builtin import BuiltinTaskSource
from entropyrl.tasks.problem import Problem

TINY_RUN = [
    "data=toy",
    "trainer.total_steps=2",
    "trainer.prompts_per_step=4",
    "trainer.mini_batch_prompts=4",
    "rollout.n=4",
    "trainer.val_every=0",
    "trainer.save_every=0",
    "val.prompts=0",
    "trainer.progress=false",
    "tracking.enabled=false",
]

USER_REWARDS = '''
import math
import time

CALLS = []

def short(prompts, responses, group, answer, task, **fields):
    """1 for a response of at most 2 characters (a 'length penalty' next to correctness)."""
    assert len(prompts) == len(responses) == len(group) == len(answer) == len(task)
    return [1.0 if len(r.strip()) <= 2 else 0.0 for r in responses]

def starts_with_answer(responses, answer, **_):
    return [float(r.strip().startswith(a[:1])) for r, a in zip(responses, answer)]

def raises(responses, **_):
    raise RuntimeError("judge crashed")

def nan_first(responses, **_):
    return [math.nan] + [0.5] * (len(responses) - 1)

def hangs(responses, **_):
    time.sleep(60)
    return [1.0] * len(responses)

def wrong_count(responses, **_):
    return [1.0]
'''


@pytest.fixture()
def user_module(tmp_path) -> Path:
    path = tmp_path / "elsewhere" / "my_rewards.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(USER_REWARDS))
    return path


def _train(overrides):
    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import train

    return train(compose("train", overrides), log=lambda *_: None)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_user_reward_module_weighted_with_builtin_and_fallbacks(in_tmp, user_module):
    ref = f"{user_module}"
    functions = (
        f"[{{fn: '{ref}:short', weight: 0.25}}, {{fn: 'builtin:toy', weight: 1.0}}, "
        f"{{fn: '{ref}:raises', weight: 1.0, fallback: -1.0}}, {{fn: '{ref}:nan_first', weight: 0.5}}, "
        f"{{fn: '{ref}:hangs', weight: 1.0, timeout_s: 3, workers: 1, name: slow_judge}}]"
    )
    summary = _train([*TINY_RUN, "output_dir=run", f"reward.functions={functions}"])
    assert summary["status"] == "FINISHED" and summary["steps"] == 2
    rows = _rows(in_tmp / "run")
    for r in rows:
        for name in ("short", "toy", "raises", "nan_first", "slow_judge"):
            assert f"reward/{name}/mean" in r, (name, sorted(r))
        # accuracy is the built-in verifier's verdict; the total is the weighted sum of components
        assert r["acc/mean"] == pytest.approx(r["reward/toy/mean"])
        expected = (
            0.25 * r["reward/short/mean"]
            + r["reward/toy/mean"]
            - 1.0 * 1.0
            + 0.5 * r["reward/nan_first/mean"]
            + r["reward/slow_judge/mean"]
        )
        assert r["reward/mean"] == pytest.approx(expected, abs=1e-5)
        assert r["reward/raises/mean"] == -1.0 and r["reward/raises/fallback/exception"] == 16
        assert r["reward/nan_first/fallback/non_finite"] == 1
        assert r["reward/nan_first/mean"] == pytest.approx((0.0 + 15 * 0.5) / 16)
        assert r["reward/slow_judge/fallback/timeout"] == 16 and r["reward/slow_judge/mean"] == 0.0
        assert r["reward/short/fallback/exception"] == 0
    on_disk = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert on_disk["reward_fallbacks"] == {
        "raises": {"exception": 32},
        "nan_first": {"non_finite": 2},
        "slow_judge": {"timeout": 32},
    }


def _problems(k=3):
    return [Problem("add", f"{i}+1=", str(i + 1), (i, 1), fields={"difficulty": i, "tags": ["a", i]}) for i in range(k)]


def _toy_source():
    from omegaconf import OmegaConf

    return BuiltinTaskSource(OmegaConf.create({"tasks": ["add"], "val_seed": 1}), 0)


def test_wrong_number_of_values_is_one_line_naming_the_function(user_module):
    from omegaconf import OmegaConf

    runner = RewardRunner(OmegaConf.create({"functions": [{"fn": f"{user_module}:wrong_count"}]}), None)
    runner.bind(_toy_source())
    with pytest.raises(UserError, match=r"wrong_count returned 1 values for 3 responses") as err:
        runner.score(_problems(), ["p"] * 3, ["1", "2", "3"], [0, 0, 1])
    assert "\n" not in str(err.value)


def test_hang_in_process_times_out_and_fields_pass_through(user_module):
    runner = RewardRunner(
        {
            "functions": [
                {"fn": f"{user_module}:hangs", "timeout_s": 0.5},
                {"fn": f"{user_module}:starts_with_answer", "weight": 2.0},
            ],
            "fallback": 0.25,
        },
        None,
    )
    runner.bind(_toy_source())
    batch = runner.score(_problems(), ["p"] * 3, ["1", "9", "3"], [0, 1, 2])
    assert batch.components["hangs"] == [0.25] * 3 and batch.fallbacks["hangs"] == {"timeout": 3}
    assert batch.components["starts_with_answer"] == [1.0, 0.0, 1.0]
    assert batch.total == [0.25 + 2.0, 0.25, 0.25 + 2.0]
    assert batch.correct == [1.0, 0.0, 1.0]  # no builtin entry: the source's verifier
    fields = problem_fields(_problems())
    assert fields["difficulty"] == [0, 1, 2] and fields["tags"][2] == ["a", 2] and fields["answer"] == ["1", "2", "3"]
    assert "row_answer" not in fields  # no column of that name: nothing renamed (the null)


def test_a_column_named_as_a_field_never_replaces_the_gold_answer():
    """GSM8K's ``answer`` column holds the worked solution; the gold is its final number. A reward
    function's ``answer`` is the gold the verifier grades against, the column comes as ``row_answer``;
    a column named as a reserved keyword (``problems``) is passed too, not dropped."""
    solution = "48/2 = 24 in May. 48+24 = 72\n#### 72"
    rows = [Problem("gsm8k", "Natalia sold...", "72", None, fields={"answer": solution, "problems": 3, "id": "a7"})]
    fields = problem_fields(rows)
    assert fields["answer"] == ["72"] and fields["row_answer"] == [solution]
    assert fields["row_problems"] == [3] and fields["row_id"] == ["a7"] and "problems" not in fields


@pytest.mark.parametrize(
    "ref, message",
    [
        ("nowhere_pkg.rewards:fn", "cannot import nowhere_pkg.rewards"),
        ("builtin:chess", "unknown built-in; valid: builtin:math, builtin:code"),
        ("no_colon", "write it as pkg.module:fn"),
    ],
)
def test_bad_references_fail_before_anything_runs(ref, message):
    with pytest.raises(UserError, match=message):
        RewardRunner({"functions": [{"fn": ref}]}, None)


def test_missing_function_in_file_and_duplicate_names(user_module):
    with pytest.raises(UserError, match="has no callable 'absent'"):
        RewardRunner({"functions": [f"{user_module}:absent"]}, None)
    with pytest.raises(UserError, match="two entries are named 'short'"):
        RewardRunner({"functions": [f"{user_module}:short", f"{user_module}:short"]}, None)
    with pytest.raises(UserError, match="name 'a/b' is not usable in metric names"):
        RewardRunner({"functions": [{"fn": "builtin:toy", "name": "a/b"}]}, None)
    assert not math.isnan(RewardRunner({"functions": ["builtin:toy"]}, None).entries[0].weight)


ROWS = [
    {"question": "What is 2+3?", "solution": "5", "keywords": ["add", "small"], "meta": {"level": 1}, "max_len": 12},
    {"question": "What is 7*6?", "solution": "42", "keywords": [], "meta": {"level": 2, "src": "x"}, "max_len": 30},
]

FIELD_CHECK = """
import pickle
from pathlib import Path

def record(responses, **fields):
    # each batch runs in a child process (reward.workers: 0): what it saw goes to a file
    Path(__file__).with_suffix(".seen").write_bytes(pickle.dumps(fields))
    return [float(len(r) <= m) for r, m in zip(responses, fields["max_len"])]
"""


@pytest.mark.parametrize("suffix", ["jsonl", "json", "parquet"])
def test_data_fields_reach_reward_functions_untouched(tmp_path, suffix):
    from entropyrl.conf import compose
    from entropyrl.trainers.data.datasets import MathDatasetSource

    path = tmp_path / f"rows.{suffix}"
    if suffix == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif suffix == "json":
        path.write_text(json.dumps(ROWS))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    module = tmp_path / "field_rewards.py"
    module.write_text(FIELD_CHECK)
    data = compose(
        "train",
        [
            "data=dapo_math_17k",
            "data.name=mine",
            f"data.path={path}",
            "data.prompt=boxed",
            "data.chat_template=false",
            "data.grade_workers=1",
            "data.fields.problem=question",
            "data.fields.answer=solution",
        ],
    ).data
    source = MathDatasetSource(data, 0)
    runner = RewardRunner({"functions": [f"{module}:record", {"fn": "builtin:math", "weight": 2.0}]}, None)
    runner.bind(source)
    problems = sorted(source.train_items, key=lambda p: p.answer)
    batch = runner.score(problems, [source.prompt(p) for p in problems], ["\\boxed{42}", "\\boxed{5}"], [0, 1])
    seen = pickle.loads(module.with_suffix(".seen").read_bytes())
    assert seen["keywords"] == [[], ["add", "small"]]
    # parquet stores a struct column: every row has every key (null where the row had none)
    meta_1 = {"level": 1, "src": None} if suffix == "parquet" else {"level": 1}
    assert seen["meta"] == [{"level": 2, "src": "x"}, meta_1]
    assert seen["question"] == ["What is 7*6?", "What is 2+3?"] and seen["answer"] == ["42", "5"]
    assert seen["max_len"] == [30, 12]
    assert batch.correct == [1.0, 1.0] and batch.total == [1.0 + 2.0, 1.0 + 2.0]


def test_the_example_reward_file_loads_and_scores(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    runner = RewardRunner(
        {
            "functions": [
                {"fn": "builtin:toy"},
                {"fn": f"{repo / 'examples' / 'rewards.py'}:plain_number", "weight": 0.2},
                {"fn": f"{repo / 'examples' / 'rewards.py'}:length_penalty", "name": "length"},
                {"fn": f"{repo / 'examples' / 'rewards.py'}:group_diversity"},
            ]
        },
        None,
    )
    runner.bind(_toy_source())
    batch = runner.score(_problems(), ["p"] * 3, ["1", "02", "3 4"], [0, 0, 1])
    assert batch.components["plain_number"] == [1.0, 0.0, 0.0]
    assert batch.components["length"] == pytest.approx([0.0, -0.1, -0.2])
    assert batch.components["group_diversity"] == [1.0, 1.0, 1.0]
    assert batch.correct == [1.0, 1.0, 0.0]  # the add checker reads "02" as 2


def test_builtin_countdown_entry_grades_countdown_and_refuses_toy_problems():
    import random

    from omegaconf import OmegaConf

    from entropyrl.tasks import builtin as tasks

    cfg = OmegaConf.create({"tasks": ["countdown3"], "max_number": 9, "max_target": 40, "val_seed": 1})
    problems = tasks.sample_problems(cfg, 2, random.Random(0))
    runner = RewardRunner({"functions": ["builtin:countdown"]}, None)
    runner.bind(BuiltinTaskSource(cfg, 0))
    batch = runner.score(problems, [p.prompt for p in problems], [problems[0].answer, "1+1=2"], [0, 1])
    assert batch.components["countdown"] == [1.0, 0.0] == batch.correct
    with pytest.raises(UserError, match="builtin:countdown grades countdown problems; this data has task 'add'"):
        runner.score(_problems(1), ["p"], ["1"], [0])


def test_a_run_saved_before_reward_and_lora_existed_still_resumes():
    from omegaconf import OmegaConf

    from entropyrl.conf import compose
    from entropyrl.trainers.run.run_dir import config_differences, upgrade_saved_config

    requested = OmegaConf.to_container(compose("train", ["output_dir=x"]), resolve=True)
    saved = {k: v for k, v in requested.items() if k != "reward"}
    saved["model"] = {k: v for k, v in requested["model"].items() if k != "lora"}
    assert config_differences(upgrade_saved_config(saved, requested), requested) == []
    with_lora = OmegaConf.to_container(compose("train", ["output_dir=x", "model.lora.rank=4"]), resolve=True)
    assert [d[0] for d in config_differences(upgrade_saved_config(saved, with_lora), with_lora)] == ["model.lora.rank"]


def test_reward_workers_leave_a_stop_signal_to_the_trainer(user_module):
    """Ctrl-C or ``timeout`` signal the whole process group; the step in progress must still get its
    real rewards (a dead worker would give it the fallback)."""
    import signal

    from entropyrl.rewards.calls import WorkerPool

    pool = WorkerPool(f"{user_module}:starts_with_answer", 1)
    batch = {"responses": ["4 apples", "5"], "answer": ["4", "4"]}
    try:
        assert pool.call(batch, 2, 30.0, "starts_with_answer") == [1.0, 0.0]
        procs = list(pool.pool._processes.values())
        for proc in procs:
            for sig in (signal.SIGTERM, signal.SIGINT):
                os.kill(proc.pid, sig)
        assert pool.call(batch, 2, 30.0, "starts_with_answer") == [1.0, 0.0]
        assert all(proc.is_alive() for proc in procs)
    finally:
        pool.kill()


def test_a_reward_worker_ends_when_its_trainer_is_gone(user_module, tmp_path):
    """Ignoring the group's stop signal must not leave it running after a trainer killed outright."""
    import subprocess
    import sys
    import time

    script = tmp_path / "dies.py"
    script.write_text(
        "import os\n"
        "from entropyrl.rewards.calls import WorkerPool\n"
        "if __name__ == '__main__':  # spawned workers import this file\n"
        f"    pool = WorkerPool({f'{user_module}:starts_with_answer'!r}, 1)\n"
        "    pool.call({'responses': ['4'], 'answer': ['4']}, 1, 30.0, 'r')\n"
        "    print(*[p.pid for p in pool.pool._processes.values()], flush=True)\n"
        "    os._exit(0)  # no shutdown: as a SIGKILL would leave it\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    pids = [int(p) for p in out.stdout.split()]
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids and not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"
