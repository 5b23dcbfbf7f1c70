"""Each config key's one-line documentation: its run-schema doc (core/schema/), else the YAML comment where it is declared.

The house convention is that every option is documented where it is declared: a comment after the
value, continued on the comment-only lines that follow it, indented deeper than the key:

    total_steps: 300         # training steps (one rollout batch + its updates each). On the
                             # default task GRPO's entropy sinks ...

``declared_docs`` reads those comments from one YAML text with a line parser (no YAML library keeps
comments, and the shipped files use plain block mappings). ``composition_files`` lists the shipped
files a composition merged, in Hydra's merge order, each with the package its keys land under, and
``key_docs`` joins them: a key's doc comes from the primary config when it comments the key there,
else from the first file in merge order that does (the file that declares the key says what it
means; a later one that sets it again usually says why it picked that value).

Pure functions of the files under ``conf/`` and the group choices of a composition
(``composition_choices`` asks Hydra for those); ``entropyrl config show --doc`` prints the result.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..core.schema import docs
from . import (
    CONF_DIR,
    GROUP_SCHEMAS,
    INTERVENTION_GROUP,
    INTERVENTION_MOUNT,
    RUN_SCHEMAS,
    mount_interventions,
    primary_configs,
    primary_defaults,
)

#: ``key:`` at the start of a line (after its indentation): a plain or quoted mapping key.
_KEY_LINE = re.compile(r"""^(?P<indent> *)(?P<key>"[^"]*"|'[^']*'|[^\s#'"\-][^:#]*?)\s*:(?=\s|$)(?P<rest>.*)$""")
#: Hydra's package header, in the comment block a file opens with.
_PACKAGE_HEADER = re.compile(r"^#\s*@package\s+(\S+)")


def _trailing_comment(rest: str) -> str | None:
    """The comment text after a value (``value  # comment`` -> ``comment``), or None. A ``#`` counts
    when it starts the rest or follows whitespace, outside quotes (YAML's rule)."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"" and (i == 0 or rest[:i].strip() == "" or rest[i - 1] in " [{,"):
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[i + 1 :].strip()
    return None


def declared_docs(text: str) -> dict[str, str]:
    """``{dotted key: doc}`` for every mapping key declared in one YAML text, relative to the file's
    root (the top-level ``defaults`` list included, and parent keys too). The doc is the comment after
    the key's value joined with the comment-only lines right below it whose ``#`` sits deeper than
    the key (a blank line, a key or a shallower comment ends it); for a key with none, the comment
    lines right above it at its own indentation (``# Where checkpoints ... go`` over ``output_dir:``;
    never the block the file opens with, which says what the whole file is for); else ``""``.
    Keys inside lists (``- name: ...``) are not config keys of their own and are skipped."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings above this line; "-": a list item
    open_doc: tuple[str, int] | None = None  # (key, its indent) whose comment may continue
    above: list[str] = []  # the comment lines right above this line, at its indentation
    above_indent = -1
    opening = True  # still in the comment block the file opens with (what the file is for)
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if stripped.startswith("#") and open_doc is not None and indent > open_doc[1]:
            key = open_doc[0]
            docs[key] = " ".join(f"{docs[key]} {stripped.lstrip('#')}".split())
            continue
        open_doc = None
        if stripped.startswith("#") and not opening:
            if indent != above_indent:
                above, above_indent = [], indent
            above.append(stripped.lstrip("#").strip())
            continue
        comment_above = " ".join(above) if indent == above_indent else ""
        above, above_indent = [], -1
        if not stripped or stripped.startswith("#"):
            continue
        opening = False
        match = _KEY_LINE.match(line)
        if match is None and not (stripped == "-" or stripped.startswith("- ")):
            continue  # the rest of a value that spans lines
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if match is None:  # a list item: what it holds is no config key of its own
            stack.append((indent, "-"))
            continue
        if any(k == "-" for _, k in stack):
            continue
        name = match.group("key").strip()
        if name[:1] in "'\"":
            name = name[1:-1]
        key = ".".join([k for _, k in stack] + [name])
        comment = _trailing_comment(match.group("rest"))
        docs[key] = " ".join((comment or comment_above).split())
        open_doc = (key, indent) if comment else None
        stack.append((indent, name))
    return docs


def package_header(text: str) -> str | None:
    """The ``# @package X`` header of a YAML text (in the comment block it opens with), or None."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            return None
        found = _PACKAGE_HEADER.match(stripped)
        if found:
            return found.group(1)
    return None


def _defaults_list(text: str) -> list:
    """The ``defaults`` list of a YAML text, as plain YAML (Hydra reads it the same way)."""
    import yaml

    raw = yaml.safe_load(text) or {}
    return list(raw.get("defaults") or []) if isinstance(raw, dict) else []


def _prefix(package: str) -> str:
    return "" if package in ("", "_global_") else f"{package}."


def composition_files(config_name: str, choices: dict[str, str | None], conf_dir: Path = CONF_DIR) -> list[tuple[Path, str]]:
    """``[(file, key prefix)]``: the shipped YAML files composing ``config_name`` merged, in Hydra's
    merge order (a file's defaults before the file itself unless ``_self_`` comes first), each with
    the prefix its keys land under (``algo.`` for an algo option, ``algo.stare.`` for an intervention,
    ``""`` for ``# @package _global_``). ``choices`` maps each group (``group`` or ``group@package``,
    as Hydra's ``hydra.runtime.choices`` does) to the option picked, so an override such as
    ``algo=stare`` or an experiment's ``override /algo: stare`` is followed. Options that are not
    files (an intervention stored in Hydra's ConfigStore) have no comments and are left out."""
    out: list[tuple[Path, str]] = []
    seen: set[Path] = set()

    def walk(path: Path, package: str, group: str) -> None:
        if path in seen or not path.is_file():
            return
        seen.add(path)
        text = path.read_text()
        header = package_header(text)
        if header is not None:
            package = "" if header == "_global_" else header
        entries = _defaults_list(text)
        if "_self_" not in entries:
            entries.append("_self_")
        for entry in entries:
            if entry == "_self_":
                out.append((path, _prefix(package)))
            elif isinstance(entry, str):
                if entry.lstrip("/") == INTERVENTION_MOUNT:
                    for key, option in choices.items():
                        if key.startswith(f"{INTERVENTION_GROUP}@") and option:
                            mount = key.split("@", 1)[1]
                            walk(conf_dir / INTERVENTION_GROUP / f"{option}.yaml", mount, INTERVENTION_GROUP)
                elif entry.startswith("/"):
                    walk(conf_dir / f"{entry[1:]}.yaml", package, str(Path(entry[1:]).parent))
                else:  # another option of the same group, at the same package
                    walk(conf_dir / group / f"{entry}.yaml", package, group)
            elif isinstance(entry, dict):
                for key, option in entry.items():
                    key = str(key)
                    if key.startswith("override "):
                        continue  # followed through ``choices``
                    sub_group, _, sub_package = key.lstrip("/").partition("@")
                    if not key.startswith("/") and group:
                        sub_group = f"{group}/{sub_group}"
                    picked = choices.get(key.lstrip("/"), option)
                    if picked is not None:
                        walk(conf_dir / sub_group / f"{picked}.yaml", sub_package or sub_group.replace("/", "."), sub_group)

    walk(conf_dir / f"{config_name}.yaml", "", "")
    for key, option in choices.items():  # a group the defaults lists did not name (a +group=option)
        group, _, package = key.partition("@")
        if option and not group.startswith("hydra"):
            walk(conf_dir / group / f"{option}.yaml", package or group.replace("/", "."), group)
    return out


def key_docs(config_name: str, choices: dict[str, str | None], conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """``{dotted key: doc}`` of every key the composition declares: a key of the run schema
    (``core/schema/``: the keys the primary config owns, and those of the groups in
    ``GROUP_SCHEMAS``) its schema doc, over any file's comment, except that the primary config's own
    comment on a group key it sets (``tracking.experiment`` in ``sweep.yaml``: why it picks that
    value) wins there too; any other key the comment of the files that declare it (see
    ``composition_files``): the primary config's comment where it has one, else the first comment in
    merge order, else ``""``."""
    docs: dict[str, str] = dict(schema_docs(config_name, choices))
    owned = schema_docs(config_name, {}, groups=False)  # the primary YAML never sets these
    primary = conf_dir / f"{config_name}.yaml"
    for path, prefix in composition_files(config_name, choices, conf_dir):
        for key, doc in declared_docs(path.read_text()).items():
            if key == "defaults" or key.startswith("defaults."):
                continue
            full = prefix + key
            if path == primary and doc and full not in owned:
                docs[full] = doc
            elif not docs.get(full):
                docs[full] = doc
    return docs


def schema_docs(config_name: str, choices: dict[str, str | None] | None = None, *, groups: bool = True) -> dict[str, str]:
    """``{dotted key: doc}`` of the keys primary config ``config_name`` owns, from its run schema, and
    (``groups``) of the keys of the groups it composes whose schema is in ``GROUP_SCHEMAS``
    (``tools.*`` for ``train``); a group whose options have schemas of their own (``rollout``, ``model``,
    ``launcher``) takes the option ``choices`` picks, else the primary config's default option."""
    schema = RUN_SCHEMAS.get(config_name)
    if schema is None:
        return {}
    out = docs(schema)
    if not groups:
        return out
    picked = {**primary_defaults(config_name), **{k: v for k, v in (choices or {}).items() if v}}
    for group, group_schema in GROUP_SCHEMAS.items():
        if group not in picked:
            continue
        if isinstance(group_schema, dict):  # one schema per option: none for an option stored by a plugin
            group_schema = group_schema.get(picked[group])
        if group_schema is not None:
            out.update(docs(group_schema, f"{group}."))
    return out


def doc_for(key: str, docs: dict[str, str]) -> str:
    """The doc of ``key``, else of its nearest documented parent (a key inside a free-form mapping
    such as ``algo.objective_args.tau_pos``), else ``""``."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        doc = docs.get(".".join(parts[:n]))
        if doc:
            return doc
    return ""


def composition_choices(config_name: str, overrides: list[str]) -> dict[str, str | None]:
    """The option each config group got when ``config_name`` is composed with ``overrides``
    (Hydra's ``hydra.runtime.choices``): what ``composition_files`` follows. Compose with
    ``entropyrl.conf.compose`` first: it turns bad overrides into one-line errors."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    if config_name not in primary_configs():
        return {}
    GlobalHydra.instance().clear()
    mount_interventions()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="entropyrl"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices, resolve=False)
    finally:
        GlobalHydra.instance().clear()
    return {str(k): (None if v is None else str(v)) for k, v in choices.items() if not str(k).startswith("hydra/")}
