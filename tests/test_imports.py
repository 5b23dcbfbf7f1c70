"""The package's import graph: no cycle between modules, and layers that point one way
(cli -> sweeps -> trainers -> rewards -> evals -> the base: rollout -> models -> tasks -> conf -> core)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP = {"tests", "perf", "build", "docs", "data", "examples"}
# Higher imports lower, never the reverse. The base (below evals) is ordered too.
LAYER = {
    "cli": 90,
    "sweeps": 80,
    "trainers": 70,
    "rewards": 65,
    "evals": 60,
    "rollout": 40,
    "models": 30,
    "tasks": 20,
    "conf": 10,
    "core": 0,
}


def _ignored_top_folders(root: Path = REPO) -> set[str]:
    """Top-level folders git ignores (``outputs/``, ``mlruns/``): what a run leaves in the working tree
    is no part of the package, whatever files it holds."""
    listed = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {entry.rstrip("/") for entry in listed if entry.count("/") == 1 and entry.endswith("/")}


def _modules() -> dict[str, Path]:
    out = {}
    skip = SKIP | _ignored_top_folders()
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[0] in skip or any(p.startswith(".") for p in rel.parts):
            continue
        parts = ("entropyrl",) + rel.with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Every import of a package module, at module top or inside a function."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            edges[mod].update(t for t in targets if t in mods and t != mod)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _layer(mod: str) -> int:
    parts = mod.split(".")
    if len(parts) == 1:
        return 0  # the root __init__ (the layer map) imports nothing of the package
    if parts[1] not in LAYER:
        raise AssertionError(f"{mod}: top-level folder {parts[1]!r} has no layer in LAYER; add it")
    return LAYER[parts[1]]


def test_the_graph_sees_the_package():
    mods = _modules()
    assert {
        "entropyrl.cli.main",
        "entropyrl.trainers.trainer",
        "entropyrl.evals.grading.grader",
        "entropyrl.sweeps.planning",
        "entropyrl.core.errors",
        "entropyrl.rollout.base",
    } <= set(mods)
    assert sum(len(v) for v in _edges(mods).values()) > 100


def test_no_import_cycle_between_modules():
    assert _cycles(_edges(_modules())) == []


def test_layers_point_one_way():
    edges = _edges(_modules())
    upward = sorted(f"{m} -> {t}" for m, ts in edges.items() for t in ts if _layer(t) > _layer(m))
    assert upward == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _cli_command_bodies(mod: str, tree: ast.Module) -> set[int]:
    """``id`` of every import statement inside a CLI command body: a function nested in a cli/
    module's ``register(app)`` (where the Typer commands are declared). The one stated exception to
    imports at module top: a command imports its implementation (torch, transformers, MLflow) when
    it runs, so that ``entropyrl --help`` starts at once; likewise the entry point ``cli/main.py``'s
    ``main`` imports the Typer app only when the quick help screens do not answer."""
    if not mod.startswith("entropyrl.cli."):
        return set()
    found = set()
    for top in tree.body:
        if mod == "entropyrl.cli.main" and isinstance(top, ast.FunctionDef) and top.name == "main":
            found.update(id(n) for n in ast.walk(top) if isinstance(n, (ast.Import, ast.ImportFrom)))
        if isinstance(top, ast.FunctionDef) and top.name == "register":
            for command in ast.walk(top):
                if command is not top and isinstance(command, ast.FunctionDef):
                    found.update(id(n) for n in ast.walk(command) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return found


def _imports_inside_functions(mods: dict[str, Path]) -> list[str]:
    """``module:line -> target`` for every import of a package module that is not at module top
    (CLI command bodies aside: ``_cli_command_bodies``). Such imports hide edges from a reader (and
    hid cycles before this test existed); a heavy optional dependency (vLLM) is loaded lazily
    through the rollout registry's "module:Class" strings, not by an import statement."""
    found = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        allowed = {id(node) for node in tree.body} | _cli_command_bodies(mod, tree)
        for node in ast.walk(tree):
            if id(node) in allowed or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else ["." * node.level + (node.module or "")]
            if any(n.startswith(("entropyrl", ".")) for n in names):
                found.append(f"{mod}:{node.lineno} -> {names[0]}")
    return found


def test_package_imports_sit_at_module_top():
    assert _imports_inside_functions(_modules()) == []


def test_function_level_import_finder_finds_one(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\ndef f():\n    from entropyrl.errors import UserError\n")
    assert _imports_inside_functions({"entropyrl.m": tmp_path / "m.py"}) == ["entropyrl.m:4 -> entropyrl.errors"]


def test_only_cli_command_bodies_may_import_inside_functions(tmp_path):
    (tmp_path / "c.py").write_text(
        "def helper():\n    from ..trainers import trainer\n\n"
        "def register(app):\n    from ..conf import compose\n\n"
        "    @app.command('x')\n    def x():\n        from ..trainers import trainer\n"
    )
    paths = {"entropyrl.cli.c": tmp_path / "c.py", "entropyrl.evals.c": tmp_path / "c.py"}
    assert _imports_inside_functions(paths) == [
        "entropyrl.cli.c:2 -> ..trainers",
        "entropyrl.cli.c:5 -> ..conf",  # a helper; register's own body
        "entropyrl.evals.c:2 -> ..trainers",
        "entropyrl.evals.c:5 -> ..conf",
        "entropyrl.evals.c:9 -> ..trainers",
    ]


HEAVY = ("torch", "transformers", "mlflow", "matplotlib")


def _heavy_modules_loaded(code: str) -> list[str]:
    """The heavy libraries (``HEAVY``) in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    import json
    import subprocess
    import sys

    probe = code + f"\nimport sys, json\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_cli_imports_no_heavy_library():
    assert _heavy_modules_loaded("import entropyrl.cli.main") == []
    run = (
        "from entropyrl.cli.main import main\nimport contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main({args!r})\n    except SystemExit as e:\n        assert e.code in (0, None), e.code\n"
    )
    for args in (["--help"], ["train", "--help"], ["config", "show"], ["config", "show", "algo=stare"]):
        assert _heavy_modules_loaded(run.format(args=args)) == [], args


def test_the_heavy_library_check_sees_one():
    assert _heavy_modules_loaded("import matplotlib") == ["matplotlib"]


def _absolute_self_imports(mods: dict[str, Path]) -> list[str]:
    """``module:line`` for every ``import entropyrl...`` / ``from entropyrl... import`` inside the
    package. The package imports itself relatively, so that a tool that maps a file to its module
    from the path alone (the repository folder is not named ``entropyrl``) resolves every edge."""
    found = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "entropyrl":
                found.append(f"{mod}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "entropyrl" for a in node.names):
                found.append(f"{mod}:{node.lineno}")
    return found


def test_the_package_imports_itself_relatively():
    assert _absolute_self_imports(_modules()) == []


def test_every_top_level_folder_has_a_layer():
    for mod in _modules():
        _layer(mod)


def test_the_repository_folders_beside_the_package_do_not_import():
    import importlib

    import pytest

    for name in ("entropyrl.tests", "entropyrl.docs", "entropyrl.data", "entropyrl.perf", "entropyrl.examples"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)


def test_ignored_folders_of_the_working_tree_are_no_package(tmp_path):
    """``make run`` leaves ``outputs/``; a ``.py`` a run writes there is not a package folder without a layer."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("outputs/\n")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "rewards.py").write_text("x = 1\n")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "a.py").write_text("x = 1\n")
    assert _ignored_top_folders(tmp_path) == {"outputs"}
