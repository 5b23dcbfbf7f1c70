"""Every repository path that the README, the docs, CONTRIBUTING, docstrings, comments and configs
mention resolves, so a reference cannot silently rot when a file moves.

A mention is a token that starts with one of the repository's top-level folders (``trainers/...``,
``docs/lab.md``, ``tests/test_x.py::name``). With a file ending it must name an existing file (from
the root, or from the mentioning file's folder for Markdown links); a dotted module reference
(``models/cost.plan_figures``) must name a module; a bare folder (``trainers/run/``) must exist. A
bare token under ``rollout/`` that names nothing is a metric (``rollout/logp_diff_max``) and is skipped.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

EXTENSIONS = ("py", "md", "yaml", "yml", "json", "jsonl", "png", "sh", "sbatch", "toml", "txt", "parquet", "cfg")
SOURCES = ["README.md", "CONTRIBUTING.md", "docs/*.md", "examples/*", "*.py", "*.yaml", "Makefile", ".ci/run", "pyproject.toml"]
METRIC_NAMESPACES = ("rollout/",)  # folders whose name is also a metric prefix


def _top_folders(root: Path = REPO) -> list[str]:
    """The top-level folders git tracks: an untracked folder of the working tree (``outputs/`` that
    ``make run`` writes, ``mlruns/``) is no repository path, so a doc's ``outputs/...`` is never checked
    against what happens to lie on disk."""
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    tops = {rel.split("/", 1)[0] for rel in tracked if "/" in rel}
    return sorted(t for t in tops if not t.startswith(".") and t != "build") + [".ci"]


def _mentions(text: str) -> list[tuple[int, str]]:
    tops = "|".join(re.escape(t) for t in _top_folders())
    pattern = re.compile(rf"(?<![\w./~-])((?:{tops})/[\w./-]*[\w/])")
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if "tmp_path" in line:  # tests build throw-away trees under tmp_path
            continue
        out += [(number, m.group(1)) for m in pattern.finditer(line)]
    return out


def _resolves(token: str, where: Path) -> bool:
    token = token.split("::")[0]
    bases = [REPO, where.parent]
    ext = re.match(rf"^(.*?\.(?:{'|'.join(EXTENSIONS)}))(?:$|[^\w])", token)
    if ext:
        return any((b / ext.group(1)).is_file() for b in bases)
    if token.endswith("/"):
        return any((b / token).is_dir() for b in bases)
    module, _, _attr = token.partition(".")
    if any((b / module).is_dir() or (b / f"{module}.py").is_file() for b in bases):
        return True
    return token.startswith(METRIC_NAMESPACES) and "." not in token


def test_every_mentioned_repository_path_resolves():
    files = subprocess.run(["git", "ls-files", *SOURCES], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert "README.md" in files and any(f.startswith("docs/") for f in files)
    missing = []
    for rel in files:
        path = REPO / rel
        if not path.is_file() or rel == "tests/test_docs_paths.py":  # this file names wrong paths on purpose
            continue
        for number, token in _mentions(path.read_text(errors="replace")):
            if not _resolves(token, path):
                missing.append(f"{rel}:{number}: {token}")
        if rel.endswith(".md"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", line):
                    if not re.match(r"^[a-z]+:", target) and not (path.parent / target).exists():
                        missing.append(f"{rel}:{number}: link {target}")
    assert missing == [], "paths that name nothing:\n" + "\n".join(missing)


def test_untracked_folders_are_no_repository_paths(tmp_path):
    """``make run`` then ``make test``: the ``outputs/`` a run leaves is not a top folder to check."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("see outputs/eval/\n")
    (tmp_path / "outputs" / "eval").mkdir(parents=True)
    subprocess.run(["git", "add", "docs/a.md"], cwd=tmp_path, check=True)
    assert _top_folders(tmp_path) == ["docs", ".ci"]


def test_the_checker_catches_a_moved_file(tmp_path):
    assert _resolves("trainers/trainer.py", REPO / "README.md")
    assert _resolves("models/cost.plan_figures", REPO / "README.md")
    assert _resolves("trainers/run/", REPO / "README.md")
    assert not _resolves("trainers/no_such_file.py", REPO / "README.md")
    assert not _resolves("trainers/no_such_module.attr", REPO / "README.md")
    assert not _resolves("evals/sandbox.py", REPO / "README.md")  # moved to evals/code/
    assert _mentions("see `docs/lab.md` and (trainers/run/plots.py)") == [(1, "docs/lab.md"), (1, "trainers/run/plots.py")]
