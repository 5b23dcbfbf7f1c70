"""Documented commands run as written. A code block in the README, the docs or the examples that
follows the line ``<!-- runnable -->`` holds cheap commands (``entropyrl config show``, ``entropyrl
plan``: no training, no download); each of its ``entropyrl`` lines is run here and must exit 0.
Every documented ``entropyrl train``/``eval`` line that names ``model.gguf_file`` must compose (the
file itself is the user's)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKER = "<!-- runnable -->"
SOURCES = ["README.md", "docs/*.md", "examples/README.md"]


def _docs() -> list[Path]:
    return sorted({p for pattern in SOURCES for p in REPO.glob(pattern)})


def runnable_blocks(text: str) -> list[tuple[int, list[tuple[int, str]]]]:
    """``[(marker line, [(line number, command)])]``: the code block after each marker (fenced, or
    indented by four spaces), its non-blank lines. A marker with no code block after it is an
    empty list (the test names it)."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        block = []
        if j < len(lines) and lines[j].lstrip().startswith("```"):
            j += 1
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                if lines[j].strip():
                    block.append((j + 1, lines[j].strip()))
                j += 1
        else:
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                if lines[j].strip():
                    block.append((j + 1, lines[j].strip()))
                j += 1
        out.append((i + 1, block))
    return out


def _commands() -> list[tuple[str, str]]:
    found = []
    for path in _docs():
        for marker, block in runnable_blocks(path.read_text(encoding="utf-8")):
            rel = path.relative_to(REPO)
            if not block:
                found.append((f"{rel}:{marker}", ""))
            found += [(f"{rel}:{n}", cmd) for n, cmd in block]
    return found


COMMANDS = _commands()


def test_runnable_blocks_are_found_and_parsed():
    assert len(COMMANDS) >= 3, COMMANDS
    text = f"x\n{MARKER}\n```bash\nentropyrl plan a=1   # note\n\nentropyrl config show\n```\n{MARKER}\n\n    entropyrl config show b=2\nafter\n{MARKER}\nprose\n"
    assert runnable_blocks(text) == [
        (2, [(4, "entropyrl plan a=1   # note"), (6, "entropyrl config show")]),
        (8, [(10, "entropyrl config show b=2")]),
        (12, []),
    ]


@pytest.mark.parametrize("where, command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_runnable_documented_command_runs_as_written(where, command, tmp_path):
    assert command, f"{where}: {MARKER} is not followed by a code block"
    words = shlex.split(command, comments=True)
    assert words[0] == "entropyrl", f"{where}: a runnable block holds entropyrl commands only: {command}"
    run = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", *words[1:]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert run.returncode == 0, f"{where}: `{command}` exited {run.returncode}: {(run.stderr or run.stdout)[-1500:]}"
    assert "Traceback" not in run.stderr


def _gguf_lines() -> list[tuple[str, str]]:
    pattern = re.compile(r"^\s*(entropyrl (?:train|eval)\b.*model\.gguf_file=.*)$")
    return [
        (f"{p.relative_to(REPO)}:{n}", m.group(1))
        for p in _docs()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if (m := pattern.match(line))
    ]


GGUF_LINES = _gguf_lines()


def test_gguf_lines_are_found():
    assert any("docs/real-model.md" in w for w, _ in GGUF_LINES), GGUF_LINES


@pytest.mark.parametrize("where, command", GGUF_LINES, ids=[w for w, _ in GGUF_LINES])
def test_a_documented_gguf_command_composes(where, command):
    from entropyrl.conf import compose

    words = shlex.split(command, comments=True)
    overrides = [w for w in words[2:] if "=" in w and not w.startswith("-") and w != "..."]
    gguf = next(w.split("=", 1)[1] for w in overrides if w.startswith("model.gguf_file="))
    cfg = compose("train" if words[1] == "train" else "eval", overrides)
    assert cfg.model.gguf_file == gguf, where
