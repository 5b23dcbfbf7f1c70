"""`entropyrl grade` reads its input as `data.path` does and streams it: bytes that are not UTF-8 are
refused with their line and column (never graded as U+FFFD), and memory does not grow with the
file (the lines are graded and written a chunk at a time)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import tracemalloc

import pytest

from entropyrl.cli import grade_cmd
from entropyrl.core.errors import UserError
from entropyrl.evals.benchmarks import read_rows


def _grade_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "grade", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_bytes_that_are_not_utf8_are_refused_with_line_and_column_as_data_path_does(tmp_path):
    src = tmp_path / "in.jsonl"
    good = json.dumps({"response": "\\boxed{2}", "answer": "2"}).encode()
    latin1 = '{"response": "caf\xe9 \\\\boxed{2}", "answer": "2"}'.encode("latin-1")  # é as one latin-1 byte
    src.write_bytes(good + b"\n" + latin1 + b"\n")
    column = latin1.index(b"\xe9") + 1
    run = _grade_cli(src, "--out", tmp_path / "out.jsonl")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    said = f"in.jsonl:2: byte 0xe9 (column {column}) is not UTF-8: re-encode the file as UTF-8"
    assert said in run.stderr, run.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and "\ufffd" not in json.dumps(rows)  # the bad line is not graded with its bytes replaced
    with pytest.raises(UserError) as twin:  # data.path's words for the same bytes
        read_rows(src)
    assert f"byte 0xe9 (column {column}) is not UTF-8: re-encode the file as UTF-8" in str(twin.value)


def test_iter_items_reads_lazily_and_names_each_kind_of_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(
        b'{"response": "\\\\boxed{1}", "answer": "1"}\n\n[1]\n{"answer": 1}\n{"response": "x", "answer": true}\n\xff\n'
    )
    items = grade_cmd.iter_items(src)
    first = next(items)  # a generator: nothing past the first line is needed for it
    assert first[0] == 1 and first[1]["answer"] == "1" and first[2] is None
    rest = [(n, p) for n, _, p in items]
    assert rest == [
        (3, "not a JSON object"),
        (4, "missing field 'response'"),
        (5, "field 'answer' is not a string, number or list"),
        (6, rest[-1][1]),
    ]
    assert rest[-1][1].startswith("byte 0xff (column 1) is not UTF-8")
    assert [len(c) for c in grade_cmd.chunks(iter(range(7)), 3)] == [3, 3, 1]


def test_grade_memory_does_not_grow_with_the_file(tmp_path, monkeypatch):
    """A file of 48 MB graded in chunks of 4 lines: the command's Python allocations stay far below
    the file's size (the whole file, parsed, was held before), and every line is written in order."""
    from typer.testing import CliRunner

    from entropyrl.cli.app import app

    src, dst = tmp_path / "big.jsonl", tmp_path / "big.graded.jsonl"
    pad = "words " * 80_000  # 480 kB per response
    with open(src, "w", encoding="utf-8") as fh:
        for i in range(100):
            fh.write(json.dumps({"id": i, "response": pad + f"\\boxed{{{i % 7}}}", "answer": str(i % 7)}) + "\n")
    size = src.stat().st_size
    monkeypatch.setattr(grade_cmd, "CHUNK_LINES", 4)
    warm = tmp_path / "warm.jsonl"  # the imports and the grading pool, before memory is traced
    warm.write_text(json.dumps({"response": "\\boxed{1}", "answer": "1"}) + "\n")
    assert CliRunner().invoke(app, ["grade", str(warm), "--workers", "1"]).exit_code == 0
    tracemalloc.start()
    try:
        result = CliRunner().invoke(app, ["grade", str(src), "--out", str(dst), "--workers", "1", "--reflection-words", "none"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0, result.output[-2000:]
    with open(dst, encoding="utf-8") as fh:
        ids = [json.loads(line)["id"] for line in fh]
    assert ids == list(range(100))
    assert peak < size / 4, (peak, size)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_grade_keeps_the_lines_graded_so_far_and_says_where(tmp_path, sig):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    line = json.dumps({"response": "so the answer is \\boxed{3/4}", "answer": "0.75"})
    src.write_text((line + "\n") * 6 * grade_cmd.CHUNK_LINES)  # several chunks: the stop comes mid-file
    proc = subprocess.Popen(
        [sys.executable, "-m", "entropyrl.cli.main", "grade", str(src), "--out", str(out), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not any(p.stat().st_size for p in tmp_path.glob(".out.jsonl.*.tmp")):  # some lines written
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig and "Traceback" not in stderr, stderr[-3000:]
    kept = tmp_path / "out.partial.jsonl"
    rows = [json.loads(r) for r in kept.read_text().splitlines()]
    assert rows and all(r["correct"] is True for r in rows) and len(rows) < 6 * grade_cmd.CHUNK_LINES
    said = [ln for ln in stderr.splitlines() if ln.startswith("stopped by")]
    assert said == [f"stopped by {sig.name}: {len(rows)} line(s) graded, kept in {kept}; {out} was not written"], stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.partial.jsonl"]


def test_grading_into_a_log_prints_a_heartbeat_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text((json.dumps({"response": "\\boxed{2}", "answer": "2"}) + "\n") * 300)
    run = _grade_cli(src, "--workers", "1", "--heartbeat", "0.001")  # stderr is a pipe: no bar draws
    assert run.returncode == 0, run.stderr[-2000:]
    beats = [ln for ln in run.stderr.splitlines() if ln.startswith(f"grading {src}: ")]
    assert beats and beats[-1].split(": ")[1].split(" line(s) graded")[0].isdigit(), run.stderr[-2000:]
    counts = [int(b.split(": ")[1].split(" ")[0]) for b in beats]
    assert counts == sorted(counts) and counts[-1] <= 300
