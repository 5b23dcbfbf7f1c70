"""``entropyrl grade FILE.jsonl [--out OUT.jsonl]``: grade responses already written to a file.

Each input line is a JSON object with ``response`` (the model's text) and ``answer`` (the gold
answer: a string, a number or a list of strings); other fields are kept. Each output line adds
``correct`` (bool), ``extracted`` (the answer found in the response, or null) and ``reason`` (which
step decided: see ``entropyrl.evals.grading.grader.REASONS``); the summary line counts the reasons. A malformed
line (bad JSON, missing or non-string ``response``, missing ``answer``) is reported on stderr with
its line number and left out of the output; the other lines are still graded.

Code lines (``evals/code/code_tasks.py``) are graded by running them in the code sandbox
(``evals/code/sandbox.py``): a line with ``prompt``, ``test``, ``entry_point`` (HumanEval layout; or
MBPP's ``text`` + ``test_list``) and ``response`` (a fenced block, a bare completion of the prompt,
or a whole function), or with ``benchmark`` (humaneval, mbpp, livecodebench) and ``id`` naming a
problem. Each output line adds ``program`` (what ran), ``correct``, ``reason`` (pass, fail, error,
timeout, memory, output_limit, killed, sandbox_error), ``tests_passed``/``tests_total``,
``seconds``, ``detail`` and ``stdout_tail``.

Every output line also carries a ``reflection`` block (``evals/reflection.py``): ``count`` (matches
of the reflection word list in the response), ``density`` (per 1,000 whitespace-separated words:
the file holds no token ids, so ``unit`` says ``words``), ``tokens`` and ``unit``; the summary
prints the share of lines that reflect. ``--reflection-words`` names a list (default, orz,
oat_zero), gives comma-separated words, or ``none`` (no block).


The file is read and graded ``CHUNK_LINES`` lines at a time, each chunk's results written before
the next is read, so memory does not grow with the file. Bytes that are not UTF-8 are refused as
``data.path`` refuses them (``evals/benchmarks.read_rows``): the line is named with the byte and its
column, and is left out of the output like any malformed line -- never graded with the bytes
replaced.

A stop before the end (Ctrl-C, SIGTERM, a grading pool that broke) never leaves a half output
file: the lines graded so far move to ``<out>.partial.jsonl`` and one line says so (exit status
128 + the signal's number after a signal).

Exit status: 0 when every line was graded; 1 when some lines were skipped as malformed (the others
are graded and written; ``--allow-skipped`` exits 0 then); 2 when nothing could be graded (missing
file, no valid line). The first ``SHOWN_BAD`` malformed lines are named, the rest counted (a binary
file is one line of count, not thousands).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import typer

from ..core.errors import UserError
from ..core.files import atomic_path, same_file
from ..core.validation import check_output_file
from ..evals.benchmarks import gold_from
from ..evals.code.code_tasks import is_code_row
from ..evals.code.sandbox import SandboxPool
from ..evals.grading.grader import grade_batch
from ..evals.grading.grader_pool import GradingPoolError
from ..evals.reflection import WORD_LISTS, matcher_for, reflection_block, resolve_words
from .common import exit_stopped, stop_signals
from .grade_watch import GradingInterrupted, Heartbeat, kept_when_stopped

#: Malformed lines named one by one on stderr; the rest are counted in one line.
SHOWN_BAD = 5
#: Lines read and graded together: what bounds the command's memory, whatever the file's size.
CHUNK_LINES = 2048


def not_utf8(raw: bytes, exc: UnicodeDecodeError, path: Path) -> str:
    """The problem of a line whose bytes are not UTF-8, worded as ``data.path`` words it: the byte,
    its column (1-based, in bytes) and how to re-encode the file."""
    return (
        f"byte 0x{raw[exc.start]:02x} (column {exc.start + 1}) is not UTF-8: re-encode the file as UTF-8 "
        f"(e.g. iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix})"
    )


def _problem(obj) -> str | None:
    """Why a parsed line cannot be graded (None when it can)."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    if not isinstance(obj.get("response"), str):
        return "no string field 'response'" if "response" in obj else "missing field 'response'"
    if is_code_row(obj):  # graded by running it: evals/code/sandbox.py
        return None
    if obj.get("answer") is None or isinstance(obj["answer"], (dict, bool)):
        return "missing field 'answer'" if "answer" not in obj else "field 'answer' is not a string, number or list"
    return None


