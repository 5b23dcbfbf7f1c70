"""The run schema (core/schema/): each key a primary config owns, and each key of the groups it
declares (``GROUP_SCHEMAS``), is declared once, with its default, rule and doc, and those three reach
the composed config, the validation and ``config show --doc``."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from entropyrl.conf import CONF_DIR, GROUP_SCHEMAS, RUN_SCHEMAS, compose, primary_defaults
from entropyrl.core.errors import UserError
from entropyrl.core.rules import Rule
from entropyrl.core.schema import bind, defaults, docs, key, rules, section
from entropyrl.core.schema.launcher import LAUNCHER_SCHEMAS, LauncherName, Ranks, Threads, Timeouts
from entropyrl.core.schema.model import MODEL_SCHEMAS, ArchSizes, Loading, ModelId
from entropyrl.core.schema.rollout import ROLLOUT_SCHEMAS, Sampling
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


def _group_schemas() -> list[tuple[str, str, type]]:
    """``[(group, option, schema)]``: each group schema with the option YAML that lists its node (an
    option of a group with one schema per option, or the one option of the group that lists it)."""
    out = []
    for group, schema in sorted(GROUP_SCHEMAS.items()):
        per_option = schema if isinstance(schema, dict) else None
        for path in sorted((CONF_DIR / group).glob("*.yaml")):
            first = (yaml.safe_load(path.read_text()).get("defaults") or [None])[0]
            if per_option is not None and path.stem in per_option:
                out.append((group, path.stem, per_option[path.stem]))
            elif per_option is None and first == f"/schema/{group}@_here_":
                out.append((group, path.stem, schema))
    return out


GROUP_CASES = _group_schemas()
GROUP_IDS = [f"{group}={option}" for group, option, _ in GROUP_CASES]


def _commands_with(group: str) -> list[str]:
    return [c for c in sorted(RUN_SCHEMAS) if group in primary_defaults(c)]


def test_every_group_schema_has_its_declaring_option():
    assert {group for group, _, _ in GROUP_CASES} == set(GROUP_SCHEMAS)


@pytest.mark.parametrize("group, option, schema", GROUP_CASES, ids=GROUP_IDS)
def test_every_group_schema_key_has_a_rule_and_a_doc(group, option, schema):
    table = rules(schema)
    assert table and all(isinstance(r, Rule) for r in table.values())
    undocumented = [k for k, doc in docs(schema).items() if not doc.strip()]
    assert not undocumented, f"{group} schema keys without a doc: {undocumented}"


@pytest.mark.parametrize("group, option, schema", GROUP_CASES, ids=GROUP_IDS)
def test_the_declaring_option_sets_no_key_its_schema_declares(group, option, schema):
    """Declared once: the group's option lists the schema node first and sets none of its keys again
    (its schema is the option's own: an engine's, a launcher's); an option whose schema is a shape's
    (a model preset: the shape's ``name`` defaults to none) sets only the values that are its own:
    keys the schema declares, never to the schema's default."""
    body = yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text())
    node = f"/schema/{group}/{option}@_here_" if isinstance(GROUP_SCHEMAS[group], dict) else f"/schema/{group}@_here_"
    assert body["defaults"][0] == node
    own = _leaves({k: v for k, v in body.items() if k != "defaults"})
    declared = {k[:-2] if k.endswith(".*") else k for k in rules(schema)}
    if not isinstance(GROUP_SCHEMAS[group], dict) or defaults(schema).get("name") == option:
        twice = sorted(k for k in own if k in declared or any(k.startswith(d + ".") for d in declared))
        assert not twice, f"{group}/{option}.yaml sets {twice} again (core/schema/{group}.py declares them)"
        return
    default = _leaves(defaults(schema))
    undeclared = sorted(k for k in own if k not in declared)
    assert not undeclared, f"{group}/{option}.yaml sets {undeclared}, which core/schema/{group}.py does not declare"
    again = sorted(k for k, v in own.items() if default[k] == v and type(default[k]) is type(v))
    assert not again, f"{group}/{option}.yaml sets {again} to the schema's default again (core/schema/{group}.py)"


def _set_by_yaml(command: str, overrides: list[str], *, besides: str | None = None) -> set[str]:
    """The dotted keys some shipped YAML of the composition sets (the schema nodes are no files);
    ``besides``: a YAML of that group's own options excepted."""
    from entropyrl.conf.key_docs import composition_choices, composition_files

    out = set()
    for path, prefix in composition_files(command, composition_choices(command, overrides)):
        if besides is not None and path.parent == CONF_DIR / besides:
            continue
        body = yaml.safe_load(path.read_text()) or {}
        out |= {prefix + k for k in _leaves({k: v for k, v in body.items() if k != "defaults"})}
    return out


@pytest.mark.parametrize("group, option, schema", GROUP_CASES, ids=GROUP_IDS)
def test_the_composed_config_holds_the_group_schema_defaults(group, option, schema):
    """Every key of the schema is in the composed config; one no shipped YAML sets has its default."""
    from omegaconf import OmegaConf

    for command in _commands_with(group):
        overrides = [f"{group}={option}"]
        composed = _leaves(OmegaConf.to_container(compose(command, overrides, validate=False), resolve=False))
        set_by_yaml = _set_by_yaml(command, overrides)
        for k, value in _leaves(defaults(schema), f"{group}.").items():
            assert k in composed, f"{k} is missing from the composed {command} config"
            if k not in set_by_yaml:
                assert composed[k] == value, f"{k}: composed {composed[k]!r}, schema default {value!r}"


@pytest.mark.parametrize("group, option, schema", GROUP_CASES, ids=GROUP_IDS)
def test_every_key_of_the_composed_group_is_declared_by_its_schema(group, option, schema):
    """The other way round: the option's composed section holds no key its schema does not declare,
    but for those the command's run schema adds to the section (``model.lora`` in ``train``) and those
    another group's YAML sets there (``data=countdown``: ``model.warm_start``, the embedded model's,
    for every model), each with a rule in the command's table (the union of the group's schemas)."""
    from omegaconf import OmegaConf

    from entropyrl.core.validation import rule_for

    for command in _commands_with(group):
        overrides = [f"{group}={option}"]
        added = {k for k in rules(RUN_SCHEMAS[command], "") if k.startswith(f"{group}.")}
        elsewhere = {k for k in _set_by_yaml(command, overrides, besides=group) if k.startswith(f"{group}.")}
        declared = {f"{group}.{k}" for k in rules(schema)} | added | elsewhere
        owned = [k[:-2] for k in declared if k.endswith(".*")]  # a section its component checks, and all below it
        cfg = OmegaConf.to_container(compose(command, overrides, validate=False), resolve=False)
        undeclared = [
            k
            for k in _leaves(cfg[group], f"{group}.")
            if k not in declared and not any(k == o or k.startswith(f"{o}.") for o in owned)
        ]
        assert not undeclared, f"{command} {group}={option}: {undeclared} are not declared by its schema"
        assert all(rule_for(command, k) is not None for k in elsewhere), sorted(elsewhere)


@pytest.mark.parametrize("group, option, schema", GROUP_CASES, ids=GROUP_IDS)
def test_the_group_schema_node_is_stored(group, option, schema):
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from entropyrl.conf import SCHEMA_GROUP, store_schemas

    store_schemas()
    path = f"{SCHEMA_GROUP}/{group}/{option}" if isinstance(GROUP_SCHEMAS[group], dict) else f"{SCHEMA_GROUP}/{group}"
    node = ConfigStore.instance().load(f"{path}.yaml").node
    assert OmegaConf.to_container(node) == defaults(schema)
    assert list(OmegaConf.to_container(node)) == [f.name for f in dataclasses.fields(schema)]  # the keys' order


@pytest.mark.parametrize("group, option, schema", GROUP_CASES, ids=GROUP_IDS)
def test_the_validation_tables_take_the_group_rules_from_the_schema(group, option, schema):
    commands = _commands_with(group)
    assert commands
    for command in commands:
        for k, rule in rules(schema, f"{group}.").items():
            assert SCHEMAS[command][k] is rule


def test_config_show_doc_prints_the_group_schema_doc(capsys):
    from entropyrl.cli.main import main
    from entropyrl.core.schema.tools import ToolsSchema

    with pytest.raises(SystemExit) as done:
        main(["config", "show", "--doc", "tools=code_interpreter"])
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("tools.executor.launch:"))
    assert docs(ToolsSchema, "tools.")["tools.executor.launch"] in line


