"""The typed settings of the engines and the tool driver (``rollout/settings.py``) hold every key of
their config sections, with the composed default config's values as their defaults: code and YAML
cannot disagree silently."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.rollout.settings import SamplingSettings, ToolSettings, ToolShaping

# sections handed on whole, whose keys and defaults belong to their readers: the algorithm's
# truncated-IS intervention (trainers/interventions/tis.py), the tool sandbox (evals/code/tool_executor.py)
PASSED_ON = {"tis", "executor"}


def fields_of(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def default_of(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def section(cfg, key: str) -> dict:
    return OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=True)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_every_key_of_an_engine_section_is_a_field(engine):
    keys = set(section(compose("train", [f"rollout={engine}"]), "rollout"))
    assert keys - set(fields_of(SamplingSettings)) == set()


def test_every_key_of_the_eval_engine_sections_is_a_field():
    ev = section(compose("eval", ["tracking.enabled=false"]), "eval")
    assert set(ev["vllm"]) - set(fields_of(SamplingSettings)) == set()


@pytest.mark.parametrize("preset", ["none", "code_interpreter"])
def test_every_key_of_the_tools_section_is_a_field(preset):
    tools = section(compose("train", [f"tools={preset}"]), "tools")
    assert set(tools) - set(fields_of(ToolSettings)) == set()
    assert set(tools["shaping"]) - set(fields_of(ToolShaping)) == set()


def assert_defaults_match(cls, yaml: dict, skip=()) -> None:
    for name, f in fields_of(cls).items():
        if name not in yaml or name in skip or name in PASSED_ON:
            continue
        default = default_of(f)
        if dataclasses.is_dataclass(default):
            assert_defaults_match(type(default), yaml[name])
        else:
            assert default == yaml[name], f"{cls.__name__}.{name} defaults to {default!r}, the config to {yaml[name]!r}"


def test_the_engine_defaults_are_the_composed_configs_values():
    assert_defaults_match(SamplingSettings, section(compose("train", []), "rollout"))
    # vllm's own keys too; its name is its own
    assert_defaults_match(SamplingSettings, section(compose("train", ["rollout=vllm"]), "rollout"), skip={"name"})


def test_the_tool_defaults_are_the_composed_configs_values():
    assert_defaults_match(ToolSettings, section(compose("train", []), "tools"))


def test_a_partial_section_takes_the_defaults_and_null_is_the_default():
    got = SamplingSettings.from_config({"batch_size": 3, "top_p": None, "temperature": 0})
    assert got.batch_size == 3 and got.top_p == 1.0 and got.temperature == 0.0
    assert got.max_new_tokens == SamplingSettings().max_new_tokens
    assert SamplingSettings.from_config(got) is got
    assert got["batch_size"] == 3 and got.get("top_k") == 0 and got.get("nothing", 5) == 5
    tools = ToolSettings.from_config(OmegaConf.create({"max_turns": 2, "shaping": {"call_bonus": 0.5}}))
    assert tools.max_turns == 2 and tools.shaping == ToolShaping(call_bonus=0.5, error_penalty=0.0)
    assert ToolSettings.from_config(None) == ToolSettings()
