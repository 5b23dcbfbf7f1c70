"""A key that is accepted is read: every parameter of every registered method, and every key of the
algorithm, changes something when it changes, or its new value is refused (``UserError``).

"Something" is what the key's owner hands the rest of the run, on a synthetic four-step trajectory
(two micro-batches a step, the step controllers fed entropies on both sides of their targets, the
full-distribution statistics computed by their registered functions from random logits, and a
second data-parallel rank simulated at the end of each step: one like this rank, or for a key
that acts across ranks (``OTHER_RANK``) one that differs): the loss, its gradient, the logged
metrics, the controller state, the rewards after shaping, the groups kept, the advantages and the
batch selections. A perturbation is tried from a list of candidate values; the key passes when one
accepted value changes something, or when every candidate is refused. A parameter accepted at every
value and changing nothing fails the test with its name. A parameter that acts only when another
is set (STARE's ``alpha`` under ``adaptive``) is tried with that one set (``CONTEXT``).

Over the registries and ``ALGO_KEYS`` themselves, so a new method or key is checked without editing
a list. Left out (``SKIP``, empty today): none; the keys read outside the algorithm
facade (``READ_ELSEWHERE``: the file that reads each is checked to name it). The rollout engines' keys: ``test_every_engine_key_is_read``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from entropyrl.conf import intervention_defaults
from entropyrl.core.errors import UserError
from entropyrl.core.schema import defaults as schema_defaults
from entropyrl.core.schema.rollout import ROLLOUT_SCHEMAS
from entropyrl.trainers.algos import core_algos, objectives
from entropyrl.trainers.algos.algo_config import ALGO_KEYS, CONTROLLER_ENTROPY, algo_defaults
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.interventions import INTERVENTIONS

from .test_method_invariants import step_batch

ROOT = Path(__file__).resolve().parents[2]
SKIP: set[tuple[str, str]] = set()  # (intervention, key) left out, each with its reason in the docstring
#: algo keys whose reader is not the facade: key -> (file, text that must appear there)
READ_ELSEWHERE = {
    "overlong.filter": ("trainers/settings.py", '"overlong.filter"'),
    "dynamic_sampling.max_num_gen_batches": ("trainers/collect.py", "max_num_gen_batches"),
}
#: algo keys that are labels, not behaviour
LABELS = {"name"}
ENTROPIES = (0.02, 0.6, 0.2, 0.05)  # step readings on both sides of every controller's target
VOCAB = 16  # the random logits' vocabulary (the statistics' parameters must see a distribution)
#: the parameters set so that the others can act (by method, or by (method, key)): STARE's and
#: AEnt's controllers move (adaptive on, no warm-up), STEER's lambda_max is read (the linear
#: mapping), Clip-Cov's window and Lp-Reg's selection hold tokens
CONTEXT: dict = {
    "stare": {"adaptive": True},
    "aent": {"warmup_steps": 0},
    ("aent", "coef_min"): {"lr": 1.0},  # a step large enough to reach the bounds
    ("aent", "coef_max"): {"lr": 1.0},
    ("steer", "lambda_max"): {"mapping": "linear"},
    "clip_cov": {"lb": -5.0},
    "lp_reg": {"rho": 0.5, "rho_pos": 0.5},
    # a tis mode's own bounds act in that mode
    ("tis", "icepop_low"): {"mode": "icepop"},
    ("tis", "icepop_high"): {"mode": "icepop"},
    ("tis", "seq_low"): {"mode": "seq_mask"},
    ("tis", "seq_high"): {"mode": "seq_mask"},
    ("tis", "m2_threshold"): {"mode": "m2po"},
    ("tis", "m2po_clip"): {"mode": "m2po"},
    ("tis", "scope"): {"mode": "m2po"},
}
#: the logits' sharpness by step: peaked and flat distributions, so statistics cross their thresholds
SHARPNESS = (200.0, 200.0, 0.5, 200.0)


def _identical_rank(t):
    """``reduce`` (the sum over ranks) with a second rank that recorded what this one did."""
    return 2 * torch.as_tensor(t)


def _other_rank(t):
    """``reduce`` with a second rank that recorded one more unit of everything (its means differ)."""
    t = torch.as_tensor(t)
    return t + torch.ones_like(t)


#: the (method, key)s whose effect is across ranks: a second rank that differs from this one
OTHER_RANK = {("aent", "scope")}


def _vocab(asked: dict, shape, seed: int, step: int) -> dict[str, torch.Tensor]:
    """The statistics ``asked`` (``{key: (name, params)}``) of random logits ``[*shape, VOCAB]``
    as sharp as step ``step``'s (``SHARPNESS``)."""
    from entropyrl.trainers.stats.vocab_stats import VOCAB_STATS

    z = torch.randn(*shape, VOCAB, generator=torch.Generator().manual_seed(seed)) * SHARPNESS[step]
    return {k: VOCAB_STATS.lookup(name)(z, **dict(params)) for k, (name, params) in asked.items()}


