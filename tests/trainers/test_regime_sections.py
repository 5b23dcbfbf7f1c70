"""The run report's regime checks read an ``algo`` or ``data`` section that leaves keys out (a
section built by hand, a config saved before a key existed) through the declared defaults:
STARE's gate from ``conf/intervention/stare.yaml``, the algorithm's name from
``conf/algo/grpo.yaml``; a data section without a name gets advice that names no task."""

from __future__ import annotations

from entropyrl.conf import intervention_defaults
from entropyrl.trainers.algos.algo_config import default
from entropyrl.trainers.run.regime import entropy_target, harder_groups_advice, regime_warnings


def test_a_stare_section_without_a_gate_steers_as_the_published_gate_says():
    assert intervention_defaults("stare")["gate"] is True  # the published setting the reads below fall back to
    assert entropy_target({"interventions": ["stare"], "stare": {"h_tgt": 0.3}}) == 0.3
    # null: the gate read from the section itself (open-loop STARE steers to no level)
    assert entropy_target({"interventions": ["stare"], "stare": {"h_tgt": 0.3, "gate": False}}) is None


def test_an_unnamed_algo_section_is_named_by_the_declared_default():
    rows = [{"step": s, "groups/all_equal_frac": 0.9} for s in range(1, 5)]
    (finding,) = regime_warnings(rows, {"interventions": []})
    assert finding["id"] == "all_equal_groups"
    assert finding["message"].split(" has little")[0].endswith(f"(zero advantage): {default('name')}")
    (named,) = regime_warnings(rows, {"name": "stare", "interventions": []})
    assert "(zero advantage): stare has little" in named["message"]


def test_advice_for_a_data_section_without_a_name_names_no_task():
    assert harder_groups_advice({}, {}).startswith("harder problems,")
    assert harder_groups_advice({}, {"name": "toy"}).startswith("a harder task (data=countdown)")
    assert harder_groups_advice({}, {"name": "gsm8k"}).startswith("harder problems for data=gsm8k")


def test_a_sampler_far_from_the_policy_is_a_finding_of_the_run():
    """``sampler_far_from_policy``: the run's mean ``rollout/logp_diff_mean`` beyond log(1 + clip.high)."""
    import math

    far = [{"step": s, "rollout/logp_diff_mean": 0.74} for s in range(1, 6)]
    (finding,) = regime_warnings(far, {"name": "grpo", "interventions": []})
    assert finding["id"] == "sampler_far_from_policy" and finding["first_step"] == 1
    assert f"log(1 + algo.clip.high) = {math.log1p(default('clip.high')):.2f}" in finding["message"]
    near = [{"step": s, "rollout/logp_diff_mean": 0.03} for s in range(1, 6)]
    assert regime_warnings(near, {"name": "grpo", "interventions": []}) == []  # null: a sampler near the policy
    assert regime_warnings([{"step": 1, "entropy": 1.0}], {"interventions": []}) == []  # no log-probs reported
    wide = {"name": "grpo", "interventions": [], "clip": {"high": 1.5}}  # log(2.5) = 0.92: the same gap is inside
    assert regime_warnings(far, wide) == []
