"""``entropyrl config show --doc``: every key with its value, what is allowed and its doc, the doc
being the YAML comment where the key is declared (conf/key_docs.py)."""

from __future__ import annotations

import pytest

from entropyrl.conf import CONF_DIR, compose
from entropyrl.conf.key_docs import composition_choices, composition_files, declared_docs, doc_for, key_docs
from entropyrl.core.schema import docs as schema_docs
from entropyrl.core.schema.model import EmbeddedModelSchema
from entropyrl.core.schema.rollout import HfRolloutSchema
from entropyrl.core.schema.tracking import TrackingSchema


def _leaves(node, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [prefix[:-1]]


def _line_of(out: str, key: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(f"{key}: ")]
    assert len(lines) == 1, (key, out[-3000:])
    return lines[0]


# -- the comment parser --------------------------------------------------------------------------
def test_declared_docs_reads_trailing_continued_and_leading_comments():
    text = (
        "# What this file is for: never a key's doc.\n"
        "name: demo\n"
        "trainer:\n"
        "  steps: 3          # training steps, a first line\n"
        "                    #   that goes on here\n"
        "  # a header about seed, at seed's indentation\n"
        "  seed: 0\n"
        "  url: 'http://x#y'  # the '#' inside quotes is no comment\n"
        "# about the list\n"
        "items:              # the list\n"
        "  - name: inside    # a list item's key is no config key\n"
        "after: 1            # after the list\n"
        "# a shallower comment ends a continuation\n"
    )
    docs = declared_docs(text)
    assert docs["name"] == ""
    assert docs["trainer.steps"] == "training steps, a first line that goes on here"
    assert docs["trainer.seed"] == "a header about seed, at seed's indentation"
    assert docs["trainer.url"] == "the '#' inside quotes is no comment"
    assert docs["items"] == "the list" and "items.name" not in docs
    assert docs["after"] == "after the list"


def test_a_key_inside_a_free_form_mapping_takes_its_parents_doc():
    docs = {"algo.objective_args": "the objective's own parameters", "algo": ""}
    assert doc_for("algo.objective_args.tau_pos", docs) == "the objective's own parameters"
    assert doc_for("nowhere.at_all", docs) == ""


def test_the_primary_config_wins_then_the_first_group_file_in_merge_order():
    sweep_choices = composition_choices("sweep", [])
    files = [path for path, _ in composition_files("sweep", sweep_choices)]
    tracking = CONF_DIR / "tracking" / "mlflow.yaml"
    assert files.index(tracking) < files.index(CONF_DIR / "sweep.yaml")  # merged before the primary
    primary_doc = declared_docs((CONF_DIR / "sweep.yaml").read_text())["tracking.experiment"]
    assert primary_doc and primary_doc != schema_docs(TrackingSchema)["experiment"]  # the key's own doc: its schema's
    assert key_docs("sweep", sweep_choices)["tracking.experiment"] == primary_doc

    # algo.overlong.buffer: declared by conf/algo/grpo.yaml, set again by conf/algo/dapo.yaml after it
    dapo_choices = composition_choices("train", ["algo=dapo"])
    declared = declared_docs((CONF_DIR / "algo" / "grpo.yaml").read_text())["overlong.buffer"]
    again = declared_docs((CONF_DIR / "algo" / "dapo.yaml").read_text())["overlong.buffer"]
    assert declared and again and declared != again
    assert key_docs("train", dapo_choices)["algo.overlong.buffer"] == declared

    # rollout.max_new_tokens and model.warm_start.steps: declared by the rollout and model schemas
    # (core/schema/rollout.py, model.py), set again by conf/data/countdown.yaml: the schema's doc, as a
    # key a group file declares keeps its declaration's
    train_choices = composition_choices("train", [])
    docs = key_docs("train", train_choices)
    countdown = declared_docs((CONF_DIR / "data" / "countdown.yaml").read_text())
    for k, declared in (
        ("rollout.max_new_tokens", schema_docs(HfRolloutSchema)["max_new_tokens"]),
        ("model.warm_start.steps", schema_docs(EmbeddedModelSchema)["warm_start.steps"]),
    ):
        again = countdown[k]
        assert declared and again and declared != again
        assert docs[k] == declared


def test_an_override_of_a_group_is_followed_to_its_files():
    choices = composition_choices("train", ["algo=stare"])
    files = [path.relative_to(CONF_DIR).as_posix() for path, _ in composition_files("train", choices)]
    for name in ("algo/grpo.yaml", "algo/stare_o1.yaml", "algo/stare.yaml", "intervention/stare.yaml"):
        assert name in files, (name, files)
    assert files.index("algo/stare_o1.yaml") < files.index("algo/stare.yaml")
    assert "algo/dapo.yaml" not in files


# -- every shipped key is documented -------------------------------------------------------------
@pytest.mark.parametrize("config_name", ["train", "eval", "sweep"])
def test_every_key_of_the_default_configs_has_its_own_doc(config_name):
    """Each leaf key's own declaration carries a comment (not one inherited from its parent): the
    house rule "every option documented where declared", kept by this test."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(compose(config_name, []), resolve=False)
    docs = key_docs(config_name, composition_choices(config_name, []))
    leaves = _leaves(plain)
    assert len(leaves) > 20
    missing = [key for key in leaves if not docs.get(key, "").strip()]
    assert not missing, f"keys of {config_name} without a comment where declared: {missing}"


# -- the command ---------------------------------------------------------------------------------
def test_doc_prints_a_stare_key_with_value_range_and_doc(cli_in_process):
    from entropyrl.cli.config_cmd import _shown
    from entropyrl.conf import used_settings
    from entropyrl.trainers.algos.algo_config import ALGO_KEYS

    out = cli_in_process("config", "show", "--doc", "algo=stare")
    assert out.returncode == 0, out.stderr
    cfg = compose("train", ["algo=stare"])

    h_tgt = _line_of(out.stdout, "algo.stare.h_tgt")
    doc = declared_docs((CONF_DIR / "intervention" / "stare.yaml").read_text())["h_tgt"]
    assert (
        h_tgt
        == f"algo.stare.h_tgt: {_shown(cfg.algo.stare.h_tgt)}  [a number, range checked in trainers/interventions/stare.py]  # {doc}"
    )

    high = _line_of(out.stdout, "algo.clip.high")  # STARE's clip-higher, with its rule's range
    assert f": {_shown(cfg.algo.clip.high)}  [{ALGO_KEYS['clip.high'].allowed()}]  # " in high
    assert _shown(cfg.algo.clip.high) != _shown(compose("train", []).algo.clip.high)

    plain, hidden = used_settings(cfg)
    keys = [line.split(": ", 1)[0] for line in out.stdout.splitlines() if not line.startswith("#")]
    assert keys == _leaves(plain)  # one line per key the run uses, in config order
    assert "algo.steer.lambda_min" not in keys and hidden
    assert all("  [" in line and "]  # " in line for line in out.stdout.splitlines() if not line.startswith("#"))


def test_an_override_changes_the_printed_value(cli_in_process):
    default = cli_in_process("config", "show", "--doc", "--for", "eval")
    changed = cli_in_process("config", "show", "--doc", "--for", "eval", "eval.limit=7")
    assert default.returncode == 0 and changed.returncode == 0, (default.stderr, changed.stderr)
    before, after = _line_of(default.stdout, "eval.limit"), _line_of(changed.stdout, "eval.limit")
    assert before.startswith("eval.limit: null  [") and after.startswith("eval.limit: 7  [")
    assert before.split("  [", 1)[1] == after.split("  [", 1)[1]  # the same rule and doc


def test_an_unknown_key_is_still_a_one_line_error(cli_in_process):
    out = cli_in_process("config", "show", "--doc", "trainer.totl_steps=3")
    assert out.returncode == 2 and out.stdout == ""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: unknown config key 'trainer.totl_steps'"), out.stderr
    assert "trainer.total_steps" in lines[0]


#: Config groups whose options no primary config picks alone here, and why.
GROUPS_NOT_COMPOSED = {
    "benchmark": "read by name (evals/benchmarks.py: `entropyrl eval aime24`), and compose refuses `+benchmark=` "
    "as a near miss of `benchmarks`: no composition holds its keys",
    "intervention": "every option is mounted at algo.<name> in every train composition, so the default train "
    "config's test above already checks its keys",
}


def test_every_key_of_every_group_option_has_its_own_doc():
    """Each option of each config group, picked alone on the primary config whose defaults list names
    the group (``train``; ``sweep`` for ablation and launcher) with the other groups at their defaults:
    every leaf key of that composition carries a comment where it is declared, the same rule as the
    test above (which covers the default options).

    Nearly a hundred compositions, so each is one Hydra call that gives both the config and the group
    choices ``key_docs`` follows (``compose`` then ``composition_choices`` would compose twice), made
    without the intervention configs mounted at ``algo.<name>``, which are half of each call: they
    are the same files in every train composition, merged right after conf/algo/grpo.yaml and before
    any other option's file, so the default config's test already holds each of their keys to a
    comment, which is taken here as the doc of any key of theirs that an option sets again."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from entropyrl.conf import INTERVENTION_MOUNT, config_groups, intervention_names, mount_interventions, primary_defaults

    groups = config_groups()
    owner: dict[str, str] = {}
    for config_name in ("train", "sweep"):  # train first: `tracking` is in both
        for group in primary_defaults(config_name):
            owner.setdefault(group, config_name)
    assert set(owner) | set(GROUPS_NOT_COMPOSED) == set(groups), "a new config group: compose it here or say why not"
    assert not set(owner) & set(GROUPS_NOT_COMPOSED)
    picks = [
        (owner[group], f"{group}={option}")
        for group, options in groups.items()
        if group in owner
        for option in options
        if option != primary_defaults(owner[group])[group]
    ]
    assert {"algo", "model", "data", "rollout", "experiment", "ablation", "launcher"} <= {p.split("=")[0] for _, p in picks}

    mounted = key_docs("train", composition_choices("train", []))
    sections = tuple(f"algo.{name}." for name in intervention_names())
    intervention_docs = {key: doc for key, doc in mounted.items() if key.startswith(sections)}
    assert intervention_docs and all(intervention_docs.values())

    missing: dict[str, list[str]] = {}
    GlobalHydra.instance().clear()
    ConfigStore.instance().store(name=INTERVENTION_MOUNT, node={"defaults": []})  # nothing mounted
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="entropyrl"):
            for config_name, pick in picks:
                cfg = hydra_compose(config_name=config_name, overrides=[pick], return_hydra_config=True)
                choices = OmegaConf.to_container(cfg.hydra.runtime.choices, resolve=False)
                choices = {str(k): None if v is None else str(v) for k, v in choices.items() if not str(k).startswith("hydra/")}
                plain = OmegaConf.to_container(cfg, resolve=False)
                del plain["hydra"]
                docs = {**intervention_docs, **{k: v for k, v in key_docs(config_name, choices).items() if v.strip()}}
                undocumented = [key for key in _leaves(plain) if not docs.get(key, "").strip()]
                if undocumented:
                    missing[f"{config_name} {pick}"] = undocumented
    finally:
        GlobalHydra.instance().clear()
        mount_interventions()  # back as compose leaves it
    assert not missing, f"keys without a comment where declared: {missing}"


def test_the_sweeps_config_takes_the_sweeps_own_command_line(cli_in_process):
    """`config show --for sweep ablation=gate trainer.total_steps=20` (a line `entropyrl sweep` takes) was
    "unknown config key 'trainer.total_steps'". Null: a mistyped training key is still refused."""
    for line in (["trainer.total_steps=20"], ["train.trainer.total_steps=20"]):
        out = cli_in_process("config", "show", "--for", "sweep", "ablation=gate", *line)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("# every job's training overrides (after its variant's): trainer.total_steps=20\n")
        assert "ablation:" in out.stdout
    bad = cli_in_process("config", "show", "--for", "sweep", "ablation=gate", "trainer.total_stepz=20")
    assert bad.returncode != 0 and "unknown config key 'trainer.total_stepz'" in bad.stderr