PER_OPTION_CASES = [
    *[("train", "rollout", engine) for engine in sorted(ROLLOUT_SCHEMAS)],
    *[("sweep", "launcher", launcher) for launcher in sorted(LAUNCHER_SCHEMAS)],
    *[("train", "model", preset) for preset in sorted(MODEL_SCHEMAS)],
]


@pytest.mark.parametrize("command, group, option", PER_OPTION_CASES, ids=[f"{g}={o}" for _, g, o in PER_OPTION_CASES])
def test_config_show_doc_prints_the_picked_options_schema_docs(command, group, option, capsys):
    """``rollout=<engine>`` (``launcher=<name>`` for a sweep): its own keys' docs, from its schema;
    none of another option's keys."""
    from entropyrl.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["config", "show", "--for", command, "--doc", f"{group}={option}"])
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    options = GROUP_SCHEMAS[group]
    own = docs(options[option], f"{group}.")
    for other, schema in options.items():
        for k in _leaves(defaults(schema), f"{group}."):  # the lines it prints: one per leaf
            shown = [x for x in out.splitlines() if x.startswith(f"{k}:")]
            if k in own:
                assert len(shown) == 1 and own[k] in shown[0], (k, shown)
            else:
                assert not shown, f"{group}={option} shows {other}'s {k}"