def iter_items(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """``(line number, object, None)`` for each gradable line of a JSON-lines file and
    ``(line number, None, problem)`` for each malformed one, read one line at a time (blank lines
    skipped)."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, None, not_utf8(raw, exc, path)
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, None, f"not valid JSON ({exc.msg} at column {exc.colno})"
                continue
            problem = _problem(obj)
            yield (lineno, None, problem) if problem else (lineno, obj, None)


def chunks(items: Iterator, size: int | None = None) -> Iterator[list]:
    """``items`` in lists of at most ``size`` (default ``CHUNK_LINES``)."""
    size = size or CHUNK_LINES
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _grade_code_lines(good: list, bad: list, pool, grade_code_rows, progress=None) -> tuple[list, list]:
    """Math lines stay in ``good``; code lines (HumanEval layout or benchmark + id) are run in the
    code sandbox by ``grade_code_rows`` (``evals/code/code_eval.py``, passed in by the command, which
    imports it when it runs) on the ``SandboxPool`` that ``pool()`` returns (made on first use):
    ``(line number, row + program, correct, reason, ...)``; unresolvable ones go to ``bad``.
    ``progress(k)``: called as programs finish (a chunk of programs can take minutes)."""

    code = [(n, o) for n, o in good if is_code_row(o)]
    if not code:
        return good, []
    records = grade_code_rows([o for _, o in code], pool(), progress=progress)
    out = []
    for (n, obj), rec in zip(code, records):
        if isinstance(rec, str):
            bad.append((n, rec))
        else:
            out.append((n, {**obj, **rec}))
    return [(n, o) for n, o in good if not is_code_row(o)], out


def reflection_words(option: str) -> tuple[str, ...]:
    """``--reflection-words``: a list name, comma-separated words, or ``none``."""
    option = option.strip()
    if option.lower() in ("none", ""):
        return ()
    if option in WORD_LISTS:
        return resolve_words(option, "--reflection-words")
    return resolve_words([w for w in option.split(",") if w.strip()] or [option], "--reflection-words")


def gold_text(answer) -> str:
    return gold_from(answer, "list" if isinstance(answer, list) else "field")


GRADE_HELP = (
    "Grade a JSON-lines file of model responses: each line needs [bold]response[/bold] and "
    "[bold]answer[/bold]; the output adds [bold]correct[/bold] and [bold]extracted[/bold]. "
    "Malformed lines are skipped: the first few named with their line number, the rest counted.\n\n"
    "Code lines ([bold]prompt/test/entry_point[/bold] + response, or [bold]benchmark/id[/bold] + "
    "response) run in the code sandbox; the output adds program, correct and reason.\n\n"
    "[cyan]entropyrl grade samples.jsonl --out graded.jsonl[/cyan]\n\n"
    "Exit status: 0 if every line was graded, 1 if malformed lines were skipped "
    "(0 with --allow-skipped), 2 if none could be; stopped (Ctrl-C, SIGTERM): the lines graded so "
    "far in OUT.partial.jsonl."
)


@dataclass
class _Tally:
    """What the grading of one file counted so far: the summary lines and the exit status read it."""

    bad: int = 0
    graded: int = 0
    correct: int = 0
    reflecting: int = 0
    matches: int = 0
    reasons: Counter = field(default_factory=Counter)

    def add(self, row: dict, reflection: dict | None) -> None:
        """Count one graded line and its reflection block (None when reflection is not counted)."""
        if reflection is not None:
            self.reflecting += reflection["count"] > 0
            self.matches += reflection["count"]
        self.graded += 1
        self.correct += bool(row["correct"])
        self.reasons[row["reason"]] += 1


def _checked_target(file: Path, out: Path | None, workers: int | None, timeout: float) -> Path:
    """The output file, once the input file and the options are known to be usable: every refusal
    comes before minutes of grading, not after."""
    if file.is_dir():
        raise UserError(
            f"{file} is a folder: give a .jsonl file in it with response and answer fields "
            f"(e.g. an eval's {file / 'samples.jsonl'})"
        )
    if not file.is_file():
        raise UserError(f"{file}: no such file (give a .jsonl with response and answer fields)")
    if timeout <= 0:
        raise UserError(f"--timeout must be > 0 seconds, got {timeout}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be >= 1 (or left out: one per CPU), got {workers}")
    target = out or file.with_name(file.name.removesuffix(".jsonl") + ".graded.jsonl")
    if same_file(target, file):  # by inode: also through ../, a symlink or a hard link
        raise UserError(
            f"--out {target} is the input file {file}: grading would overwrite it; "
            f"give another --out (default: {file.name.removesuffix('.jsonl')}.graded.jsonl)"
        )
    check_output_file(target, "--out")
    return target


def _grade_math_lines(good: list, *, file: Path, target: Path, graded: int, workers, timeout: float, progress) -> list:
    """The math lines' ``grade_batch`` results, in order; a grading pool that broke is one
    ``UserError`` (raised inside the output's ``atomic_path``: nothing is written)."""
    if not good:
        return []
    try:
        return grade_batch(
            [o["response"] for _, o in good],
            [gold_text(o["answer"]) for _, o in good],
            workers=workers,
            timeout=timeout,
            progress=progress,
        )
    except GradingPoolError as exc:
        raise UserError(
            f"{file}: grading stopped after {graded} line(s): {exc}; {target} was not written "
            f"(run it again; check that math-verify imports in {sys.executable})"
        ) from None


def _graded_rows(good: list, results: list, code_lines: list) -> list[dict]:
    """The chunk's graded rows in line order: math lines with ``correct``, ``extracted`` and
    ``reason`` added, code lines as the sandbox left them."""
    lines = sorted(
        [(n, {**obj, "correct": r.correct, "extracted": r.extracted, "reason": r.reason}) for (n, obj), r in zip(good, results)]
        + code_lines,
        key=lambda item: item[0],
    )
    return [row for _, row in lines]


def _grade_file(
    file: Path, target: Path, *, workers, timeout: float, matcher, err, grade_code_rows, heartbeat_s: float
) -> _Tally:
    """Grade ``file`` one chunk at a time into ``target`` (written whole or not at all), naming the
    first ``SHOWN_BAD`` malformed lines on ``err`` as they are found and counting the rest."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    tally = _Tally()
    pools: list = []

    def pool():
        if not pools:
            pools.append(SandboxPool(workers=workers))
        return pools[0]

    with (
        atomic_path(target) as tmp,  # whole or not at all
        open(tmp, "w", encoding="utf-8") as sink,
        Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), console=err, transient=True) as bar,
        kept_when_stopped(tmp, target, sink, lambda: tally.graded),
    ):
        task = bar.add_task("grade", total=None)
        beat = Heartbeat(err, file, heartbeat_s)
        for chunk in chunks(iter_items(file)):
            good, bad = [(n, o) for n, o, p in chunk if p is None], [(n, p) for n, o, p in chunk if p is not None]
            shown = lambda k: (bar.advance(task, k), beat.advance(k))  # noqa: E731
            good, code_lines = _grade_code_lines(good, bad, pool, grade_code_rows, progress=shown)
            for lineno, problem in sorted(bad):
                tally.bad += 1
                if tally.bad <= SHOWN_BAD:  # named as found; the rest counted at the end
                    err.print(f"[yellow]skipped[/yellow]: {file}:{lineno}: {problem}", highlight=False)
            results = _grade_math_lines(
                good,
                file=file,
                target=target,
                graded=tally.graded,
                workers=workers,
                timeout=timeout,
                progress=shown,
            )
            for row in _graded_rows(good, results, code_lines):
                reflection = reflection_block(row["response"], matcher) if matcher.enabled else None
                if reflection is not None:
                    row["reflection"] = reflection
                sink.write(json.dumps(row) + "\n")
                tally.add(row, reflection)  # after the write: a stop between the two keeps what is counted
        if tally.bad > SHOWN_BAD:
            err.print(
                f"[yellow]skipped[/yellow]: {tally.bad - SHOWN_BAD} more malformed line(s) of {file} (not shown)",
                highlight=False,
            )
        if not tally.graded:  # raised inside: the output file is not written
            raise UserError(f"{file}: no line could be graded ({tally.bad} malformed); each line needs 'response' and 'answer'")
    return tally


def _print_summary(tally: _Tally, target: Path, matcher) -> None:
    """The summary lines on stdout: accuracy, the reflection share (when counted) and the reasons."""
    from rich.console import Console

    n_graded, n_bad, correct = tally.graded, tally.bad, tally.correct
    Console(soft_wrap=True).print(
        f"graded [bold]{n_graded}[/bold] lines: accuracy [bold]{correct / n_graded:.4f}[/bold] "
        f"({correct}/{n_graded})" + (f", [red]{n_bad} malformed line(s) skipped[/red]" if n_bad else "") + f" -> {target}",
        highlight=False,
    )
    if matcher.enabled:
        Console(soft_wrap=True).print(
            f"reflection: {tally.reflecting}/{n_graded} lines hold a reflection word ({tally.matches} matches)",
            highlight=False,
        )
    Console(soft_wrap=True).print("reasons: " + ", ".join(f"{k} {v}" for k, v in tally.reasons.most_common()), highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("grade", help=GRADE_HELP)
    def grade(
        file: Path = typer.Argument(..., help="input .jsonl with response and answer fields"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="output .jsonl (default: FILE with .graded.jsonl)"),
        workers: Optional[int] = typer.Option(None, help="grading processes (default: one per CPU)"),
        timeout: float = typer.Option(5.0, help="seconds per response, enforced by killing the worker"),
        reflection: str = typer.Option(
            "default",
            "--reflection-words",
            help="reflection words counted per line (its reflection block): default, orz, oat_zero, comma-separated words, or none",
        ),
        heartbeat_s: float = typer.Option(
            30.0, "--heartbeat", help="with stderr not a terminal (a log): a progress line this often, in seconds"
        ),
        allow_skipped: bool = typer.Option(
            False, "--allow-skipped", help="exit 0 even when malformed lines were skipped (default: exit 1)"
        ),
        strict: bool = typer.Option(
            False, "--strict", hidden=True, help="exit 1 when any line is malformed (the default now; kept for old scripts)"
        ),
    ) -> None:
        from rich.console import Console

        from ..evals.code.code_eval import grade_code_rows  # loads torch: only when the command runs

        err = Console(stderr=True, soft_wrap=True)
        target = _checked_target(file, out, workers, timeout)
        matcher = matcher_for(reflection_words(reflection))
        with stop_signals() as stopped_by:  # SIGINT and SIGTERM alike: the graded lines kept, one line
            try:
                tally = _grade_file(
                    file,
                    target,
                    workers=workers,
                    timeout=timeout,
                    matcher=matcher,
                    err=err,
                    grade_code_rows=grade_code_rows,
                    heartbeat_s=heartbeat_s,
                )
            except GradingInterrupted as stop:
                where = f"kept in {stop.kept}" if stop.kept else "none graded yet"
                exit_stopped(err, stopped_by, f"{stop.graded} line(s) graded, {where}; {target} was not written")
        _print_summary(tally, target, matcher)
        if tally.bad and not allow_skipped:
            err.print(
                f"[red]error[/red]: {tally.bad} malformed line(s) of {file} were skipped (the other "
                f"{tally.graded} are in {target}): fix them, or pass --allow-skipped to accept",
                highlight=False,
            )
            raise typer.Exit(1)
