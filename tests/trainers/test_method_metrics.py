"""Every method logs a metric of its own, so a run shows that switching it on acted.

The rule, over the registries themselves (a method added to one is checked without editing a list):

- a method is an intervention (``INTERVENTIONS``) or a policy objective (``POLICY_OBJECTIVES``);
- its own metrics are the keys it declares (``Intervention.logged_metrics``, or the objective's
  ``register_objective(..., logged_metrics=...)``, ``OBJECTIVE_METRICS``) that plain GRPO (the
  ``ppo_clip`` objective, no intervention) does not log: a shared key (``loss/policy``,
  ``clip/frac``, ``entropy/update``) tells nothing about the method;
- one short loss on a synthetic step batch (plus the controller state after ``begin_step``) must
  log at least one of them, finite;
- the baseline itself (objective ``ppo_clip``, intervention ``none``) is exempt: it is what the
  others are told apart from.

Each ``conf/algo/*.yaml`` is then a combination of those: an algo that switches on an objective or
an intervention logs their metrics. An algo that differs from ``grpo`` only in its advantage
estimator, loss aggregation, clip range, KL or DAPO's sampling switches (``rloo``, ``opo``,
``reinforce_pp``, ``drgrpo``, ``dapo``) changes the advantages, the aggregation or the batch, which
``tests/trainers/test_accepted_keys.py`` checks act; DAPO's switches log
``dynamic_sampling/*`` and ``overlong/*`` where the batch is collected, not in the loss.
"""

from __future__ import annotations

import math

import pytest
import torch

from entropyrl.conf import compose
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.algos.objectives import OBJECTIVE_METRICS, POLICY_OBJECTIVES, gspo_objective, sapo_objective
from entropyrl.trainers.interventions import INTERVENTIONS

from .test_method_invariants import algo_for, run_loss, step_batch

BASELINE = {("objective", "ppo_clip"), ("intervention", "none")}
#: the algo keys whose change is the estimator's, not a method's (see the module docstring)
ESTIMATOR_KEYS = {"name", "advantage", "loss_agg", "loss_agg_norm", "clip", "kl_coef", "dynamic_sampling", "overlong"}


def declared(kind: str, name: str) -> tuple[str, ...]:
    return tuple(INTERVENTIONS[name].logged_metrics) if kind == "intervention" else OBJECTIVE_METRICS.get(name, ())


def logged(algo: Algorithm, seed: int = 1) -> dict[str, float]:
    """What one micro-batch loss of ``algo`` logs on a synthetic step batch, with its controller state."""
    algo.begin_step(0.1)
    batch = step_batch(seed=seed)
    batch.advantages = algo.advantages(batch.rewards, batch.group_ids, batch.mask, entropy=batch.entropy)
    _, out = run_loss(algo, algo.select(batch, "batch"))
    return {**out.metrics, **algo.step_metrics()}


def baseline_keys() -> set[str]:
    return set(logged(Algorithm.from_config({}, max_response_length=5, seed=3)))


def own_metrics(kind: str, name: str) -> dict[str, float]:
    """The method's own metrics that one loss logged: declared, not the baseline's, finite."""
    got = logged(algo_for(kind, name))
    shared = baseline_keys()
    return {k: got[k] for k in declared(kind, name) if k in got and k not in shared and math.isfinite(float(got[k]))}


def methods() -> list[tuple[str, str]]:
    return [("intervention", n) for n in sorted(INTERVENTIONS)] + [("objective", n) for n in sorted(POLICY_OBJECTIVES)]


@pytest.mark.parametrize("kind, name", [m for m in methods() if m not in BASELINE], ids=lambda x: x)
def test_every_method_logs_a_metric_of_its_own(kind, name):
    assert declared(kind, name), f"{kind} {name} declares no metric of its own (logged_metrics)"
    assert own_metrics(kind, name), f"{kind} {name}: none of its declared metrics {declared(kind, name)} was logged"


def test_a_method_without_its_own_metric_fails_the_rule():
    """The rule can fail: an objective that logs only the shared keys has no metric of its own."""

    def silent(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_c=None):
        out = gspo_objective(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high)
        return out._replace(metrics=None)

    POLICY_OBJECTIVES["test_silent"] = silent
    OBJECTIVE_METRICS["test_silent"] = ("clip/frac",)  # a shared key does not count
    try:
        assert ("objective", "test_silent") in methods()
        assert own_metrics("objective", "test_silent") == {}
    finally:
        POLICY_OBJECTIVES.pop("test_silent", None)
        OBJECTIVE_METRICS.pop("test_silent", None)


def _algo_names() -> list[str]:
    from entropyrl.conf import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / "algo").glob("*.yaml"))


