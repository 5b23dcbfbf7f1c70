"""The first update pass takes its forward from the statistics pass (``trainers/data/first_pass.py``):
a step trains exactly as with the forward recomputed (the same weights after it, the same metrics),
runs one pass's rows fewer through the model, and keeps nothing where the two forwards would not be
the same computation (dropout, SIREN's sampling-time statistics)."""

from __future__ import annotations

import math

import pytest
import torch

from entropyrl.conf import compose
from entropyrl.trainers.data import first_pass
from entropyrl.trainers.data.first_pass import KeptPass, first_pass_rows, has_dropout
from entropyrl.trainers.stats import policy_stats
from entropyrl.trainers.trainer import GRPOTrainer


def _trainer(tmp_path, fast_train: list[str], overrides: list[str], reuse: bool) -> GRPOTrainer:
    run = [*fast_train, "tracking.enabled=false", *overrides, f"trainer.reuse_stats_forward={reuse}"]
    return GRPOTrainer(compose("train", [*run, f"output_dir={tmp_path / str(reuse)}"]), log=lambda *_: None)


def _counting_rows(monkeypatch) -> list[int]:
    """Rows of every forward of the token statistics (the statistics pass, the kept pass, the updates)."""
    rows: list[int] = []
    real = policy_stats.response_token_stats

    def counted(model, rollout, **kw):
        rows.append(len(rollout.texts))
        return real(model, rollout, **kw)

    for module in (policy_stats, first_pass):
        monkeypatch.setattr(module, "response_token_stats", counted)
    monkeypatch.setattr("entropyrl.trainers.trainer.response_token_stats", counted)
    return rows


@pytest.mark.parametrize(
    "overrides,kept",
    [
        ([], True),  # two mini-batches of one pass each
        (["trainer.micro_batch_responses=8", "trainer.ppo_epochs=2", "algo=stare"], True),  # passes inside mini-batches
        (["trainer.micro_batch_tokens=150"], True),  # packed by a token budget, each pass trimmed
        (["algo=entropy_bonus"], True),  # the entropy carries gradient in the update
        (["algo=clip_cov"], True),  # a mini-batch-scope selection drawn before the update
        (["algo=lp_reg"], True),  # full-distribution statistics of the update pass (vocab_stats)
        (["diagnostics.quadrants=true", "diagnostics.attribution=true"], True),  # observers on the kept graph
        (["algo=siren"], False),  # the first batch's sampling-time vocabulary statistics: nothing kept
    ],
)
def test_a_step_with_the_kept_forward_trains_as_the_recomputed_one(tmp_path, monkeypatch, fast_train, overrides, kept):
    on, off = _trainer(tmp_path, fast_train, overrides, True), _trainer(tmp_path, fast_train, overrides, False)
    try:
        assert all(torch.equal(a, b) for a, b in zip(on.model.parameters(), off.model.parameters()))
        before = [p.detach().clone() for p in off.model.parameters()]
        collected = off.collect()
        batch = collected[0]
        expected_saving = len(first_pass_rows(batch, on.settings, 0, on.dist)) if kept else 0
        rows = _counting_rows(monkeypatch)
        got_on = on.train_step(collected)
        rows_on, rows[:] = sum(rows), []
        got_off = off.train_step(collected)
        rows_off = sum(rows)
        assert rows_off - rows_on == expected_saving and (expected_saving > 0) == kept
        # a step ends holding no gradient: the next step's kept pass builds its graph beside the
        # optimizer state only, not beside a spent gradient as large as the model
        assert all(p.grad is None for t in (on, off) for p in t.model.parameters())
        # the same update up to float rounding, compared as each tensor's update by norm: products over other
        # row counts round otherwise on some CPUs (AVX-512 kernels), and AdamW's division by its second moment
        # turns a rounding difference in a gradient summed near zero into a difference of up to lr in that
        # element (seen: 0.5 % of a bias's update after two epochs); a wrong row or target moves it by its size
        for a, b, start in zip(on.model.parameters(), off.model.parameters(), before):
            step_on, step_off = a.detach() - start, b.detach() - start
            assert (step_on - step_off).norm() <= 2e-2 * step_off.norm() + 1e-9, (step_on - step_off).norm()
        compared = [k for k, v in got_off.items() if not k.startswith("time/") and isinstance(v, float)]
        assert "loss/objective" in compared and "entropy" in compared and "grad_norm" in compared
        for k in compared:
            assert math.isclose(got_on[k], got_off[k], rel_tol=1e-5, abs_tol=1e-7) or (
                math.isnan(got_on[k]) and math.isnan(got_off[k])
            ), (k, got_on[k], got_off[k])
    finally:
        on.close()
        off.close()


def test_a_model_with_dropout_keeps_nothing(tmp_path, monkeypatch, fast_train):
    """A training-mode forward with dropout is random: the statistics pass cannot stand for it."""
    on = _trainer(tmp_path, fast_train, [], True)
    try:
        on.model.config.attention_dropout = 0.1  # Hugging Face attention dropout: a config rate, no module
        assert has_dropout(on.model)
        batch = on.collect()[0]
        rows = _counting_rows(monkeypatch)
        *_, kept = first_pass.sampling_stats(on.model, batch, on.settings, on.algo, step=0, dist=on.dist)
        assert kept.stats is None and rows == [len(batch)]  # every row in the one no-gradient pass
    finally:
        on.close()


def test_dropout_is_seen_as_a_module_or_a_config_rate():
    assert has_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))
    assert not has_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))
    from transformers import LlamaConfig, LlamaForCausalLM

    small = dict(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    assert not has_dropout(LlamaForCausalLM(LlamaConfig(**small)))
    assert has_dropout(LlamaForCausalLM(LlamaConfig(**small, attention_dropout=0.1)))


def test_the_kept_pass_is_taken_once_and_only_by_its_own_rows():
    stats = (torch.zeros(2, 3), torch.zeros(2, 3))
    kept = KeptPass(torch.tensor([3, 1]), stats)
    with pytest.raises(RuntimeError, match="first_pass_rows"):
        kept.take(torch.tensor([1, 3]))
    assert kept.take(torch.tensor([3, 1])) is stats
    assert kept.take(torch.tensor([3, 1])) is None
    assert KeptPass().take(torch.tensor([0])) is None
