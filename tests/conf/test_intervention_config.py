"""Intervention parameters live beside their module: one conf/intervention/<name>.yaml per
registered intervention, mounted by ``entropyrl.conf.compose`` at ``algo.<name>`` for every algo,
so presets, the command line and sweeps override them as before."""

from __future__ import annotations

import dataclasses
import re

import pytest
from omegaconf import OmegaConf

from entropyrl.conf import CONF_DIR, compose, intervention_defaults, intervention_names
from entropyrl.core.errors import UserError
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.interventions import INTERVENTIONS, build_intervention

YAMLS = sorted(p.stem for p in (CONF_DIR / "intervention").glob("*.yaml"))

#: `algo=stare`'s values for the embedded model on the default task (conf/algo/stare.yaml); the
#: published ones are `algo=stare_o1`'s.
EMBEDDED_STARE = {
    "stare.variant": "C2",
    "stare.adaptive": True,
    "stare.alpha": 0.05,
    "stare.w_max": 3.0,
    "stare.m_min": 0.1,
    "stare.h_tgt": 0.25,
}

#: What each preset changes from the published intervention parameters (composed before the
#: parameters moved out of conf/algo/grpo.yaml): {overrides: (algo.interventions, {name.key: value})}.
PRESETS = {
    ("algo=grpo",): ([], {}),
    ("algo=dapo",): ([], {}),
    ("algo=stare_o1",): (["stare"], {}),
    ("algo=stare",): (["stare"], EMBEDDED_STARE),
    ("algo=stare_c2",): (["stare"], {"stare.variant": "C2"}),
    ("algo=stare_adaptive",): (["stare"], {"stare.variant": "C2", "stare.adaptive": True}),
    ("algo=steer",): (["steer"], {}),
    ("algo=steer_linear",): (["steer"], {"steer.mapping": "linear", "steer.lambda_max": 1.2}),
    ("algo=clip_cov",): (["clip_cov"], {}),
    ("algo=kl_cov",): (["kl_cov"], {}),
    ("algo=high_entropy_mask",): (["high_entropy_mask"], {}),
    ("algo=sample_reweight",): (["sample_reweight"], {}),
    ("algo=entropy_bonus",): (["entropy_bonus"], {}),
    ("algo=adaptive_entropy",): (["adaptive_entropy"], {}),
    ("experiment=kl_cov_7b",): (["kl_cov"], {"kl_cov.ratio": 0.002}),
    ("experiment=stare_7b_short_cot",): (["stare"], {}),
    ("experiment=steer_7b",): (["steer"], {}),
    ("algo=stare", "algo.stare.h_tgt=0.5"): (["stare"], {**EMBEDDED_STARE, "stare.h_tgt": 0.5}),
    ("algo=grpo", "algo.interventions=[stare,entropy_bonus]", "algo.stare.p=0.2"): (["stare", "entropy_bonus"], {"stare.p": 0.2}),
}


def test_every_intervention_has_one_yaml_whose_keys_are_its_params():
    params = {name: [f.name for f in dataclasses.fields(cls.Params)] for name, cls in INTERVENTIONS.items()}
    assert set(YAMLS) == {name for name, fields in params.items() if fields}
    for name in YAMLS:
        text = (CONF_DIR / "intervention" / f"{name}.yaml").read_text()
        assert list(intervention_defaults(name)) == params[name], name  # same keys, same order
        keys = [line for line in text.splitlines() if re.match(r"^\w+:", line)]
        assert all("#" in line for line in keys), f"{name}.yaml: comment every key where it is declared"
        assert f"algo.{name}" in text, name
    assert set(YAMLS) <= set(intervention_names())


def test_params_dataclasses_do_not_repeat_the_published_values():
    for name in YAMLS:
        fields = dataclasses.fields(INTERVENTIONS[name].Params)
        assert all(f.default is dataclasses.MISSING for f in fields), f"{name}: the values live in its YAML"


@pytest.mark.parametrize("overrides", list(PRESETS), ids=" ".join)
def test_presets_compose_the_published_parameters_with_their_own_changes(overrides):
    active, changes = PRESETS[overrides]
    algo = OmegaConf.to_container(compose("train", list(overrides)).algo)
    assert algo["interventions"] == active
    for name in YAMLS:
        expected = dict(intervention_defaults(name))
        expected.update({k.split(".", 1)[1]: v for k, v in changes.items() if k.startswith(f"{name}.")})
        assert algo[name] == expected, name


def test_a_section_left_out_takes_the_published_values():
    built = build_intervention("stare", {"p": 0.2})
    assert built.params.p == 0.2 and built.params.h_tgt == intervention_defaults("stare")["h_tgt"]
    assert (
        Algorithm.from_config({"interventions": ["kl_cov"]}, max_response_length=4).interventions[0].params.ratio
        == intervention_defaults("kl_cov")["ratio"]
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.stare.bogus=1"], "unknown config key 'algo.stare.bogus'"),
        (["algo=stare", "algo.stare.p=2"], "algo.stare.p=2 is not allowed"),
    ],
)
def test_bad_intervention_overrides_are_one_line_errors(overrides, message, tmp_path):
    # an unknown key fails the composition; a bad value the pre-flight check (the Params' ranges)
    from entropyrl.trainers.preflight import check_training

    with pytest.raises(UserError, match=re.escape(message)):
        check_training(compose("train", [*overrides, f"output_dir={tmp_path / 'run'}"]))


def test_bad_values_are_rejected_by_the_params():
    with pytest.raises(UserError, match="unknown algo.stare.variant=C3; valid: C2, O1"):
        build_intervention("stare", {"variant": "C3"})
    with pytest.raises(UserError, match="algo.kl_cov.kappa must be a number"):
        build_intervention("kl_cov", {"kappa": "big"})
    with pytest.raises(UserError, match=r"unknown key\(s\) algo.tis.bogus"):
        build_intervention("tis", {"bogus": 1})
