"""A data file's rows are read one way: the columns guessed from the first row (which the run prints at
start) are the columns of every row, and a row whose answer reads as empty is refused by name. A file
whose second row had other column names was read under another guess without a word, and a gold answer
that the guessed reading turned into "" (a "solution" without a ``\\boxed{}``) was graded as a problem no
response could get right."""

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