def fingerprint(algo: Algorithm, reduce=_identical_rank) -> str:
    """Everything ``algo`` hands the run over a short trajectory, as one string (exact values)."""
    rec: list = [algo.needs_ref, algo.needs_entropy_grad]
    for t, h in enumerate(ENTROPIES):
        algo.begin_step(h)
        rec.append(sorted(algo.step_metrics().items()))
        batch = step_batch(B=6, T=5, seed=10 + t)
        wanted = algo.sampling_vocab_stats()
        if wanted:
            algo.observe_sampling(_vocab(wanted, batch.mask.shape, 50 + t, t), batch.mask)
        lengths = batch.mask.sum(-1)
        rec.append(algo.shape_rewards(batch.rewards, lengths).tolist())
        rec.append(algo.keep_groups(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), batch.group_ids).tolist())
        rec.append(algo.controller_reading(0.3, 0.1))
        batch.advantages = algo.advantages(batch.rewards, batch.group_ids, batch.mask, entropy=batch.entropy)
        rec.append(batch.advantages.tolist())
        batch = algo.select(algo.select(batch, "batch"), "mini")
        rec.append({k: v.tolist() for k, v in sorted(batch.selections.items())})
        g = torch.Generator().manual_seed(100 + t)
        for j, idx in enumerate((torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5]))):
            micro = batch[idx]
            logp = (micro.old_logp + 0.8 * torch.randn(micro.old_logp.shape, generator=g)).clamp(max=-1e-3)
            logp.requires_grad_(True)
            entropy = (micro.entropy * 1.1).requires_grad_(algo.needs_entropy_grad)
            vocab = _vocab(algo.vocab_stats(), micro.mask.shape, 70 + 2 * t + j, t)
            out = algo.micro_loss(micro, logp=logp, entropy=entropy, vocab=vocab)
            out.loss.backward()
            rec += [float(out.loss.detach()), sorted(out.metrics.items()), logp.grad.tolist()]
            algo.after_loss(out)
        algo.end_step(reduce)
        rec.append(algo.state_dict())
    return json.dumps(rec, sort_keys=True, default=str)


