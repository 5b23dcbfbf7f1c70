"""The package's import graph: no cycle between modules, and layers that point one way
(cli -> sweeps -> trainers -> rewards -> evals -> the base: rollout -> models -> tasks -> conf -> core)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP = {"tests", "perf", "build", "docs", "data", "examples"}
# Higher imports lower, never the reverse. The base (below evals) is ordered too.
LAYER = {"cli": 90, "sweeps": 80, "trainers": 70, "rewards": 65, "evals": 60,
         "rollout": 40, "models": 30, "tasks": 20, "conf": 10, "core": 0}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[0] in SKIP or any(p.startswith(".") for p in rel.parts):
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
        return 0           # the root __init__ (the layer map) imports nothing of the package
    if parts[1] not in LAYER:
        raise AssertionError(f"{mod}: top-level folder {parts[1]!r} has no layer in LAYER; add it")
    return LAYER[parts[1]]


def test_the_graph_sees_the_package():
    mods = _modules()
    assert {"entropyrl.cli.main", "entropyrl.trainers.trainer", "entropyrl.evals.grading.grader",
            "entropyrl.sweeps.planning", "entropyrl.core.errors", "entropyrl.rollout.base"} <= set(mods)
    assert sum(len(v) for v in _edges(mods).values()) > 100


def test_no_import_cycle_between_modules():
    assert _cycles(_edges(_modules())) == []


def test_layers_point_one_way():
    edges = _edges(_modules())
    upward = sorted(f"{m} -> {t}" for m, ts in edges.items() for t in ts if _layer(t) > _layer(m))
    assert upward == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _imports_inside_functions(mods: dict[str, Path]) -> list[str]:
    """``module:line -> target`` for every import of a package module that is not at module top.
    Such imports hide edges from a reader (and hid cycles before this test existed); a heavy
    optional dependency (vLLM) is loaded lazily through the rollout registry's "module:Class"
    strings, not by an import statement."""
    found = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if id(node) in top or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else ["." * node.level + (node.module or "")])
            if any(n.startswith(("entropyrl", ".")) for n in names):
                found.append(f"{mod}:{node.lineno} -> {names[0]}")
    return found


def test_package_imports_sit_at_module_top():
    assert _imports_inside_functions(_modules()) == []


def test_function_level_import_finder_finds_one(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\ndef f():\n    from entropyrl.errors import UserError\n")
    assert _imports_inside_functions({"entropyrl.m": tmp_path / "m.py"}) == ["entropyrl.m:4 -> entropyrl.errors"]


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
