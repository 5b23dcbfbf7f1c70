"""A data file's rows are read one way: the columns guessed from the first row (which the run prints at
start) are the columns of every row, and a row whose answer reads as empty is refused by name. A file
whose second row had other column names was read under another guess without a word, and a gold answer
that the guessed reading turned into "" (a "solution" without a ``\\boxed{}``) was graded as a problem no
response could get right. Nor is anything the file or the data settings hold dropped or clamped
without a word: rows that are not objects, repeated rows, a holdout or limit the data cannot honour,
fewer validation problems than val.prompts asks for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from entropyrl.core.errors import UserError
from entropyrl.evals.benchmarks import describe_fields, read_rows, rows_to_problems


def _file(tmp_path, rows: list[dict], name: str = "mine.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_with_the_first_rows_columns_read_as_the_start_line_says(tmp_path):
    """The null: a uniform file reads every row, by the columns the start line names."""
    rows = read_rows(_file(tmp_path, [{"question": "1+1", "answer": "2"}, {"question": "2+2", "answer": 4}]))
    assert [(p.prompt, p.answer) for p in rows_to_problems(rows, source="mine")] == [("1+1", "2"), ("2+2", "4")]
    assert describe_fields(rows).startswith("problem from 'question', answer from 'answer'")


def test_a_row_with_other_columns_than_the_first_is_named_not_guessed_again(tmp_path):
    path = _file(tmp_path, [{"problem": "1+1", "answer": "2"}, {"question": "2+2", "solution": "4"}])
    with pytest.raises(UserError, match=rf"{path}:2: row has no field 'problem' .*data.fields.problem=COL"):
        rows_to_problems(read_rows(path), source=str(path))


def test_rows_whose_answer_reads_as_empty_are_refused_with_their_lines(tmp_path):
    rows = [{"problem": f"{i}+{i}", "solution": "two" if i % 2 else f"\\boxed{{{2 * i}}}"} for i in range(6)]
    path = _file(tmp_path, rows)
    with pytest.raises(
        UserError, match=r"3 of 6 row\(s\) have no answer \(lines 2, 4, 6; the first: 'solution' = 'two' read as boxed"
    ):
        rows_to_problems(read_rows(path), source=str(path))
    # the null: the same column read as a plain field gives every row its answer
    fields = {"problem": "problem", "answer": "solution", "gold": "field"}
    assert [p.answer for p in rows_to_problems(read_rows(path), fields, source=str(path))][:2] == ["\\boxed{0}", "two"]


def test_a_verl_row_with_an_empty_ground_truth_is_refused(tmp_path):
    row = {"prompt": [{"role": "user", "content": "1+1"}], "reward_model": {"ground_truth": ""}}
    good = {"prompt": [{"role": "user", "content": "2+2"}], "reward_model": {"ground_truth": "4"}}
    path = _file(tmp_path, [good, row])
    with pytest.raises(UserError, match=r"1 of 2 row\(s\) have no answer \(lines 2; .*ground_truth is empty"):
        rows_to_problems(read_rows(path), source=str(path))
    assert [p.answer for p in rows_to_problems(read_rows(_file(tmp_path, [good], "good.jsonl")))] == ["4"]


def test_train_on_a_file_with_answerless_rows_is_one_error_line(tmp_path):
    path = _file(tmp_path, [{"problem": "1+1", "answer": "2"}, {"problem": "2+2", "answer": " "}])
    cmd = [sys.executable, "-m", "entropyrl.cli.main", "train", "data=dapo_math_17k", f"data.path={path}"]
    cmd += ["trainer.total_steps=1", "tracking.enabled=false", f"output_dir={tmp_path / 'run'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "1 of 2 row(s) have no answer (lines 2;" in errors[0]


def test_a_row_that_is_not_an_object_is_named_not_left_out(tmp_path):
    """A list or a string among the rows was dropped without a word (a 4-line file read as 2 problems)."""
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"problem": "1+1", "answer": "2"}\n["2+2", "4"]\n"hello"\n{"problem": "3+3", "answer": "6"}\n')
    with pytest.raises(UserError, match=rf'{path}:2: a row must be a JSON object like {{"problem".* a list \(\["2\+2", "4"\]\)'):
        read_rows(path)
    listed = tmp_path / "mixed.json"
    listed.write_text('[{"problem": "1+1", "answer": "2"}, 7]')
    with pytest.raises(UserError, match=rf"{listed}: row 2: a row must be a JSON object.* a number \(7\)"):
        read_rows(listed)
    # the null: objects only read every row
    path.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "3+3", "answer": "6"}\n')
    assert len(read_rows(path)) == 2


def test_a_json_document_that_does_not_parse_is_named_where_it_breaks(tmp_path):
    """A pretty-printed list with a trailing comma on line 4 was blamed on line 1 (read again as JSON lines)."""
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"problem": "1+1", "answer": "2"},\n  {"problem": "2+2", "answer": "4"},\n]\n')
    with pytest.raises(UserError, match=rf"{path}:4:1: not valid JSON \(Expecting value\)"):
        read_rows(path)
    # JSON lines under a .json name still read as lines, and their bad line is named
    path.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": \n')
    with pytest.raises(UserError, match=rf"{path}:2: not valid JSON"):
        read_rows(path)


def test_repeated_rows_are_counted_and_said(tmp_path, capsys):
    """Rows repeating an earlier (problem, answer) are left out, counted, and the count is said at start."""
    from entropyrl.evals.benchmarks import repeated_note

    rows = [{"problem": "1+1", "answer": "2"}, {"problem": "1+1", "answer": "2"}, {"problem": "1+1", "answer": "3"}] * 2
    problems = rows_to_problems(read_rows(_file(tmp_path, rows)))
    assert [(p.prompt, p.answer) for p in problems] == [("1+1", "2"), ("1+1", "3")]
    assert problems.repeated == 4
    assert repeated_note("mine", problems) == (
        "mine: left out 4 row(s) repeating an earlier row's (problem, answer): each problem counts once"
    )
    assert repeated_note("mine", rows_to_problems(read_rows(_file(tmp_path, rows[:1] + rows[2:3])))) is None


def test_eval_and_train_say_how_many_rows_repeat(tmp_path):
    from entropyrl.conf import compose
    from entropyrl.trainers.data.datasets import MathDatasetSource

    rows = [{"problem": f"{i}+{i}", "answer": str(2 * i)} for i in range(5)]
    path = _file(tmp_path, rows + rows[:2])
    data = compose("train", ["data=dapo_math_17k", f"data.path={path}", "data.grade_workers=1"]).data
    source = MathDatasetSource(data, 0)
    assert "data: left out 2 row(s) repeating an earlier row's (problem, answer): each problem counts once" in source.notes
    command = [sys.executable, "-m", "entropyrl.cli.main", "eval", str(path), "eval.n_samples=1", "eval.max_new_tokens=2"]
    out = subprocess.run(
        [*command, f"output_dir={tmp_path / 'ev'}", "tracking.enabled=false"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "left out 2 row(s) repeating an earlier row's (problem, answer)" in out.stdout + out.stderr


def _source(tmp_path, *overrides: str):
    from entropyrl.conf import compose
    from entropyrl.trainers.data.datasets import MathDatasetSource

    path = _file(tmp_path, [{"problem": f"{i}+{i}", "answer": str(2 * i)} for i in range(20)])
    data = compose("train", ["data=dapo_math_17k", f"data.path={path}", "data.grade_workers=1", *overrides]).data
    return MathDatasetSource(data, 0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.holdout=100", r"data.holdout=100 is not allowed: the data has 20 problem\(s\), so hold out 0 to 19"),
        ("data.holdout=-5", r"data.holdout=-5 is not allowed"),
        ("data.limit=-3", r"data.limit=-3 is not allowed: it must be a positive number of problems, or null for all"),
        ("data.limit=0", r"data.limit=0 is not allowed"),
    ],
)
def test_a_holdout_or_limit_the_data_cannot_honour_is_an_error_not_a_clamp(tmp_path, override, message):
    """holdout=100 of 20 problems held out 19, holdout=-5 trained on 5, limit=-3 dropped the last 3: all silent."""
    with pytest.raises(UserError, match=message):
        _source(tmp_path, override)


def test_holdout_and_limit_within_the_data_are_honoured(tmp_path):
    source = _source(tmp_path, "data.holdout=19")
    assert (len(source.train_items), len(source.val_items)) == (1, 19)
    source = _source(tmp_path, "data.limit=5", "data.holdout=2")
    assert (len(source.train_items), len(source.val_items)) == (3, 2)


def test_fewer_validation_problems_than_val_prompts_is_said(tmp_path):
    from entropyrl.conf import compose
    from entropyrl.trainers.components import build_source

    path = _file(tmp_path, [{"problem": f"{i}+{i}", "answer": str(2 * i)} for i in range(20)])
    lines: list[str] = []
    for prompts in (128, 3):  # the null: as many as it holds
        cfg = compose("train", ["data=dapo_math_17k", f"data.path={path}", "data.holdout=3", f"val.prompts={prompts}"])
        build_source(cfg, None, log=lines.append)
    said = [line for line in lines if line.startswith("val:")]
    assert said == [
        "val: validating on 3 problem(s), not val.prompts=128: the data's validation set holds 3 (raise data.holdout, or set val.prompts=3)"
    ]


def test_validating_on_the_training_problems_is_said(tmp_path):
    """With ``data.holdout=0`` (the default for your own file) ``val.prompts`` samples the problems
    the run trains on: said at start, never called a validation set. Nulls: problems held out, or no
    ``val.prompts``, say nothing of it."""
    from entropyrl.conf import compose
    from entropyrl.trainers.components import build_source

    path = _file(tmp_path, [{"problem": f"{i}+{i}", "answer": str(2 * i)} for i in range(20)])
    for extra, expected in (
        (["val.prompts=8"], ["val: val.prompts=8 validates on 8 of the problems it trains on (data.holdout=0)"]),
        (["val.prompts=128"], ["val: val.prompts=128 validates on 20 of the problems it trains on (data.holdout=0)"]),
        (["val.prompts=8", "data.holdout=8"], []),
        (["val.prompts=0"], []),
    ):
        lines: list[str] = []
        build_source(compose("train", ["data=dapo_math_17k", f"data.path={path}", *extra]), None, log=lines.append)
        said = [line for line in lines if line.startswith("val:")]
        assert [line.split(":")[0] + ":" + line.split(":")[1] for line in said] == expected, (extra, said)
        assert all("not a held-out score; set data.holdout=N" in line and "validation set" not in line for line in said)


def test_two_files_of_one_name_are_refused_and_one_file_twice_is_one(tmp_path, monkeypatch):
    """Results are kept by a file's name without its suffix: ``a/test.jsonl`` and ``b/test.jsonl``
    were one table row of both files' problems; now one line naming both. The same file given
    twice (two spellings) is read once, and differently named files pass (the nulls)."""
    from entropyrl.evals.benchmarks import expand_benchmarks

    rows = [{"problem": "1+1?", "answer": "2"}]
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        _file(tmp_path / folder, rows, "test.jsonl")
    _file(tmp_path / "b", rows, "other.jsonl")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"a/test.jsonl and b/test.jsonl would both be reported as 'test'.*rename one") as err:
        expand_benchmarks(["a/test.jsonl", "b/test.jsonl"])
    assert "\n" not in str(err.value)
    assert expand_benchmarks(["a/test.jsonl", "./a/test.jsonl"]) == ["a/test.jsonl"]
    assert expand_benchmarks(["a/test.jsonl", "b/other.jsonl", "aime24"]) == ["a/test.jsonl", "b/other.jsonl", "aime24"]
    _file(tmp_path, rows, "aime24.jsonl")
    with pytest.raises(UserError, match="would both be reported as 'aime24'"):
        expand_benchmarks(["aime24", "aime24.jsonl"])