def candidates(value, choices=()) -> list:
    """Other values to try for a parameter whose default is ``value``."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, str) or value is None and choices:
        return [c for c in choices if c != value]
    if isinstance(value, int):
        return [v for v in dict.fromkeys([0, 1, 3, value * 2, value // 2, value + 1]) if v != value]
    if isinstance(value, float):
        return [
            v
            for v in dict.fromkeys([value * 2, value / 2, value * 1e-3, value + 0.5, 0.0, 1.0, 0.9, 0.05, 3.0, 10.0])
            if v != value
        ]
    if value is None:
        return [1.0, 2.0, 10.0]
    return []


def verdict(build, key: str, value, choices=(), reduce=_identical_rank) -> str:
    """``"acts"``, ``"refused"`` or ``"ignored"`` for the parameter ``key`` at default ``value``;
    ``build(v)`` makes the algorithm with the parameter set to ``v`` (``UserError`` when refused)."""
    base = fingerprint(build(value), reduce)
    accepted = False
    for v in candidates(value, choices):
        try:
            algo = build(v)
        except UserError:
            continue
        accepted = True
        if fingerprint(algo, reduce) != base:
            return "acts"
    return "ignored" if accepted else "refused"


def string_choices(module_name: str, default) -> tuple:
    """The choice tuples of an intervention's module that hold its default string (its SCOPES, VARIANTS...)."""
    out: list = []
    for mod in (sys.modules[module_name], sys.modules["entropyrl.trainers.interventions.base"]):
        for v in vars(mod).values():
            if isinstance(v, tuple) and default in v and all(isinstance(x, str) for x in v):
                out += [x for x in v if x not in out]
    return tuple(out)


def intervention_keys() -> list[tuple[str, str]]:
    return [
        (n, f.name)
        for n in sorted(INTERVENTIONS)
        if not n.startswith("test_")
        for f in dataclasses.fields(INTERVENTIONS[n].Params)
        if (n, f.name) not in SKIP
    ]


@pytest.mark.parametrize("name, key", intervention_keys(), ids=lambda x: x)
def test_every_intervention_parameter_acts_or_is_refused(name, key):
    params = {**dict(intervention_defaults(name) or {}), **CONTEXT.get(name, {}), **CONTEXT.get((name, key), {})}
    default = params[key]
    if isinstance(default, int) and not isinstance(default, bool) and INTERVENTIONS[name].Params.__annotations__[key] == "float":
        default = float(default)
    choices = string_choices(INTERVENTIONS[name].__module__, default) if isinstance(default, str) else ()

    def build(v):
        return Algorithm.from_config({"interventions": [name], name: {**params, key: v}}, max_response_length=5, seed=3)

    reduce = _other_rank if (name, key) in OTHER_RANK else _identical_rank
    assert verdict(build, key, default, choices, reduce) != "ignored", f"algo.{name}.{key} is accepted and changes nothing"


def objective_keys() -> list[tuple[str, str]]:
    return [(n, k) for n in sorted(objectives.POLICY_OBJECTIVES) for k in objectives._extra_args(objectives.POLICY_OBJECTIVES[n])]


@pytest.mark.parametrize("name, key", objective_keys(), ids=lambda x: x)
def test_every_objective_argument_acts_or_is_refused(name, key):
    default = float(objectives._extra_args(objectives.POLICY_OBJECTIVES[name])[key])

    def build(v):
        return Algorithm.from_config({"objective": name, "objective_args": {key: v}}, max_response_length=5, seed=3)

    assert verdict(build, key, default) != "ignored", f"algo.objective_args.{key} of {name} is accepted and changes nothing"


CLIP_KEYS = ("clip.low", "clip.high", "clip.dual_c")


@pytest.mark.parametrize("name", sorted(objectives.POLICY_OBJECTIVES))
def test_every_objective_reads_the_clip_keys_it_does_not_declare_unread(name):
    """``algo.clip.*`` under each objective: a key acts, or the objective declares it unread
    (``register_objective(..., unread=...)``, said in its YAML) and then it really changes nothing."""
    unread = objectives.OBJECTIVE_UNREAD.get(name, ())
    defaults = {"low": 0.2, "high": 0.28, "dual_c": 3.0}
    for key in CLIP_KEYS:
        short = key.split(".")[1]

        def build(v, short=short):
            return Algorithm.from_config(
                {"objective": name, "clip": {**defaults, short: v}, "objective_args": {}}, max_response_length=5, seed=3
            )

        got = verdict(build, key, defaults[short])
        if key in unread:
            assert got == "ignored", f"{name} declares {key} unread, but it {got}"
        else:
            assert got == "acts", (
                f"algo.{key} is accepted and changes nothing under objective {name}: read it or declare it unread"
            )


