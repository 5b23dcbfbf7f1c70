"""The run schema: every key a command's own config declares, once, with its default, rule and doc.

A command's schema is a tree of dataclasses (``TrainSchema``, ``EvalSchema``, ``SweepSchema``); each
field is one config key, declared with ``key(default, rule, doc)``:

    @dataclass
    class Trainer:
        total_steps: int = key(300, POS_INT, "training steps (one rollout batch + its updates each)")

    @dataclass
    class TrainSchema:
        trainer: Trainer = section(Trainer)

From the tree come the three things a key has (``tests/conf/test_schema.py`` holds them together):

- its **default**: ``defaults(TrainSchema)`` is the plain node ``entropyrl.conf`` stores in Hydra's
  ConfigStore (``schema/train``) and the primary config lists first in its defaults list, so the
  groups (``algo=``, ``data=``, ...), the primary YAML and the experiment presets only *set* values;
- its **rule** (``core/rules.py``): ``rules(TrainSchema)`` is the part of ``core/validation.py``'s
  table for ``train``, so a bad value is one line naming the key, the value and what is allowed;
- its **doc**: ``docs(TrainSchema)``, what ``entropyrl config show --doc`` prints.

The node stored is plain values, not the typed dataclass: the rules check types and ranges in one
pass with one-line errors, where OmegaConf's typed nodes would coerce (``trainer.progress=yes`` to
true, ``optim.lr=1`` to 1.0) or raise their own multi-line errors. Code below the set-up reads its
section typed with ``bind(Trainer, cfg.trainer)``.

A config group's keys can be declared the same way (``ToolsSchema`` in ``tools.py``, ``TrackingSchema`` in
``tracking.py``): ``entropyrl.conf.GROUP_SCHEMAS`` stores each as ``schema/<group>``, which the group's declaring
option lists first (``- /schema/tools@_here_``), and its rules enter the tables as ``rules(ToolsSchema, "tools.")``.
A group whose options have keys of their own has one schema per option (the rollout engines, ``rollout.py``;
the launchers, ``launcher.py``; the model presets, ``model.py``, where the presets of one shape share its
schema), stored as ``schema/<group>/<option>`` and listed first by that option (``- /schema/rollout/hf@_here_``).

A key owned by a component (a section whose keys vary, such as ``eval.sandbox``) is declared with
``owned_section``: its rule is the component's (``prefix.*``), its default a mapping.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import MISSING, field
from typing import Any

from ..rules import Rule

_RULE, _DOC, _SECTION, _OWNED = "rule", "doc", "section", "owned_section"


def key(default: Any, rule: Rule, doc: str) -> Any:
    """One config key: its default, its rule (type and range) and a one-line doc."""
    meta = {_RULE: rule, _DOC: doc}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def owned_section(rule: Rule, doc: str, keys: dict[str, tuple[Any, str]]) -> Any:
    """A mapping whose keys one component reads and checks (``rule``: ``owned(...)``, covering
    ``<key>.*``): ``keys`` maps each shipped key to ``(default, doc)``; ``{}`` for a free-form mapping
    (``rollout.engine_kwargs``: whatever its component accepts, empty by default)."""
    meta = {_RULE: rule, _DOC: doc, _OWNED: {name: text for name, (_, text) in keys.items()}}
    default = {name: value for name, (value, _) in keys.items()}
    return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)


def section(cls: type, doc: str = "") -> Any:
    """A nested section of keys (another schema dataclass); its doc is ``doc`` or the class's."""
    return field(default_factory=cls, metadata={_SECTION: cls, _DOC: doc})


def _section_doc(f: dataclasses.Field) -> str:
    cls = f.metadata[_SECTION]
    own = f.metadata.get(_DOC) or ""
    if own:
        return own
    text = " ".join((cls.__doc__ or "").split())
    return text.split(": ", 1)[1] if text.startswith("``") and ": " in text else text


def rules(schema: type, prefix: str = "") -> dict[str, Rule]:
    """``{dotted key: Rule}`` of every key under ``schema`` (``prefix.*`` for an owned section)."""
    out: dict[str, Rule] = {}
    for f in dataclasses.fields(schema):
        name = f"{prefix}{f.name}"
        if _SECTION in f.metadata:
            out.update(rules(f.metadata[_SECTION], f"{name}."))
        elif _OWNED in f.metadata:  # an owned section, free-form ones (no shipped key) too
            out[f"{name}.*"] = f.metadata[_RULE]
        else:
            out[name] = f.metadata[_RULE]
    return out


def docs(schema: type, prefix: str = "") -> dict[str, str]:
    """``{dotted key: doc}`` of every key and section under ``schema``."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(schema):
        name = f"{prefix}{f.name}"
        if _SECTION in f.metadata:
            out[name] = _section_doc(f)
            out.update(docs(f.metadata[_SECTION], f"{name}."))
        else:
            out[name] = f.metadata[_DOC]
            for sub, text in (f.metadata.get(_OWNED) or {}).items():
                out[f"{name}.{sub}"] = text
    return out


def defaults(schema: type) -> dict[str, Any]:
    """The plain nested mapping of every key's default: the node a primary config starts from."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(schema):
        if _SECTION in f.metadata:
            out[f.name] = defaults(f.metadata[_SECTION])
        elif f.default is not MISSING:
            out[f.name] = f.default
        else:
            out[f.name] = f.default_factory()
    return out


def bind(schema: type, node: Any) -> Any:
    """An instance of ``schema`` holding ``node``'s values (a DictConfig section or a mapping), nested
    sections bound too, numbers as their rule's type: the typed piece code below the set-up reads
    instead of the config. A key the node lacks keeps its default; keys the schema does not declare
    are left out."""
    omegaconf = sys.modules.get("omegaconf")  # not imported: nothing can be one of its containers
    if omegaconf is not None and isinstance(node, omegaconf.DictConfig):
        node = omegaconf.OmegaConf.to_container(node, resolve=True)
    values = node or {}
    kwargs = {}
    for f in dataclasses.fields(schema):
        if f.name not in values:
            continue
        value = values[f.name]
        kwargs[f.name] = bind(f.metadata[_SECTION], value) if _SECTION in f.metadata else _typed(value, f.metadata[_RULE])
    return schema(**kwargs)


def _typed(value: Any, rule: Rule) -> Any:
    """``value`` as its rule's type: an int rule's 4.0 (which it accepts) as 4, a float rule's 1 as 1.0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if rule.kind == "int":
        return int(value)
    if rule.kind == "float":
        return float(value)
    return value
