"""Sizes that show the shape: no module of the package over 400 lines and no function over 80, or a
one-line reason where one is. A module says why at its top (a ``# size: <reason>`` comment before its
first import); a function says why on the line above its ``def`` (above its decorators, if any)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULE_LINES = 400
FUNCTION_LINES = 80
REASON = "# size:"
NOT_PACKAGE = {"tests", "build", "docs", "data", "examples"}


def _package_files(root: Path = REPO) -> list[Path]:
    """The package's python files that git tracks (what a user clones), tests and docs left out."""
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True).stdout
    return [root / p for p in listed.split() if p.split("/", 1)[0] not in NOT_PACKAGE]


def module_reason(text: str) -> str | None:
    """The ``# size:`` reason among the lines before the module's first import, if any."""
    imports = [n.lineno for n in ast.parse(text).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    head = text.splitlines()[: min(imports) - 1] if imports else text.splitlines()
    for line in head:
        stripped = line.strip()
        if stripped.startswith(REASON) and stripped[len(REASON) :].strip():
            return stripped[len(REASON) :].strip()
    return None


def function_reason(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The ``# size:`` reason on the line above the function (above its decorators), if any."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    above = lines[first - 2].strip() if first >= 2 else ""
    return above[len(REASON) :].strip() or None if above.startswith(REASON) else None


def oversized(path: Path, root: Path = REPO) -> list[str]:
    """What in ``path`` is over its size with no reason given: one line per module or function."""
    text = path.read_text()
    lines = text.splitlines()
    rel = path.relative_to(root)
    out = []
    if len(lines) > MODULE_LINES and module_reason(text) is None:
        out.append(f"{rel}: {len(lines)} lines (> {MODULE_LINES})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES and function_reason(lines, node) is None:
                out.append(f"{rel}:{node.lineno} {node.name}: {length} lines (> {FUNCTION_LINES})")
    return out


def test_no_module_or_function_is_over_its_size_without_a_reason():
    found = [entry for path in _package_files() for entry in oversized(path)]
    assert not found, "split these, or say why on a `# size:` line:\n" + "\n".join(found)


def test_the_size_check_sees_an_oversized_function_and_reads_its_reason(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    probe = tmp_path / "probe.py"
    probe.write_text(f"def long_one():\n{body}\n")
    assert [e.split(": ", 1)[0] for e in oversized(probe, tmp_path)] == ["probe.py:1 long_one"]
    probe.write_text(f"# size: one table of cases, read top to bottom\ndef long_one():\n{body}\n")
    assert oversized(probe, tmp_path) == []
    probe.write_text(f"# size:\ndef long_one():\n{body}\n")  # a marker with no reason is none
    assert len(oversized(probe, tmp_path)) == 1


def test_the_size_check_reads_a_modules_reason_only_above_its_imports():
    doc = '"""doc,\nfrom its first line\nimport-free."""\n'  # prose lines that start like imports
    assert module_reason(doc + "# size: one registry of every option\nimport os\n") == "one registry of every option"
    assert module_reason(doc + "import os\n# size: too late\n") is None