#: the algorithm keys are tried in a configuration where each can act (DAPO's switches on, the
#: aggregation that reads loss_agg_norm, a step controller that reads controller_entropy)
ALGO_BASE = {
    "loss_agg": "seq-mean-token-sum-norm",
    "overlong": {"enabled": True, "buffer": 2},
    "dynamic_sampling": {"enabled": True},
    "interventions": ["stare"],
}


def _set(cfg: dict, dotted: str, value) -> dict:
    out = json.loads(json.dumps(cfg))
    node = out
    *parts, last = dotted.split(".")
    for p in parts:
        node = node.setdefault(p, {})
    node[last] = value
    return out


def algo_keys() -> list[str]:
    registered = ["advantage", "loss_agg", "objective"]
    return sorted(k for k in [*ALGO_KEYS, *registered] if k not in LABELS)


@pytest.mark.parametrize("key", algo_keys())
def test_every_algo_key_acts_or_is_refused(key):
    if key in READ_ELSEWHERE:
        file, text = READ_ELSEWHERE[key]
        assert text in (ROOT / file).read_text(), f"algo.{key}: {file} does not read it"
        return
    choices = {
        "controller_entropy": CONTROLLER_ENTROPY,
        "advantage": tuple(core_algos.ADVANTAGE_ESTIMATORS),
        "loss_agg": tuple(core_algos.LOSS_AGGREGATIONS),
        "objective": tuple(objectives.POLICY_OBJECTIVES),
    }.get(key, ())
    default = None
    for cfg in (ALGO_BASE, algo_defaults()):  # the base's value, else the published default
        node: object = cfg
        for part in key.split("."):
            node = node[part] if isinstance(node, dict) and part in node else None
        if node is not None:
            default = node
            break

    def build(v):
        return Algorithm.from_config(_set(ALGO_BASE, key, v), max_response_length=5, seed=3)

    assert verdict(build, key, default, choices) != "ignored", f"algo.{key} is accepted and changes nothing"


def test_an_ignored_parameter_is_caught():
    """The check can fail: a parameter no code reads is reported as ignored."""

    def build(v):  # objective_args.tau_pos of ppo_clip would be refused; a stand-in that drops v
        return Algorithm.from_config({"interventions": ["none"]}, max_response_length=5, seed=3)

    assert verdict(build, "unused", 1.0) == "ignored"

    def refusing(v):
        if v != 1.0:
            raise UserError("no")
        return build(v)

    assert verdict(refusing, "fixed", 1.0) == "refused"


# -- engines -------------------------------------------------------------------------------------

#: engine keys read by the training loop, not the engine: key -> (file, pattern that reads it)
ENGINE_KEYS_READ_BY_THE_LOOP = {
    "name": ("rollout/base.py", r"\"name\"|settings\.name\b"),  # the registry picks the engine by it
    "n": ("trainers/settings.py", r"rollout\.n\b|\"n\""),  # the group size
    "seed_scope": ("trainers/collect.py", r"seed_scope"),
    "tis": ("trainers/algos/algorithm.py", r"switched_on_by"),  # rollout.tis switches the tis intervention on
}
ENGINE_MODULES = {"hf": "rollout/hf_engine.py", "vllm": "rollout/vllm_engine.py"}


@pytest.mark.parametrize("engine", sorted(ENGINE_MODULES))
def test_every_engine_key_is_read(engine):
    """Every key of ``rollout=<engine>`` (its schema, core/schema/rollout.py) is read by the engine's
    module (as its typed ``settings.<key>``, rollout/settings.py) or, for the keys
    the loop owns, by the file named in ``ENGINE_KEYS_READ_BY_THE_LOOP``. (The hf engine's sampling
    keys are also checked to change the samples: ``test_hf_sampling_keys_change_the_samples``.)"""
    keys = list(schema_defaults(ROLLOUT_SCHEMAS[engine]))
    assert sorted(ROLLOUT_SCHEMAS) == sorted(ENGINE_MODULES)  # every shipped engine is checked
    source = (ROOT / ENGINE_MODULES[engine]).read_text()
    unread = []
    for key in keys:
        if key in ENGINE_KEYS_READ_BY_THE_LOOP:
            file, pattern = ENGINE_KEYS_READ_BY_THE_LOOP[key]
            if not re.search(pattern, (ROOT / file).read_text()):
                unread.append(f"{key} (not in {file})")
        elif f'"{key}"' not in source and not re.search(rf"settings\.{key}\b", source):
            unread.append(key)
    assert unread == [], f"rollout={engine} accepts keys its engine never reads: {unread}"