def test_the_engines_share_the_sampling_keys_and_end_with_seed_scope():
    """Every engine starts with the shared sampling keys and ends with seed_scope (the order
    ``config show`` prints); a shared key is declared once (the same rule and doc in each)."""
    shared = [f.name for f in dataclasses.fields(Sampling)]
    for engine, schema in ROLLOUT_SCHEMAS.items():
        names = [f.name for f in dataclasses.fields(schema)]
        assert names[: len(shared)] == shared and names[-1] == "seed_scope", (engine, names)
        assert defaults(schema)["name"] == engine
    tables = [rules(schema) for schema in ROLLOUT_SCHEMAS.values()]
    for k in [*shared, "seed_scope"]:
        assert len({id(t[k]) for t in tables}) == 1, k


def test_the_launchers_declare_each_shared_key_once():
    """Every launcher starts with ``name``; local and slurm share the ranks and time-limit keys, all
    three ``threads_per_job``: each a shared key with one rule and one doc in every launcher that has
    it (an option sets only its default again), and the owned ones stay owned."""
    assert sorted(LAUNCHER_SCHEMAS) == ["debug", "local", "slurm"]
    shared = {"debug": (LauncherName, Threads), "local": (LauncherName, Ranks, Timeouts, Threads)}
    shared["slurm"] = shared["local"]
    for launcher, schema in LAUNCHER_SCHEMAS.items():
        assert [f.name for f in dataclasses.fields(schema)][0] == "name" and defaults(schema)["name"] == launcher
        assert all(issubclass(schema, base) for base in shared[launcher]), launcher
    tables = {launcher: rules(schema) for launcher, schema in LAUNCHER_SCHEMAS.items()}
    texts = {launcher: docs(schema) for launcher, schema in LAUNCHER_SCHEMAS.items()}
    for base in (LauncherName, Ranks, Timeouts, Threads):
        for k in (f.name for f in dataclasses.fields(base)):
            having = [launcher for launcher in tables if k in tables[launcher]]
            assert len({id(tables[launcher][k]) for launcher in having}) == 1, k
            assert len({texts[launcher][k] for launcher in having}) == 1, k
    assert SCHEMAS["sweep"]["launcher.threads_per_job"].kind == "owned"
    assert SCHEMAS["sweep"]["launcher.additional_parameters.*"].kind == "owned"


def test_the_model_shapes_declare_each_shared_key_once():
    """Every shipped preset has a shape's schema; the shapes start with ``name, path`` and share
    ``Loading`` and the architecture's sizes: each shared key one rule and one doc in every shape (a
    shape sets only its default again: ``embedded`` and ``chat_template`` for the embedded model)."""
    assert sorted(MODEL_SCHEMAS) == sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
    shapes = set(MODEL_SCHEMAS.values())
    assert len(shapes) == 3
    for schema in shapes:
        assert [f.name for f in dataclasses.fields(schema)][:2] == ["name", "path"]
        assert issubclass(schema, ModelId) and issubclass(schema, Loading)
        assert defaults(schema)["name"] is None  # each preset names itself
    tables = [rules(schema) for schema in shapes]
    texts = [docs(schema) for schema in shapes]
    shared = [f.name for base in (ModelId, Loading) for f in dataclasses.fields(base)]
    shared += [f"arch.{f.name}" for f in dataclasses.fields(ArchSizes)]
    for k in shared:
        assert len({id(t[k]) for t in tables}) == 1 and len({t[k] for t in texts}) == 1, k
    assert SCHEMAS["train"]["model.chat_template"].kind == "owned"


@pytest.mark.parametrize("key", ["name", "arch.hidden_size", "arch.vocab_size"])
def test_a_preset_that_leaves_out_a_key_of_its_own_fails_naming_it(key):
    """A preset's own keys (its name, its architecture's sizes) default to null, which their rules
    refuse: a preset stored without one (a plugin's, in Hydra's ConfigStore) fails at composition."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    shipped = OmegaConf.to_container(compose("train", ["model=qwen2.5-7b"], validate=False).model)
    node = {k: v for k, v in shipped.items() if k not in ("lora", "warm_start")}  # the preset's own keys
    parent, _, leaf = f"model.{key}".rpartition(".")
    del (node if parent == "model" else node["arch"])[leaf]
    node["defaults"] = ["/schema/model/qwen2.5-7b@_here_", "_self_"]
    ConfigStore.instance().store(group="model", name="test_preset_without_a_key", node=node)
    try:
        with pytest.raises(UserError, match=rf"^model\.{re.escape(key)}=null is not allowed"):
            compose("train", ["model=test_preset_without_a_key"])
    finally:
        ConfigStore.instance().repo["model"].pop("test_preset_without_a_key.yaml", None)


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


def test_a_sweep_sends_every_schema_section_of_train_to_its_jobs():
    """The sweep's command line routes by first key: the train schema's sections go to the jobs
    (trainer.total_steps=5), the sweep schema's stay with the sweep (seeds, report.*)."""
    from entropyrl.sweeps.planning import split_overrides

    train_heads = sorted(defaults(RUN_SCHEMAS["train"]))
    sweep_heads = sorted(defaults(RUN_SCHEMAS["sweep"]))
    sweep, train = split_overrides([f"{h}.x=1" for h in train_heads] + [f"{h}=1" for h in sweep_heads])
    assert sorted(o.split(".")[0] for o in train) == train_heads
    assert sorted(o.split("=")[0] for o in sweep) == sweep_heads
