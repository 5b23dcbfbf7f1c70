"""Code benchmarks, program extraction, `entropyrl grade` on code rows, `entropyrl eval humaneval`
and training on code: every verdict comes from the real sandbox (evals/code/sandbox.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from entropyrl.core.errors import UserError
from entropyrl.evals.code.code_eval import code_problem_metrics
from entropyrl.evals.code.code_tasks import grade_code, job_for, load_humaneval, rows_to_code_problems, split_check
from entropyrl.evals.code.sandbox import SandboxLimits, SandboxPool
from entropyrl.evals.metrics import pass_at_k

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
FAST_TINY = ["model=tiny", "model.warm_start.steps=3", "model.warm_start.batch_size=8"]


def run_cli(*args, cwd=None, timeout=600):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=dict(os.environ), timeout=timeout)


@pytest.fixture(scope="module")
def humaneval():
    return load_humaneval()


@pytest.fixture(scope="module")
def pool():
    return SandboxPool(workers=2, limits=SandboxLimits(wall_seconds=10))


def test_humaneval_ships_164_problems(humaneval):
    assert len(humaneval) == 164 and len({p.id for p in humaneval}) == 164
    assert all(p.entry_point and "def check(candidate)" in p.test and p.canonical for p in humaneval)


def test_first_canonical_solutions_pass_and_empty_bodies_fail(humaneval, pool):
    first = humaneval[:6]
    good = grade_code(first, [p.canonical for p in first], pool)
    assert [r.reason for _, r in good] == ["pass"] * 6
    empty = grade_code(first, ["    pass\n"] * 6, pool)
    assert all(not r.passed and r.reason in ("fail", "error") for _, r in empty)


@pytest.mark.slow
def test_all_164_canonical_solutions_pass(humaneval, pool):
    results = grade_code(humaneval, [p.canonical for p in humaneval], pool)
    failed = [(p.id, r.reason, r.detail) for p, (_, r) in zip(humaneval, results) if not r.passed]
    assert failed == []


@pytest.mark.slow
def test_each_problems_tests_fail_on_another_problems_solution(humaneval, pool):
    # Problem i's tests against problem i+1's solution, renamed to problem i's entry point.
    jobs = []
    for i, p in enumerate(humaneval):
        other = humaneval[(i + 1) % len(humaneval)]
        program = other.prompt + other.canonical + f"\n{p.entry_point} = {other.entry_point}\n"
        jobs.append(job_for(p, program))
    results = pool.map(jobs)
    passed = [p.id for p, r in zip(humaneval, results) if r.passed]
    assert passed == []


def test_programs_from_fenced_blocks_whole_functions_and_completions(humaneval, pool):
    p = next(q for q in humaneval if q.id == "HumanEval/2")  # truncate_number
    body = p.canonical  # "    return number % 1.0\n"
    whole = "def truncate_number(number: float) -> float:\n" + body
    responses = {
        "completion": body,
        "fenced": f"Here you go:\n```python\n{whole}```\nIt returns the decimals.",
        "whole_function": "Sure.\n\n" + whole,
        "fenced_wrong": "```python\ndef truncate_number(number):\n    return number\n```",
        "prose": "I cannot do that.",
    }
    graded = dict(zip(responses, grade_code([p] * len(responses), list(responses.values()), pool)))
    assert {k: r.passed for k, (_, r) in graded.items()} == {
        "completion": True,
        "fenced": True,
        "whole_function": True,
        "fenced_wrong": False,
        "prose": False,
    }
    program = graded["fenced"][0]
    assert program.startswith(p.prompt.rstrip()) and "It returns" not in program
    assert graded["fenced_wrong"][1].reason == "fail" and graded["prose"][1].reason == "error"


def test_fraction_of_asserts_from_check(humaneval, pool):
    p = next(q for q in humaneval if q.id == "HumanEval/0")
    parts = split_check(p.test)
    assert parts and len(parts) == p.test.count("assert candidate")
    # Always True: right on the "== True" asserts only.
    res = pool.map([job_for(p, p.prompt + "    return True\n", "fraction"), job_for(p, p.prompt + p.canonical, "fraction")])
    assert 0.0 < res[0].fraction < 1.0 and not res[0].passed
    assert res[1].passed and res[1].fraction == 1.0 and res[1].tests_total == len(parts)


def test_mbpp_and_livecodebench_layouts(pool):
    mbpp = rows_to_code_problems(
        [
            {
                "task_id": 11,
                "text": "Add one to x.",
                "code": "def add1(x):\n    return x + 1",
                "test_list": ["assert add1(1) == 2", "assert add1(-1) == 0"],
                "test_setup_code": "",
            }
        ]
    )
    stdio = rows_to_code_problems(
        [
            {
                "question_id": "abc1",
                "question_content": "Print the sum of two ints.",
                "public_test_cases": json.dumps(
                    [
                        {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
                        {"input": "5 5\n", "output": "10\n", "testtype": "stdin"},
                    ]
                ),
                "metadata": "{}",
            }
        ]
    )
    functional = rows_to_code_problems(
        [
            {
                "question_id": "lc1",
                "question_content": "Double it.",
                "starter_code": "class Solution:",
                "public_test_cases": [{"input": "3", "output": "6", "testtype": "functional"}],
                "metadata": {"func_name": "double"},
            }
        ]
    )
    problems = [mbpp[0], mbpp[0], stdio[0], stdio[0], functional[0]]
    responses = [
        "```python\ndef add1(x):\n    return x + 1\n```",
        "def add1(x):\n    return x\n",
        "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
        "print(3)",
        "```python\nclass Solution:\n    def double(self, x):\n        return 2 * x\n```",
    ]
    verdicts = [r for _, r in grade_code(problems, responses, pool)]
    assert [v.passed for v in verdicts] == [True, False, True, False, True]
    assert verdicts[3].tests_passed == 1 and verdicts[3].tests_total == 2


def test_code_metrics_are_unbiased_pass_at_k():
    m = code_problem_metrics([True, False, False, True, False, False, False, False, False, False])
    assert set(m) == {"avg@10", "pass@1", "pass@5", "pass@10"}
    assert m["pass@5"] == pytest.approx(pass_at_k(10, 2, 5)) and m["pass@10"] == 1.0
    assert set(code_problem_metrics([True, False])) == {"avg@2", "pass@1"}


def test_grade_cli_grades_code_rows(tmp_path, humaneval):
    p = humaneval[2]
    rows = [
        {"prompt": p.prompt, "test": p.test, "entry_point": p.entry_point, "response": p.canonical},
        {"benchmark": "humaneval", "id": "HumanEval/2", "response": "```python\ndef truncate_number(n):\n    return 0\n```"},
        {"benchmark": "humaneval", "id": 2, "response": "import os\nos._exit(0)\n"},
        {"benchmark": "humaneval", "id": "HumanEval/999", "response": "x"},
        {"response": "\\boxed{4}", "answer": "4"},  # a math row beside them
    ]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = run_cli("grade", src, "--out", tmp_path / "graded.jsonl", "--allow-skipped", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rows.jsonl:4" in out.stderr and "HumanEval/999" in out.stderr
    graded = [json.loads(line) for line in (tmp_path / "graded.jsonl").read_text().splitlines()]
    assert len(graded) == 4
    assert [g["correct"] for g in graded] == [True, False, False, True]
    assert [g.get("reason") for g in graded[:3]] == ["pass", "fail", "error"]
    assert graded[0]["program"].startswith(p.prompt.rstrip()) and "def truncate_number(n)" in graded[1]["program"]


def test_grading_code_lines_into_a_log_beats_as_programs_finish(tmp_path, humaneval):
    """The heartbeat counted code lines once their whole chunk had run (minutes of silence)."""
    p = humaneval[2]
    row = {"prompt": p.prompt, "test": p.test, "entry_point": p.entry_point, "response": p.canonical}
    src = tmp_path / "rows.jsonl"
    src.write_text((json.dumps(row) + "\n") * 6)
    out = run_cli("grade", src, "--out", tmp_path / "graded.jsonl", "--workers", "1", "--heartbeat", "0.001", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    counts = [int(ln.split(": ")[1].split(" ")[0]) for ln in out.stderr.splitlines() if ln.startswith(f"grading {src}: ")]
    assert len(set(counts)) >= 2 and counts == sorted(counts) and counts[-1] <= 6, out.stderr[-2000:]


@pytest.mark.slow
def test_eval_humaneval_with_the_tiny_model(tmp_path):
    out = run_cli("eval", "humaneval", *FAST_TINY, "eval.n_samples=2", "eval.limit=5", "output_dir=run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    bench = summary["benchmarks"]["humaneval"]
    assert bench["problems"] == 5 and bench["n_samples"] == 2 and set(bench["metrics"]) == {"avg@2", "pass@1"}
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 10
    assert all(
        s["reason"] in ("pass", "fail", "error", "timeout", "memory", "output_limit", "killed") and "program" in s
        for s in samples
    )
    assert bench["metrics"]["avg@2"] == pytest.approx(sum(s["correct"] for s in samples) / 10)
    # `grade` reads eval's own samples.jsonl (problem_id, not id) and agrees with it
    regraded = run_cli("grade", "run/samples.jsonl", "--out", "regraded.jsonl", cwd=tmp_path)
    assert regraded.returncode == 0 and "malformed" not in regraded.stdout, regraded.stderr[-3000:]
    again = [json.loads(line) for line in (tmp_path / "regraded.jsonl").read_text().splitlines()]
    assert [g["correct"] for g in again] == [s["correct"] for s in samples]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["entropyrl"], output_format="list")
    assert len(runs) == 1 and "eval/humaneval/pass_at_1" in runs[0].data.metrics


# --- training on code ------------------------------------------------------------------------

TASKS = [
    {
        "task_id": "t/0",
        "prompt": "def inc(x):\n",
        "entry_point": "inc",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\n    assert candidate(-1) == 0\n",
    },
    {
        "task_id": "t/1",
        "prompt": "def sq(x):\n",
        "entry_point": "sq",
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n",
    },
]


@pytest.fixture()
def task_file(tmp_path):
    path = tmp_path / "code_tasks.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    return path


def _source(task_file, reward):
    from entropyrl.conf import compose
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    cfg = compose(
        "train",
        [
            "data=humaneval_code",
            f"data.path={task_file}",
            f"data.reward={reward}",
            "data.sandbox.workers=2",
            "data.sandbox.wall_seconds=3",
        ],
    )
    return build_prompt_source(cfg.data, seed=0, tokenizer=None)


def test_code_source_rewards_scripted_responses(task_file):
    src = _source(task_file, "pass_all")
    inc, sq = sorted(src.sample(2, step=0), key=lambda p: p.id)
    assert src.prompt(inc) == "def inc(x):\n"
    responses = [
        "    return x + 1\n",
        "    return 1\n",
        "    return x * x\n",
        "import os\nos._exit(0)\n",
        "    while True:\n        pass\n",
    ]
    rewards = src.rewards([inc, inc, sq, sq, sq], responses)
    assert rewards == [1.0, 0.0, 1.0, 0.0, 0.0]
    frac = _source(task_file, "fraction")
    assert frac.rewards([inc, inc], ["    return 2\n", "    return x + 1\n"]) == [pytest.approx(1 / 3), 1.0]
    with pytest.raises(UserError, match="data.reward"):
        _source(task_file, "partial")


@pytest.mark.slow
def test_train_on_code_tasks_with_the_tiny_model(task_file, tmp_path):
    # The embedded model cannot write code (every reward is 0); this runs the whole loop:
    # prompts, rollouts, sandboxed rewards, advantages, an update, metrics and MLflow.
    out = run_cli(
        "train",
        *FAST_TINY,
        "data=humaneval_code",
        f"data.path={task_file}",
        "data.unrepresentable=warn",  # Python through the embedded character tokenizer: said, counted, run anyway
        "data.sandbox.workers=2",
        "trainer.total_steps=2",
        "trainer.prompts_per_step=2",
        "trainer.mini_batch_prompts=2",
        "rollout.n=2",
        "trainer.val_every=0",
        "val.prompts=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.threads=1",
        "output_dir=run",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 of 2 prompt(s) hold characters the model cannot represent" in out.stdout + out.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows][-1] == 2 and all("reward/mean" in r for r in rows)


def test_code_prompts_the_embedded_model_cannot_read_are_refused(task_file):
    from entropyrl.conf import compose
    from entropyrl.models.tiny import build_tokenizer
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    cfg = compose("train", ["data=humaneval_code", f"data.path={task_file}", "data.sandbox.workers=1"])
    with pytest.raises(UserError, match=r"2 of 2 prompt\(s\) hold characters .*model=smollm2-135m"):
        build_prompt_source(cfg.data, seed=0, tokenizer=build_tokenizer())


def test_a_chat_template_asked_for_code_data_is_never_dropped_in_silence(task_file):
    """data.chat_template=true with a tokenizer that has none fell back to raw text without a word."""
    from entropyrl.conf import compose
    from entropyrl.models.tiny import build_tokenizer
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    def source(chat: str, tokenizer):
        overrides = ["data=humaneval_code", f"data.path={task_file}", "data.sandbox.workers=1", f"data.chat_template={chat}"]
        return build_prompt_source(compose("train", [*overrides, "data.unrepresentable=warn"]).data, seed=0, tokenizer=tokenizer)

    with pytest.raises(UserError, match=r"data.chat_template=True but the model's tokenizer has no chat template"):
        source("true", build_tokenizer())
    assert source("auto", build_tokenizer()).chat is False and source("false", build_tokenizer()).chat is False


def test_programs_cannot_redefine_the_checker_or_the_function_under_test(humaneval, pool):
    p = next(q for q in humaneval if q.id == "HumanEval/2")
    wrong = "    return 0.0\n"
    cheats = [
        wrong + "\ndef check(candidate):\n    pass\n",  # its own check()
        wrong + "\nimport builtins\nbuiltins.exec = lambda *a, **k: None\n",  # disarm exec
        wrong + "\nimport sys\nsys.modules['builtins'].AssertionError = KeyboardInterrupt\n",
    ]
    verdicts = [r for _, r in grade_code([p] * len(cheats), cheats, pool)]
    assert [v.passed for v in verdicts] == [False, False, False]
    assert all(v.reason in ("fail", "error") for v in verdicts)


def test_builtin_code_reward_entry_grades_in_the_sandbox_beside_a_user_function(task_file, tmp_path):
    from entropyrl.rewards import RewardRunner

    src = _source(task_file, "pass_all")
    inc, sq = sorted(src.sample(2, step=0), key=lambda p: p.id)
    user = tmp_path / "short.py"
    user.write_text("def short(responses, **_):\n    return [float(len(r) < 20) for r in responses]\n")
    runner = RewardRunner({"functions": [{"fn": "builtin:code", "weight": 1.0}, {"fn": f"{user}:short", "weight": 0.5}]}, None)
    runner.bind(src)
    responses = ["    return x + 1\n", "    return 1\n", "    return x * x\n"]
    batch = runner.score([inc, inc, sq], ["p"] * 3, responses, [0, 0, 1])
    assert batch.components["code"] == [1.0, 0.0, 1.0] and batch.correct == [1.0, 0.0, 1.0]
    assert batch.total == [1.5, 0.5, 1.5]
    toy = RewardRunner({"functions": ["builtin:toy"]}, None)
    toy.bind(src)
    with pytest.raises(UserError, match="builtin:toy grades the toy tasks"):
        toy.score([inc], ["p"], ["x"], [0])


def test_a_code_prompt_cut_to_fit_the_context_is_said():
    """The cap lowered to half the context and prompts cut to their end, for every prompt of the
    benchmark, without a word (summary.json kept the requested eval.max_new_tokens)."""
    from types import SimpleNamespace

    from entropyrl.evals.code.code_eval import _fit_context
    from entropyrl.models.tiny import build_tokenizer

    tok = build_tokenizer()
    engine = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64)), tokenizer=tok)
    prompts, cap, note = _fit_context(engine, ["1+1=", "12345678901234567890" * 3], 40)
    assert cap == 32 and prompts[0] == "1+1=" and len(prompts[1]) == 30
    assert note == (
        "the model's context (64 positions) does not hold a prompt and eval.max_new_tokens=40: responses capped at 32 "
        "tokens, 1 of 2 prompt(s) cut to their last 30 tokens (a model with a longer context evaluates them whole)"
    )
    # the null: prompts and cap that fit are left whole, and nothing is said
    assert _fit_context(engine, ["1+1=", "2+2="], 40) == (["1+1=", "2+2="], 40, None)