def test_every_algo_option_logs_its_methods_or_only_changes_the_estimator():
    base = compose("train", ["tracking.enabled=false"]).algo
    for name in _algo_names():
        cfg = compose("train", [f"algo={name}", "tracking.enabled=false"])
        algo = Algorithm.from_train_config(cfg)
        parts = [("objective", algo.objective)] + [("intervention", n) for n in algo.intervention_names]
        parts = [p for p in parts if p not in BASELINE]
        if not parts:
            changed = {k for k in cfg.algo if k not in ("interventions", "objective") and cfg.algo[k] != base.get(k)}
            changed -= {n for n in INTERVENTIONS}  # the mounted parameter sections of unused interventions
            assert changed <= ESTIMATOR_KEYS, (
                f"algo={name} changes {sorted(changed - ESTIMATOR_KEYS)} and logs nothing of its own"
            )
            continue
        got = logged(algo)
        for kind, method in parts:
            assert any(k in got for k in declared(kind, method)), f"algo={name}: {method} logged none of {declared(kind, method)}"


def test_objective_metrics_are_what_they_say():
    """Hand-made cases: each number is the definition, and it moves when the objective acts."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    # response 0: mean log-ratio 0.5 (s = e^0.5 > 1 + 0.2, A > 0: clipped); response 1: 0 (s = 1: kept)
    logp = torch.tensor([[0.5, 0.5, 9.0], [0.0, 0.0, 0.0]])
    m = gspo_objective(logp, old, adv, mask, eps_low=0.2, eps_high=0.2).metrics
    assert float(m["gspo/seq_clip_frac"]) == pytest.approx(0.5)
    assert float(m["gspo/seq_ratio_mean"]) == pytest.approx((math.exp(0.5) + 1.0) / 2, rel=1e-6)
    # on policy SAPO's gate is 1 everywhere; off policy it attenuates
    on = sapo_objective(old, old, adv, mask).metrics
    assert float(on["sapo/gate_mean"]) == pytest.approx(1.0) and float(on["sapo/gate_min"]) == pytest.approx(1.0)
    off = sapo_objective(logp, old, adv, mask).metrics
    sig = torch.sigmoid(torch.tensor(math.exp(0.5) - 1.0))
    assert float(off["sapo/gate_min"]) == pytest.approx(float(4 * sig * (1 - sig)), rel=1e-5)
    assert float(off["sapo/gate_mean"]) < 1.0
    from entropyrl.trainers.algos.objectives import cispo_objective, gmpo_objective

    c = cispo_objective(logp, old, adv, mask, eps_low=1.0, eps_high=0.2).metrics
    assert float(c["cispo/is_clip_frac"]) == pytest.approx(2 / 5)  # the two tokens at ratio e^0.5
    assert float(c["cispo/is_weight_mean"]) == pytest.approx((2 * 1.2 + 3 * 1.0) / 5, rel=1e-6)
    g = gmpo_objective(logp, old, adv, mask, eps_low=0.4, eps_high=0.4).metrics
    assert float(g["gmpo/clip_frac"]) == pytest.approx(2 / 5)  # log-ratio 0.5 > 0.4 with A > 0
    assert float(g["gmpo/log_ratio_mean"]) == pytest.approx(1.0 / 5)


def test_sample_reweight_says_which_tokens_it_reweighted():
    """Its null (both weights 1) reweights nothing; W-REINFORCE's (0.1, 1) the positive tokens only."""
    batch = step_batch(seed=2)
    pos = float(((batch.advantages > 0) & batch.mask.bool()).sum() / batch.mask.sum())
    for weights, frac in (((1.0, 1.0), 0.0), ((0.1, 1.0), pos)):
        cfg = {"interventions": ["sample_reweight"], "sample_reweight": {"pos_weight": weights[0], "neg_weight": weights[1]}}
        _, out = run_loss(Algorithm.from_config(cfg, max_response_length=5), batch)
        assert out.metrics["sample_reweight/reweighted_frac"] == pytest.approx(frac), weights
        assert out.metrics["sample_reweight/pos_frac"] == pytest.approx(pos)
    assert 0.0 < pos < 1.0  # the batch has both kinds, so the two cases differ


def test_objective_metrics_on_their_null_say_nothing_acted():
    """The null of every objective: the policy that sampled is the one trained (ratio 1 everywhere).
    No sequence, token or weight is clipped and SAPO's gate is fully open: a metric that read
    otherwise here would credit the objective with an effect it did not have."""
    from entropyrl.trainers.algos.objectives import cispo_objective, gmpo_objective

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    logp = torch.tensor([[-0.3, -1.2, 0.0], [-0.7, -0.1, -2.0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    assert float(gspo_objective(logp, logp, adv, mask, eps_low=0.2, eps_high=0.2).metrics["gspo/seq_clip_frac"]) == 0.0
    assert float(gmpo_objective(logp, logp, adv, mask, eps_low=0.4, eps_high=0.4).metrics["gmpo/clip_frac"]) == 0.0
    c = cispo_objective(logp, logp, adv, mask, eps_low=1.0, eps_high=0.2).metrics
    assert float(c["cispo/is_clip_frac"]) == 0.0 and float(c["cispo/is_weight_mean"]) == pytest.approx(1.0)
    assert float(sapo_objective(logp, logp, adv, mask).metrics["sapo/gate_mean"]) == pytest.approx(1.0)
