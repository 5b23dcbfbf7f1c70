"""Config composition: every group option composes, keys later tooling relies on exist, every YAML
documents itself."""

from __future__ import annotations

import pytest

from entropyrl.conf import CONF_DIR, compose, config_groups
from entropyrl.core.errors import UserError

TRAIN_GROUPS = ("algo", "model", "data", "rollout", "tracking")


def test_default_train_config_has_stable_keys():
    cfg = compose("train")
    for key in ("trainer.total_steps", "trainer.seed", "trainer.val_every", "output_dir", "tracking.experiment"):
        node = cfg
        for part in key.split("."):
            assert part in node, key
            node = node[part]
    assert cfg.algo.name == "grpo" and cfg.model.name == "tiny" and cfg.data.name == "countdown"


@pytest.mark.parametrize("group", TRAIN_GROUPS)
def test_every_option_of_every_train_group_composes(group):
    options = config_groups()[group]
    assert options
    for option in options:
        cfg = compose("train", [f"{group}={option}"])
        assert cfg[group].name == option, f"{group}/{option}.yaml must set name: {option}"


def test_overrides_apply_and_output_dir_is_per_run():
    cfg = compose("train", ["trainer.total_steps=40", "trainer.seed=3", "algo=dapo"])
    assert cfg.trainer.total_steps == 40 and cfg.algo.clip.high == 0.28
    assert "dapo-s3" in cfg.output_dir


def test_unknown_option_lists_choices():
    with pytest.raises(UserError, match=r"unknown algo=bogus; valid: .*grpo"):
        compose("train", ["algo=bogus"])


def test_every_yaml_documents_itself_with_an_example():
    for path in CONF_DIR.rglob("*.yaml"):
        text = path.read_text()
        head = [line for line in text.splitlines()[:25] if line.startswith("#")]
        assert head, f"{path} has no header comment"
        assert any("entropyrl " in line for line in head), f"{path}: header shows no example command"


@pytest.mark.parametrize("override", ["launcher=slurm", "+launcher=slurm", "launcher.partition=gpu"])
def test_train_has_no_launcher_and_says_launchers_are_for_sweeps(override):
    assert "launcher" not in compose("train")
    with pytest.raises(UserError, match=r"is for sweeps: launchers are for `entropyrl sweep`"):
        compose("train", [override])
    assert compose("sweep", ["launcher=slurm"], validate=False).launcher.name == "slurm"  # the sweep keeps its group
