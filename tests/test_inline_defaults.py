"""No config key carries a default in the code: each is declared once, in the YAML under ``conf/``
(or in a typed settings dataclass whose defaults a test holds equal to the YAML, as
``rollout/settings.py`` and ``trainers/collect.py`` do). A literal default beside a read, such as
``cfg.trainer.get("dtype", "float32")``, can disagree with the YAML silently: the composed config
always has the key, so the literal only ever acts for a hand-built config, which then runs with
other settings than ``entropyrl train`` would.

The test walks the package's modules with ``ast`` and finds the reads of a config key with a literal
default (``None`` and empty containers included): ``<recv>.get("<key>", <literal>)``,
``cfg_get(<recv>, "<key>", <literal>)`` and ``getattr(<recv>, "<key>", <literal>)``, where ``<key>``
is a key name of a composed primary config (``train``, ``eval``, ``sweep``) and ``<recv>`` is a
config: a name or attribute in it says so (``cfg``, ``conf``, ``section``, ``settings``), or it is
a local name the same function bound to such an expression (``ev = cfg.eval``). Dict reads of
model outputs, metrics and stored records (a sweep's saved ``sweep.json``, a checkpoint's state)
are not config reads: their receivers carry none of those names; nor is an item looked up by a
computed key (``groups[id(p)]``).

A key the composed config always has is read as it is (``cfg.trainer.dtype``, ``section["dtype"]``
where a plain dict may come); an optional key whose absence means "none" (``model.stop_tokens``,
a preset without it) is read with ``.get(key)``, no default to disagree with; a section built by
hand elsewhere gets its defaults from a typed settings class (``ToolSettings``,
``TrackingSettings``; the last is held equal to the YAML below).

Left out: ``tests/`` (they build partial configs on purpose), ``examples/`` and ``perf/``
(standalone scripts and benchmark harnesses that build their own configs, not the package's
run path), ``docs/``, ``data/`` and ``build/`` (no package code).

``KNOWN`` lists the reads that remain, by module and key name; it may only shrink: a read not in it
fails, and so does an entry that no longer occurs.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
from pathlib import Path

from omegaconf import OmegaConf

from entropyrl.conf import CONF_DIR, compose
from entropyrl.core.tracking import TrackingSettings

REPO = Path(__file__).resolve().parents[1]
NOT_PACKAGE = {"tests", "examples", "perf", "docs", "data", "build"}
CONFIG_WORDS = ("cfg", "conf", "section", "settings")
READERS = {"cfg_get", "getattr"}

#: The reads with an inline default that remain: ``{module: {key, ...}}``, each with why (none today).
KNOWN: dict[str, set[str]] = {}


def _package_files() -> list[str]:
    """The package's python files (tracked, or new and not ignored), relative to the repository."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({p for p in listed.split() if p.split("/", 1)[0] not in NOT_PACKAGE and (REPO / p).exists()})


def _key_names(node, out: set[str]) -> set[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            out.add(str(key))
            _key_names(value, out)
    elif isinstance(node, list):
        for value in node:
            _key_names(value, out)
    return out


def config_keys() -> set[str]:
    """Every key name, at any depth, of the composed primary configs."""
    names = sorted(p.stem for p in CONF_DIR.glob("*.yaml"))
    keys: set[str] = set()
    for name in names:
        _key_names(OmegaConf.to_container(compose(name, []), resolve=False), keys)
    return keys


def _identifiers(expr: ast.AST) -> set[str]:
    """The names and attribute names in an expression (string constants left out)."""
    out: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _is_config(expr: ast.AST, bound: set[str]) -> bool:
    if isinstance(expr, ast.Subscript) and not isinstance(expr.slice, ast.Constant):
        return False  # an item looked up by a computed key (``groups[id(p)]``): a collection, not a section
    names = _identifiers(expr)
    return bool(names & bound) or any(w in n.lower() for n in names for w in CONFIG_WORDS)


def _literal(node: ast.AST) -> bool:
    """A value written out in the code: a constant, ``None``, or a container of them."""
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def _bound_to_config(scope: ast.AST) -> set[str]:
    """Local names a scope binds to a config expression (``ev = cfg.eval``), to a fixed point."""
    assigns: list[tuple[str, ast.AST]] = []
    for node in (n for n in ast.walk(scope) if isinstance(n, ast.Assign) and len(n.targets) == 1):
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Name):
            assigns.append((target.id, value))
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            assigns += [(t.id, v) for t, v in zip(target.elts, value.elts) if isinstance(t, ast.Name)]
    bound: set[str] = set()
    while True:
        more = {name for name, value in assigns if name not in bound and _is_config(value, bound)}
        if not more:
            return bound
        bound |= more


def _read(call: ast.Call) -> tuple[ast.AST, str, ast.AST] | None:
    """``(receiver, key, default)`` of a keyed read with a default, else None."""
    func, args = call.func, call.args
    if isinstance(func, ast.Attribute) and func.attr == "get" and len(args) == 2:
        receiver, (key, default) = func.value, args
    elif isinstance(func, ast.Name) and func.id in READERS and len(args) == 3:
        receiver, key, default = args
    else:
        return None
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    return receiver, key.value, default


def inline_defaults(keys: set[str]) -> dict[tuple[str, int, int], tuple[str, str]]:
    """``{(module, line, column): (key, source)}`` of every config read with a literal default."""
    found: dict[tuple[str, int, int], tuple[str, str]] = {}
    for rel in _package_files():
        tree = ast.parse((REPO / rel).read_text())
        scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
        for scope in scopes:
            bound = _bound_to_config(scope) if scope is not tree else set()
            for call in (n for n in ast.walk(scope) if isinstance(n, ast.Call)):
                read = _read(call)
                if read is None:
                    continue
                receiver, key, default = read
                if key in keys and _literal(default) and _is_config(receiver, bound):
                    found[(rel, call.lineno, call.col_offset)] = (key, ast.unparse(call))
    return found


def by_module(found) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for (rel, _, _), (key, _) in found.items():
        out.setdefault(rel, set()).add(key)
    return out


def test_no_config_key_has_an_inline_default():
    found = inline_defaults(config_keys())
    new = [f"{rel}:{line}: {src}" for (rel, line, _), (key, src) in sorted(found.items()) if key not in KNOWN.get(rel, set())]
    assert new == [], "config read with a default of its own (declare it once, in conf/ or a settings class):\n" + "\n".join(new)


def test_every_known_inline_default_still_occurs():
    seen = by_module(inline_defaults(config_keys()))
    gone = {rel: keys - seen.get(rel, set()) for rel, keys in KNOWN.items()}
    assert {rel: keys for rel, keys in gone.items() if keys} == {}, "remove these from KNOWN"


def test_the_tracking_defaults_are_the_composed_configs_values():
    """``TrackingSettings`` declares the defaults of the keys the tracker reads for a section built
    by hand: they are ``conf/tracking/mlflow.yaml``'s."""
    tracking = OmegaConf.to_container(compose("train", []).tracking, resolve=True)
    for f in dataclasses.fields(TrackingSettings):
        assert f.default == tracking[f.name], f"TrackingSettings.{f.name}: {f.default!r}, the config: {tracking[f.name]!r}"
    assert TrackingSettings.from_config({"retry_s": None}) == TrackingSettings()


if __name__ == "__main__":
    for (rel, line, _), (key, src) in sorted(inline_defaults(config_keys()).items()):
        print(f"{rel}:{line}: [{key}] {src}")
