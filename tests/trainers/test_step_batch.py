"""The typed step batch and the side-effect-free loss.

- ``StepBatch[idx]`` slices every row-aligned field together, mini-batch then micro-batch;
- the batch's ``policy_version`` (the weights that generated it; the step itself in a synchronous
  run) goes with every selection of its rows;
- ``Algorithm.loss`` changes nothing on the algorithm or its interventions and never calls
  ``autograd.grad``; the first-order entropy prediction is a separate diagnostics step;
- a training step with ``diagnostics.quadrants=false`` makes no ``autograd.grad`` call and logs no
  prediction, with it on (the default) it does, once per micro-batch loss.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from entropyrl.conf import compose
from entropyrl.evals.reflection import WORD_LISTS, ReflectionMatcher, response_facts
from entropyrl.rollout.base import Rollout
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.algos.step_batch import StepBatch
from entropyrl.trainers.stats.prediction import EntropyPrediction, micro_batch_prediction


def make_step_batch(B=6, T=5, seed=0, with_optional=True) -> StepBatch:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    roll = Rollout(
        prompt_ids=torch.arange(B * 3).view(B, 3),
        prompt_mask=torch.ones(B, 3, dtype=torch.long),
        response_ids=torch.arange(B * T).view(B, T),
        response_mask=mask.long(),
        texts=[f"r{i}" + " wait" * i for i in range(B)],
        truncated=torch.zeros(B, dtype=torch.bool),
        sampling_logp=torch.randn(B, T, generator=g) if with_optional else None,
    )
    rnd = lambda: torch.randn(B, T, generator=g)  # noqa: E731
    return StepBatch(
        roll,
        rewards=torch.arange(B).float(),
        correct=torch.arange(B).float() % 2,
        group_ids=torch.arange(B) // 2,
        mask=mask,
        old_logp=-rnd().abs(),
        entropy=rnd().abs(),
        sampler_logp=roll.sampling_logp,
        ref_logp=-rnd().abs() if with_optional else None,
        advantages=rnd() * mask,
        selections={"stare/l_plus": rnd() > 0},
        facts=response_facts(roll.texts, ReflectionMatcher(WORD_LISTS["orz"])) if with_optional else None,
    )


ROW_FIELDS = ("rewards", "correct", "group_ids", "mask", "old_logp", "entropy", "sampler_logp", "ref_logp", "advantages")


@pytest.mark.parametrize("with_optional", [True, False])
def test_slicing_takes_the_same_rows_of_every_field(with_optional):
    batch = make_step_batch(with_optional=with_optional)
    mini_idx = torch.tensor([4, 1, 5, 0])
    micro_idx = torch.tensor([2, 3])
    micro = batch[mini_idx][micro_idx]
    rows = mini_idx[micro_idx]  # [5, 0]: what the micro-batch must hold
    assert len(micro) == 2 and micro.responses.texts == [batch.responses.texts[5], batch.responses.texts[0]]
    for name in ROW_FIELDS:
        whole, part = getattr(batch, name), getattr(micro, name)
        if whole is None:
            assert part is None, name
        else:
            assert torch.equal(part, whole[rows]), name
    assert torch.equal(micro.responses.response_ids, batch.responses.response_ids[rows])
    assert torch.equal(micro.selections["stare/l_plus"], batch.selections["stare/l_plus"][rows])
    assert set(micro.selections) == set(batch.selections)
    if with_optional:  # the text facts follow their rows: 5 and 0 "wait"s
        assert micro.facts.counts.tolist() == [5, 0] and micro.facts.chars.tolist() == [len(t) for t in micro.responses.texts]
    else:
        assert micro.facts is None
    with pytest.raises(TypeError):
        batch[torch.ones(len(batch), dtype=torch.bool)]


def test_the_policy_version_goes_with_every_selection_of_rows():
    algo = Algorithm.from_config({"interventions": ["stare"], "stare": {"scope": "batch"}}, max_response_length=5)
    batch = make_step_batch().with_(policy_version=7)
    mini = algo.select(batch, "batch")[torch.tensor([4, 1, 5])]
    assert mini.policy_version == 7 and mini.with_(advantages=None).policy_version == 7
    assert mini[torch.tensor([2])].narrowed(mini.responses, 3).policy_version == 7
    assert make_step_batch()[torch.tensor([0])].policy_version is None  # never stamped: none claimed


def test_select_adds_wider_scope_selections_once_and_slices_with_the_batch():
    algo = Algorithm.from_config(
        {"interventions": ["stare", "high_entropy_mask"], "stare": {"scope": "batch"}, "high_entropy_mask": {"scope": "mini"}},
        max_response_length=5,
    )
    batch = make_step_batch().with_(selections={})
    whole = algo.select(batch, "batch")
    assert set(whole.selections) == {"stare/l_plus", "stare/l_minus"} and batch.selections == {}
    mini = algo.select(whole[torch.tensor([0, 2, 4])], "mini")
    assert set(mini.selections) == {"stare/l_plus", "stare/l_minus", "high_entropy_mask/keep"}
    assert torch.equal(mini.selections["stare/l_plus"], whole.selections["stare/l_plus"][[0, 2, 4]])


CONFIGS = {
    "grpo": {},
    "stare_open_batch_scope": {"interventions": ["stare"], "stare": {"gate": False, "scope": "batch"}},
    "steer": {"interventions": ["steer"]},
    "clip_cov": {"interventions": ["clip_cov"], "clip_cov": {"ratio": 0.3, "lb": -10.0, "ub": 10.0}},
    "kl_cov": {"interventions": ["kl_cov"], "kl_cov": {"ratio": 0.3}},
    "adaptive_entropy": {"interventions": ["adaptive_entropy"], "adaptive_entropy": {"init_coef": 0.01}},
    "mask_reweight_tis": {"interventions": ["high_entropy_mask", "sample_reweight", "tis"]},
    "kl": {"kl_coef": 0.1},
}


def state_of(obj) -> dict:
    """Everything an object holds, deep-copied (tensors cloned) for comparison."""
    return {
        k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in vars(obj).items() if k != "interventions"
    }


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


class CountingGrad:
    """``torch.autograd.grad`` that counts its calls (the real function does the work)."""

    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loss_changes_nothing_and_calls_no_autograd_grad(name, monkeypatch):
    algo = Algorithm.from_config(CONFIGS[name], max_response_length=5, seed=3)
    algo.begin_step(0.1)
    batch = algo.select(make_step_batch(seed=1), "batch")
    before = [state_of(algo)] + [state_of(iv) for iv in algo.interventions]
    saved = json.dumps(algo.state_dict(), sort_keys=True)
    spy = CountingGrad(torch.autograd.grad)
    monkeypatch.setattr(torch.autograd, "grad", spy)
    logp = batch.old_logp.clone().add_(0.05).requires_grad_(True)
    entropy = batch.entropy.clone().requires_grad_(algo.needs_entropy_grad)
    for _ in range(2):
        out = algo.micro_loss(batch, logp=logp, entropy=entropy)
        out.loss.backward(retain_graph=True)
    after = [state_of(algo)] + [state_of(iv) for iv in algo.interventions]
    assert spy.calls == 0  # no hidden extra gradient in the loss
    assert all(same(b, a) for b, a in zip(before, after)), name
    assert json.dumps(algo.state_dict(), sort_keys=True) == saved
    assert torch.isfinite(out.loss) and out.tokens is not None and out.token_loss.shape == logp.shape
    # the prediction is the diagnostics step's job: one autograd.grad per micro-batch loss
    pred = EntropyPrediction()
    pred.add(algo.micro_loss(batch, logp=logp, entropy=entropy))
    assert spy.calls == 1 and "entropy_change/predicted" in pred.metrics()


def test_clip_cov_draws_afresh_only_when_the_loop_says_so():
    algo = Algorithm.from_config(CONFIGS["clip_cov"], max_response_length=5, seed=3)
    batch = make_step_batch(B=12, seed=2)
    logp = batch.old_logp.clone().requires_grad_(True)

    def weights():
        return algo.micro_loss(batch, logp=logp, entropy=batch.entropy).tokens.weights

    first = weights()
    assert torch.equal(weights(), first)  # the loss alone: the same draw
    algo.after_loss()
    assert not torch.equal(weights(), first)  # the loop advanced it: a fresh one
    assert algo.state_dict() == {"interventions": {"clip_cov": {"calls": 1}}}


def test_prediction_sums_micro_batches():
    algo = Algorithm.from_config({}, max_response_length=5)
    batch = make_step_batch(B=8, seed=4)
    logp = batch.old_logp.clone().add_(0.1).requires_grad_(True)
    pred = EntropyPrediction()
    singles = []
    for rows in (torch.arange(0, 4), torch.arange(4, 8)):
        part = batch[rows]
        out = algo.micro_loss(part, logp=logp.detach()[rows].requires_grad_(True), entropy=part.entropy)
        pred.add(out)
        singles.append(micro_batch_prediction(out.tokens, out.token_loss))
    total = pred.metrics()
    for key in ("quadrant/q1/pred_dH", "entropy_change/predicted", "entropy_change/predicted_base"):
        assert total[key] == singles[0][key] + singles[1][key]
    assert any(v != 0.0 for v in total.values())


@pytest.mark.parametrize("quadrants", [False, True])
def test_training_step_runs_the_prediction_only_when_switched_on(quadrants, tmp_path, monkeypatch):
    from entropyrl.trainers.trainer import train

    spy = CountingGrad(torch.autograd.grad)
    monkeypatch.setattr(torch.autograd, "grad", spy)
    cfg = compose(
        "train",
        [
            "trainer.total_steps=1",
            "trainer.threads=1",
            "trainer.val_every=0",
            "trainer.progress=false",
            "tracking.enabled=false",
            "trainer.prompts_per_step=8",
            "trainer.mini_batch_prompts=4",
            "trainer.micro_batch_responses=16",
            f"diagnostics.quadrants={str(quadrants).lower()}",
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    train(cfg, log=lambda *_: None)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    # 8 prompts x rollout.n responses, mini-batches of 4 prompts, micro-batches of 16 responses
    n_losses = (8 // 4) * -(-4 * int(cfg.rollout.n) // 16)
    assert spy.calls == (n_losses if quadrants else 0)
    assert ("entropy_change/predicted" in row) == quadrants and ("quadrant/q1/pred_dH_base" in row) == quadrants
    assert "groups/all_equal_frac" in row and "loss/policy" in row


def test_a_synchronous_step_batch_carries_the_step_before_its_update_as_policy_version(tmp_path, monkeypatch):
    """The trainer samples its own batch from the weights of ``trainer.step`` (no update yet this
    step); that version reaches the update, its mini- and micro-batches with it."""
    from entropyrl.trainers.trainer import GRPOTrainer

    seen = []
    update = GRPOTrainer._update

    def recording_update(self, batch, metrics):
        rows = batch[torch.tensor([1, 0])]
        seen.append((self.step, batch.policy_version, rows.policy_version, rows.with_(ref_logp=None).policy_version))
        return update(self, batch, metrics)

    monkeypatch.setattr(GRPOTrainer, "_update", recording_update)
    cfg = compose(
        "train",
        [
            "trainer.total_steps=2",
            "trainer.threads=1",
            "trainer.val_every=0",
            "trainer.progress=false",
            "tracking.enabled=false",
            "trainer.prompts_per_step=4",
            "trainer.mini_batch_prompts=2",
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    trainer = GRPOTrainer(cfg, log=lambda *_: None)
    try:
        for _ in range(2):
            trainer.train_step()
            trainer.step += 1
    finally:
        trainer.close()
    assert seen == [(0, 0, 0, 0), (1, 1, 1, 1)]


def test_the_whole_train_config_is_read_once_by_the_builder():
    # rollout.tis switches TIS on after the listed interventions; dynamic sampling and the loss
    # aggregation come from algo.*; nothing else reads them
    cfg = compose("train", ["rollout=vllm", "rollout.tis.enabled=true", "rollout.tis.cap=1.5", "algo=dapo"])
    algo = Algorithm.from_train_config(cfg)
    assert algo.intervention_names[-1] == "tis" and algo.interventions[-1].params.cap == 1.5
    assert algo.dynamic_sampling == bool(cfg.algo.dynamic_sampling.enabled)
    assert algo.max_num_gen_batches == int(cfg.algo.dynamic_sampling.max_num_gen_batches)
    assert algo.loss_agg == cfg.algo.loss_agg and algo.max_response_length == int(cfg.rollout.max_new_tokens)
    listed = Algorithm.from_train_config(
        compose("train", ["rollout=vllm", "rollout.tis.enabled=true", "algo.interventions=[tis,stare]"])
    )
    assert listed.intervention_names == ["tis", "stare"]  # listed: not added twice
    assert "tis" not in Algorithm.from_train_config(compose("train", ["rollout=vllm"])).intervention_names


def test_the_step_methods_read_no_config():
    """The recipe's step methods take every setting from ``StepSettings`` (read once at set-up),
    never from ``cfg``: a reader finds each number where the run was set up."""
    import ast
    import inspect

    from entropyrl.trainers.trainer import GRPOTrainer

    tree = ast.parse(inspect.getsource(GRPOTrainer))
    methods = {n.name: n for n in tree.body[0].body if isinstance(n, ast.FunctionDef)}
    step_methods = (
        "collect",
        "train_step",
        "_score",
        "_reference_logp",
        "_write_samples",
        "_update",
        "_advance_schedule",
        "validate",
        "save",
    )
    assert set(step_methods) <= set(methods)
    for name in step_methods:
        reads = [n for n in ast.walk(methods[name]) if isinstance(n, ast.Attribute) and n.attr == "cfg"]
        reads += [n for n in ast.walk(methods[name]) if isinstance(n, ast.Name) and n.id == "cfg"]
        assert reads == [], f"GRPOTrainer.{name} reads the config"


def test_the_samplers_and_the_collection_read_typed_settings():
    """The engines, the tool driver and the batch collection take their settings typed, read once
    where the run is set up (``rollout/settings.py``, ``collect.CollectSettings``): no function there
    takes a config section (but the ``from_config`` readers), and no config read with a default of
    its own remains, so a default lives in one place, beside the YAML that sets it."""
    import ast
    from pathlib import Path

    import entropyrl

    root = Path(entropyrl.__file__).parent
    sections = {"cfg", "rollout_cfg", "tools_cfg"}
    for module in ("trainers/collect.py", "rollout/hf_engine.py", "rollout/vllm_engine.py", "rollout/multi_turn.py"):
        tree = ast.parse((root / module).read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            params = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
            assert fn.name in ("from_config", "build_rollout") or not params & sections, f"{module}: {fn.name} takes a config"
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            where = f"{module}:{call.lineno}"
            assert not (isinstance(call.func, ast.Name) and call.func.id == "cfg_get"), f"{where} reads the config"
            if isinstance(call.func, ast.Attribute) and call.func.attr == "get" and len(call.args) == 2:
                key, default = call.args
                receiver = ast.unparse(call.func.value)
                literal = isinstance(key, ast.Constant) and isinstance(default, ast.Constant)
                assert not literal or receiver == "os.environ", f"{where}: {receiver}.get(...) with a default of its own"
