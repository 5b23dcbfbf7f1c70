"""The asynchronous path's typed settings (``trainers/asynchronous/settings.py``) declare each default
once, as the composed ``train`` config's value: code and YAML cannot disagree silently, and a
config that leaves a key out (one from before ``trainer.staleness`` existed) runs as the composed
default would."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf, open_dict

from entropyrl.conf import compose
from entropyrl.trainers.asynchronous.settings import TRAINER_KEYS, AsyncSettings, check_async_settings

# the fields that are rollout keys, under another name where the field's says what it is for
ROLLOUT_KEYS = {"engine": "name", "tensor_parallel_size": "tensor_parallel_size"}


def test_the_trainer_and_engine_keys_are_every_field():
    assert set(TRAINER_KEYS) | set(ROLLOUT_KEYS) == {f.name for f in dataclasses.fields(AsyncSettings)}


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_the_defaults_are_the_composed_configs_values(engine):
    cfg = OmegaConf.to_container(compose("train", [f"rollout={engine}"]), resolve=True)
    for name in TRAINER_KEYS:
        default = getattr(AsyncSettings, name)
        assert default == cfg["trainer"][name], f"AsyncSettings.{name}: {default!r}, the config: {cfg['trainer'][name]!r}"
    assert AsyncSettings.from_config(compose("train", [f"rollout={engine}"])).engine == engine
    if engine == "hf":  # the composed default's engine; vllm's own keys are vllm's
        assert AsyncSettings.engine == cfg["rollout"]["name"]
    else:
        assert AsyncSettings.tensor_parallel_size == cfg["rollout"]["tensor_parallel_size"]
    assert AsyncSettings.from_config(compose("train", [f"rollout={engine}"])) == AsyncSettings(engine=engine)


def test_a_missing_or_null_key_takes_the_default():
    cfg = compose("train", ["trainer.staleness=2", "trainer.worker_stall_s=30"])
    assert AsyncSettings.from_config(cfg) == AsyncSettings(staleness=2, worker_stall_s=30.0)
    with open_dict(cfg):
        del cfg.trainer["staleness"]  # a config from before the key existed: the synchronous loop
        cfg.trainer.rollout_gpus = None
    assert AsyncSettings.from_config(cfg) == AsyncSettings(worker_stall_s=30.0)
    assert check_async_settings(cfg) == (0, 0)
    assert AsyncSettings.from_config({}) == AsyncSettings()
    built = AsyncSettings(staleness=1)
    assert AsyncSettings.from_config(built) is built
