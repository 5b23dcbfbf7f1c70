"""Invariants every method must keep, run over the registries themselves (``INTERVENTIONS``,
``POLICY_OBJECTIVES``), so a method added to a registry is checked without editing a test list:

- the loss is pure: it changes no state of the algorithm or its interventions, calls no
  ``autograd.grad``, and gives a finite loss with a gradient;
- the method's published parameters (``conf/intervention/<name>.yaml``, or its ConfigStore node)
  have exactly the keys of its ``Params``;
- the metrics it declares (``Intervention.logged_metrics``) are what its loss logs;
- it has golden vectors (``tests/golden/``).

``test_a_method_registered_by_a_test_is_checked_by_every_invariant`` registers one from this file
and runs every check on it: the checks take their methods from the registries at run time.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass

import pytest
import torch
from hydra.core.config_store import ConfigStore

from entropyrl.conf import intervention_defaults
from entropyrl.rollout.base import Rollout
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.algos.objectives import POLICY_OBJECTIVES
from entropyrl.trainers.algos.step_batch import StepBatch
from entropyrl.trainers.interventions import INTERVENTIONS, Intervention, LossContext, register_intervention

from ..conftest import GOLDEN

#: The golden-vector file that pins each method's math (an independent numpy re-derivation or the
#: reference code's output; tests/golden/README.md). A method missing here fails
#: ``test_every_method_has_golden_vectors``.
GOLDEN_FILES = {
    "none": None,  # plain GRPO: surrogate.json pins it
    "stare": "stare.json",
    "steer": "steer.json",
    "clip_cov": "cov.json",
    "kl_cov": "cov.json",
    "entropy_bonus": "lab_fixes.json",
    "adaptive_entropy": "adaptive_entropy.json",
    "high_entropy_mask": "high_entropy_mask.json",
    "sample_reweight": "sample_reweight.json",
    "ce_gppo": "ce_gppo.json",
    "entropic": "entropic.json",
    "aent": "aent.json",
    "siren": "siren.json",
    "archer": "archer.json",
    "entropy_adv": "entropy_adv.json",
    "gtpo": "gtpo.json",
    "lp_reg": "lp_reg.json",
    "tis": "tis_modes.json",
    # objectives
    "ppo_clip": "surrogate.json",
    "gspo": "gspo.json",
    "gmpo": "gmpo.json",
    "cispo": "cispo.json",
    "sapo": "sapo.json",
}


def step_batch(B=6, T=5, seed=1) -> StepBatch:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    mask[:, 0] = 1.0
    roll = Rollout(
        prompt_ids=torch.arange(B * 3).view(B, 3),
        prompt_mask=torch.ones(B, 3, dtype=torch.long),
        response_ids=torch.arange(B * T).view(B, T),
        response_mask=mask.long(),
        texts=[f"r{i}" for i in range(B)],
        truncated=torch.zeros(B, dtype=torch.bool),
        sampling_logp=torch.randn(B, T, generator=g).abs().neg(),
    )
    rnd = lambda: torch.randn(B, T, generator=g)  # noqa: E731
    old = -rnd().abs()
    return StepBatch(
        roll,
        rewards=(torch.arange(B) % 2).float(),
        correct=(torch.arange(B) % 2).float(),
        group_ids=torch.arange(B) // 3,
        mask=mask,
        old_logp=old,
        entropy=rnd().abs() + 0.1,
        sampler_logp=old + 0.01 * rnd(),
        ref_logp=-rnd().abs(),
        advantages=rnd() * mask,
    )


def state_of(obj) -> dict:
    return {
        k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in vars(obj).items() if k != "interventions"
    }


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def algo_for(kind: str, name: str) -> Algorithm:
    cfg = {"interventions": [name]} if kind == "intervention" else {"objective": name}
    return Algorithm.from_config(cfg, max_response_length=5, seed=3)


def run_loss(algo: Algorithm, batch: StepBatch):
    """One micro-batch loss as the loop computes it, with the full-distribution statistics the
    interventions ask for (stand-ins of the right shape: the invariants do not depend on their values)."""
    logp = batch.old_logp.clone().add_(0.05).requires_grad_(True)
    entropy = batch.entropy.clone().requires_grad_(algo.needs_entropy_grad)
    vocab = {key: batch.entropy.clone() * 0.5 for key in algo.vocab_stats()}
    return logp, algo.micro_loss(batch, logp=logp, entropy=entropy, vocab=vocab)


# -- the checks: each takes a method's kind and name ------------------------------------------------


def check_loss_is_pure(kind: str, name: str, monkeypatch) -> None:
    algo = algo_for(kind, name)
    algo.begin_step(0.1)
    batch = algo.select(step_batch(), "batch")
    before = [state_of(algo)] + [state_of(iv) for iv in algo.interventions]
    saved = json.dumps(algo.state_dict(), sort_keys=True, default=str)
    calls = []
    real = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(2):
        logp, out = run_loss(algo, batch)
        out.loss.backward()
        assert logp.grad is not None and torch.isfinite(logp.grad).all(), name
    after = [state_of(algo)] + [state_of(iv) for iv in algo.interventions]
    assert calls == [], f"{name}: the loss called autograd.grad"
    assert all(same(b, a) for b, a in zip(before, after)), f"{name}: the loss changed state"
    assert json.dumps(algo.state_dict(), sort_keys=True, default=str) == saved, name
    assert torch.isfinite(out.loss), name


def check_params_match_published(kind: str, name: str) -> None:
    if kind != "intervention":
        return
    fields = [f.name for f in dataclasses.fields(INTERVENTIONS[name].Params)]
    published = intervention_defaults(name)
    if not fields:
        assert not published, f"{name}: published parameters for a method without Params"
        return
    assert published is not None and list(published) == fields, f"{name}: YAML keys {published} != Params {fields}"


def check_declared_metrics_are_logged(kind: str, name: str) -> None:
    if kind != "intervention":
        return
    algo = algo_for(kind, name)
    algo.begin_step(0.1)
    batch = step_batch()
    batch.advantages = algo.advantages(batch.rewards, batch.group_ids, batch.mask, entropy=batch.entropy)
    _, out = run_loss(algo, algo.select(batch, "batch"))
    logged = {**out.metrics, **algo.step_metrics()}
    for key in INTERVENTIONS[name].logged_metrics:
        assert key in logged and math.isfinite(float(logged[key])), f"{name}: declared metric {key} not logged"


CHECKS = (check_loss_is_pure, check_params_match_published, check_declared_metrics_are_logged)


def registered() -> list[tuple[str, str]]:
    """Every method the registries hold now."""
    return [("intervention", n) for n in sorted(INTERVENTIONS)] + [("objective", n) for n in sorted(POLICY_OBJECTIVES)]


@pytest.mark.parametrize("kind, name", registered(), ids=lambda x: x)
def test_every_method_keeps_the_invariants(kind, name, monkeypatch):
    check_loss_is_pure(kind, name, monkeypatch)
    check_params_match_published(kind, name)
    check_declared_metrics_are_logged(kind, name)


def test_the_parametrization_is_the_registry():
    names = {n for _, n in registered()}
    assert names == set(INTERVENTIONS) | set(POLICY_OBJECTIVES)
    assert len(INTERVENTIONS) >= 18 and len(POLICY_OBJECTIVES) >= 5


def test_every_method_has_golden_vectors():
    built_in = {n for n in set(INTERVENTIONS) | set(POLICY_OBJECTIVES) if not n.startswith("test_")}
    missing = sorted(built_in - set(GOLDEN_FILES))
    assert missing == [], f"methods without golden vectors (add them to tests/golden and GOLDEN_FILES): {missing}"
    for name, file in GOLDEN_FILES.items():
        if file is not None:
            assert (GOLDEN / file).is_file(), (name, file)


def test_a_method_registered_by_a_test_is_checked_by_every_invariant(monkeypatch):
    @register_intervention("test_halving")
    class Halving(Intervention):
        logged_metrics = ("test_halving/frac",)

        @dataclass
        class Params:
            factor: float = 0.5
            scope: str = "micro"

        def apply(self, ctx: LossContext) -> None:
            ctx.scale(torch.full_like(ctx.pg_loss, self.params.factor))
            ctx.metrics["test_halving/frac"] = 1.0

    ConfigStore.instance().store(group="intervention", name="test_halving", node=Halving.Params)
    try:
        assert ("intervention", "test_halving") in registered()
        for check in CHECKS:
            check("intervention", "test_halving", *([monkeypatch] if check is check_loss_is_pure else []))
        # and a method that breaks an invariant is caught
        Halving.logged_metrics = ("test_halving/never_logged",)
        with pytest.raises(AssertionError, match="never_logged"):
            check_declared_metrics_are_logged("intervention", "test_halving")

        class Leaky(Halving):
            def apply(self, ctx: LossContext) -> None:
                self.seen = getattr(self, "seen", 0) + 1  # a side effect in the loss
                super().apply(ctx)

        INTERVENTIONS["test_halving"] = Leaky
        with pytest.raises(AssertionError, match="changed state"):
            check_loss_is_pure("intervention", "test_halving", monkeypatch)
    finally:
        INTERVENTIONS.pop("test_halving", None)
        ConfigStore.instance().repo["intervention"].pop("test_halving.yaml", None)