#: the hf engine's keys whose effect is on the samples, with a value that must change them
HF_SAMPLING = {"temperature": 1.0, "top_p": 0.3, "top_k": 1, "max_new_tokens": 2, "batch_size": 1, "weights": "int8"}
#: the hf engine's speed keys, with a value that must leave the samples as they are (the same samples, faster)
HF_SPEED = {"share_prefill": False}


def test_hf_sampling_keys_change_the_samples():
    """On the embedded tiny model: each sampling key of ``rollout=hf`` (its schema, core/schema/rollout.py)
    changes what the engine returns (the sampled tokens, or with ``weights`` the sampler's log-probs of
    them: the int8 copy draws nearly the tiny model's tokens) at the same seed; every other hf key is in
    ``ENGINE_KEYS_READ_BY_THE_LOOP``."""
    from omegaconf import OmegaConf

    from entropyrl.models.loading import load_policy
    from entropyrl.rollout.base import build_rollout

    keys = set(schema_defaults(ROLLOUT_SCHEMAS["hf"]))
    assert keys == set(HF_SAMPLING) | set(HF_SPEED) | (keys & set(ENGINE_KEYS_READ_BY_THE_LOOP)), sorted(keys)
    from entropyrl.conf import compose

    cfg = compose("train", ["tracking.enabled=false"])
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    # a flat distribution (temperature 4), so that the truncations (top-p, top-k) have tokens to cut
    base = {**OmegaConf.to_container(cfg.rollout, resolve=True), "batch_size": 16, "temperature": 4.0}
    prompts = ["12+7=", "3*4=", "20-5="]

    def sample(engine_cfg):
        out = build_rollout(engine_cfg, model, tok).generate(prompts, n=4, seed=5)
        logp = None if out.sampling_logp is None else out.sampling_logp.tolist()  # int8: the copy's, the policy's absent
        return out.response_ids.tolist(), out.response_mask.tolist(), logp

    ref = sample(base)
    assert sample(base) == ref  # the comparison is not noise: same seed, same samples
    for key, value in HF_SAMPLING.items():
        assert base[key] != value, key
        assert sample({**base, key: value}) != ref, f"rollout.{key}={value} changed nothing"
    for key, value in HF_SPEED.items():
        assert base[key] != value, key
        assert sample({**base, key: value}) == ref, f"rollout.{key}={value} changed the samples"


@pytest.mark.parametrize("agg", sorted(core_algos.LOSS_AGGREGATIONS))
def test_loss_agg_norm_acts_or_is_refused_under_every_aggregation(agg):
    """``algo.loss_agg_norm`` is read only by an aggregation with a constant normaliser; under any
    other a value is refused (before, ``token-mean`` accepted ``loss_agg_norm=64`` and ignored it)."""

    def build(v):
        return Algorithm.from_config({"loss_agg": agg, "loss_agg_norm": v}, max_response_length=5, seed=3)

    got = verdict(build, "loss_agg_norm", None)
    assert got != "ignored", f"algo.loss_agg_norm is accepted and changes nothing under loss_agg={agg}"
    if core_algos.LOSS_AGGREGATIONS[agg].denominator is not None:
        with pytest.raises(UserError, match=f"algo.loss_agg_norm=64 is not read by algo.loss_agg={agg}.*loss_agg_norm=null"):
            build(64)
