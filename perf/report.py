"""The measured sections of ``docs/performance.md`` and the keys of ``bench-results.json``, one per
benchmark suite.

Each suite owns one top-level key of ``bench-results.json`` (its module's name) and one section of
the page, between ``<!-- bench:<suite>:begin -->`` and ``<!-- bench:<suite>:end -->``. Recording a
suite's result (``record``) merges its key into the JSON file and rewrites its section only, so a
run of one suite never touches another suite's figures, in the file or on the page; everything
outside the markers (the prose, the headings between sections, the shared machine line above the
tables) is the page's own and is never rewritten. A page without a suite's markers is an error
that names the two lines to add (the suite's table goes where its author puts them; nothing is
appended). A suite's section is its module's ``render(result)`` where it has one (``perf/peers.py``),
else a ``| result | value |`` table of its scalar results (nested ones dotted).

``make bench`` records each suite as it finishes (``perf/run.py``); by hand, to rewrite the sections
of the suites in a results file (all of them, or those named)::

    .venv/bin/python perf/report.py [bench-results.json] [docs/performance.md] [SUITE ...]
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "bench-results.json"
PAGE = HERE.parent / "docs" / "performance.md"
MACHINE = "_machine"  # a suite's result: the machine it ran on (not a table row)


def markers(suite: str) -> tuple[str, str]:
    """The begin and end marker lines of ``suite``'s section of the page."""
    return f"<!-- bench:{suite}:begin -->", f"<!-- bench:{suite}:end -->"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _flat(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), inner, out)
    elif isinstance(value, (int, float, str, bool)) or value is None:
        out[prefix] = value


def render_suite(suite: str, result: dict) -> str:
    """Markdown for a suite without its own renderer: its heading, the machine it ran on (where the
    result records it), then one ``| result | value |`` row per scalar result (nested ones dotted)."""
    lines = [f"### `{suite}`", ""]
    machine = result.get(MACHINE)
    if isinstance(machine, dict):
        lines += [
            f"Machine: {machine.get('cpus', '?')} CPUs, Python {machine.get('python', '?')}, {machine.get('platform', '?')}.",
            "",
        ]
    flat: dict = {}
    _flat("", {k: v for k, v in result.items() if k != MACHINE}, flat)
    lines += ["| result | value |", "| --- | --- |"]
    lines += [f"| `{key}` | {_cell(value)} |" for key, value in flat.items()]
    return "\n".join(lines) + "\n"


def _replace_between(text: str, begin: str, end: str, body: str, page: Path) -> str:
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{page}: needs one {begin} and one {end} line around the generated section")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}{end}{tail}"


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, so an interrupted write never
    leaves half a page or half a JSON file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_section(page: Path, body: str, begin: str, end: str) -> None:
    """Replace what lies between ``begin`` and ``end`` in ``page`` with ``body`` (the markers must
    be there, once each, in that order); the rest of the page is kept byte for byte."""
    _write_atomic(page, _replace_between(page.read_text(), begin, end, body, page))


def check_sections(page: Path, suites: list[str]) -> None:
    """Raise (one line naming the marker lines to add) unless ``page`` has one section per suite;
    ``perf/run.py`` checks before it spends minutes measuring."""
    text = page.read_text()
    for suite in suites:
        begin, end = markers(suite)
        _replace_between(text, begin, end, "", page)


def write_suite(page: Path, suite: str, body: str) -> None:
    """Replace ``suite``'s section of ``page`` with ``body``; every other section stays as it is."""
    write_section(page, body, *markers(suite))


def merge_results(path: Path, suite: str, result: dict) -> dict:
    """Set ``suite``'s key of the results file at ``path`` to ``result`` (creating the file where
    there is none); every other key keeps its value and its place. Returns the merged results."""
    results = json.loads(path.read_text()) if path.exists() else {}
    results[suite] = result
    _write_atomic(path, json.dumps(results, indent=2) + "\n")
    return results


def record(results_path: Path, page: Path, suite: str, result: dict, render: Callable[[dict], str] | None = None) -> None:
    """Merge ``suite``'s ``result`` into the results file, then rewrite its section of ``page``
    (``render(result)``, default ``render_suite``). The file is written first, so a page without the
    suite's markers still keeps the measured result; the error then says how to regenerate."""
    body = render(result) if render else render_suite(suite, result)
    merge_results(results_path, suite, result)
    try:
        write_suite(page, suite, body)
    except SystemExit as missing:
        raise SystemExit(
            f"{missing}; {results_path} has the result: add the markers, then run perf/report.py {results_path} {page} {suite}"
        ) from None


def renderer(suite: str) -> Callable[[dict], str] | None:
    """``perf/<suite>.py``'s own ``render`` where it defines one, else None (the default table)."""
    path = HERE / f"{suite}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"entropyrl_bench_{suite}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "render", None)


def write(results: dict, page: Path, suites: list[str] | None = None) -> None:
    """Rewrite the sections of ``suites`` (default: every suite key of ``results``) from
    ``results``; the sections of the suites not named are left as they are."""
    names = suites or [key for key in results if not key.startswith("_")]
    absent = [name for name in names if name not in results]
    if absent:
        raise SystemExit(f"no results for {', '.join(absent)}: run `perf/run.py {' '.join(absent)}` first")
    check_sections(page, names)
    for suite in names:
        render = renderer(suite)
        write_suite(page, suite, render(results[suite]) if render else render_suite(suite, results[suite]))


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    target = Path(sys.argv[2]) if len(sys.argv) > 2 else PAGE
    write(json.loads(source.read_text()), target, sys.argv[3:] or None)
    print(f"wrote {target}")
