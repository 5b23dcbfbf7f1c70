"""The run schema (core/schema/): each key a primary config owns is declared once, with its default,
rule and doc, and those three reach the composed config, the validation and ``config show --doc``."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from entropyrl.conf import CONF_DIR, RUN_SCHEMAS, compose
from entropyrl.core.errors import UserError
from entropyrl.core.rules import Rule
from entropyrl.core.schema import bind, defaults, docs, key, rules, section
from entropyrl.core.schema.train import Trainer
from entropyrl.core.validation import SCHEMAS


def _leaves(node: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in node.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("command", sorted(RUN_SCHEMAS))
def test_every_schema_key_has_a_rule_and_a_doc(command):
    schema = RUN_SCHEMAS[command]
    table = rules(schema)
    assert table and all(isinstance(r, Rule) for r in table.values())
    undocumented = [k for k, doc in docs(schema).items() if not doc.strip()]
    assert not undocumented, f"schema keys without a doc: {undocumented}"


@pytest.mark.parametrize("command", sorted(RUN_SCHEMAS))
def test_the_primary_yaml_declares_no_key_its_schema_declares(command):
    """Declared once: the primary YAML lists the schema node first and sets none of its keys again."""
    body = yaml.safe_load((CONF_DIR / f"{command}.yaml").read_text())
    assert body["defaults"][0] == f"/schema/{command}@_here_"
    own = set(_leaves({k: v for k, v in body.items() if k != "defaults"}))
    declared = {k[:-2] if k.endswith(".*") else k for k in rules(RUN_SCHEMAS[command])}
    twice = sorted(k for k in own if k in declared or any(k.startswith(d + ".") for d in declared))
    assert not twice, f"{command}.yaml sets {twice} again (core/schema/{command}.py declares them)"


@pytest.mark.parametrize("command", sorted(RUN_SCHEMAS))
def test_the_composed_default_config_holds_the_schema_defaults(command):
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(compose(command, [], validate=False), resolve=False)
    composed = _leaves(cfg)
    for k, value in _leaves(defaults(RUN_SCHEMAS[command])).items():
        assert k in composed, f"{k} is missing from the composed {command} config"
        assert composed[k] == value, f"{k}: composed {composed[k]!r}, schema default {value!r}"


@pytest.mark.parametrize("command", sorted(RUN_SCHEMAS))
def test_the_validation_table_takes_its_rules_from_the_schema(command):
    for k, rule in rules(RUN_SCHEMAS[command]).items():
        assert SCHEMAS[command][k] is rule


def test_a_bad_value_of_a_schema_key_is_one_line_naming_its_rule():
    with pytest.raises(UserError) as err:
        compose("train", ["trainer.samples_rows=0"])
    assert str(err.value) == "trainer.samples_rows=0 is not allowed: it must be a positive integer"


def test_an_unknown_key_in_a_schema_section_names_the_near_one():
    with pytest.raises(UserError) as err:
        compose("train", ["trainer.total_step=5"])
    assert "\n" not in str(err.value) and "`trainer.total_steps`" in str(err.value)


def test_bind_gives_the_typed_section_with_the_composed_values():
    cfg = compose("train", ["trainer.total_steps=7", "trainer.staleness=2"])
    bound = bind(Trainer, cfg.trainer)
    assert isinstance(bound, Trainer)
    assert (bound.total_steps, bound.staleness, bound.seed) == (7, 2, 0)


def test_declaration_helpers_keep_defaults_fresh_and_nest_sections():
    @dataclasses.dataclass
    class Inner:
        items: list = key([1], Rule("int_list"), "a list")

    @dataclasses.dataclass
    class Outer:
        inner: Inner = section(Inner, "the inner section")

    a, b = Outer(), Outer()
    a.inner.items.append(2)
    assert b.inner.items == [1]  # a list default is copied, never shared
    assert defaults(Outer) == {"inner": {"items": [1]}}
    assert docs(Outer) == {"inner": "the inner section", "inner.items": "a list"}
    assert list(rules(Outer)) == ["inner.items"]


def test_config_show_doc_prints_the_schema_doc(capsys):
    from entropyrl.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["config", "show", "--doc"])
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("trainer.staleness:"))
    assert docs(RUN_SCHEMAS["train"])["trainer.staleness"] in line


def test_bind_gives_numbers_the_type_of_their_rule():
    bound = bind(Trainer, {"ppo_epochs": 2.0, "grad_clip": 1, "progress": False})
    assert type(bound.ppo_epochs) is int and type(bound.grad_clip) is float and bound.progress is False
