"""Advice that helps. An unknown key names the key it is close to (never
the `+key` advice that made a silent no-op key), a near-miss `+key` is refused, a parameter of an
intervention the algo does not apply is refused, an unknown intervention is refused at compose time
(as `train` refuses it). Real Hydra composition of the shipped configs."""

from __future__ import annotations

import re

import pytest

from entropyrl.conf import compose
from entropyrl.core.errors import UserError


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.total_step=5"], "unknown config key 'trainer.total_step' (did you mean `trainer.total_steps`?)"),
        (["+trainer.total_step=5"], "+trainer.total_step adds a key that nothing reads (did you mean `trainer.total_steps`?)"),
        # a name the key begins: it was "did you mean `rollout.top_p`" (closest spelling, cutoff missed it)
        (["+rollout.temp=0.5"], "+rollout.temp adds a key that nothing reads (did you mean `rollout.temperature`?)"),
        (["trainer.tot=3"], "unknown config key 'trainer.tot' (did you mean `trainer.total_steps`?)"),
        (["algo.stare.p=0.2"], "algo.stare.p=0.2 sets a parameter of the stare intervention, which algo=grpo does not apply"),
        (["algo=dapo", "algo.steer.lambda_min=0.5"], "which algo=dapo does not apply"),
        (["algo.interventions=[stareX]"], "unknown algo.interventions entry=stareX; valid: "),
        # a mapping's entries (tracking.tags: "e.g. {team: rl}") were "unknown config key 'tracking.tags'
        # (did you mean `tracking.tags`?)", and the + form "adds a key that nothing reads"
        (
            ["tracking.tags={team:rl}"],
            "tracking.tags is a mapping: its entries are added with a +: write +tracking.tags={team:rl}",
        ),
        (["tracking.tags.team=rl"], "tracking.tags is a mapping: its entries are added with a +: write +tracking.tags.team=rl"),
        (["rollout.engine_kwargs={swap_space:4}"], "rollout.engine_kwargs is a mapping: its entries are added with a +"),
        # the null: a key a data= option lacks is unknown, not a mapping entry (data.* is the option's own)
        (["data.path=/tmp/mine.jsonl"], "data=dapo_math_17k data.path=FILE"),
    ],
)
def test_advice_names_the_fix(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)) as info:
        compose("train", overrides)
    assert "prefix with +" not in str(info.value) and "\n" not in str(info.value)


def test_parameters_of_an_applied_intervention_and_new_keys_still_compose():
    assert compose("train", ["algo=stare", "algo.stare.p=0.2"]).algo.stare.p == 0.2
    cfg = compose("train", ["algo.interventions=[entropy_bonus]", "algo.entropy_bonus.coef=0.01"])
    assert cfg.algo.entropy_bonus.coef == 0.01
    assert compose("train", ["+val.my_note=1"]).val.my_note == 1  # far from any key: allowed
    assert dict(compose("train", ["+tracking.tags.team=rl"]).tracking.tags) == {"team": "rl"}  # a mapping's entry
    assert dict(compose("train", ["+tracking.tags={team:rl}"]).tracking.tags) == {"team": "rl"}
