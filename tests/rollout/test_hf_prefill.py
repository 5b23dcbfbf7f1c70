"""``rollout.share_prefill``: the ``n`` responses of a prompt share one prefill of it
(``rollout/hf_engine.py``). The sampled responses must equal those of the plain path, row for row,
greedy and sampled, with prompts of different lengths (left padding) and groups split over calls."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.models.loading import load_policy
from entropyrl.rollout.hf_engine import HFRollout

PROMPTS = ["12+7=", "3+4=", "8+15=", "1+1="]  # different lengths: the batch is left-padded


@pytest.fixture(scope="module")
def tiny():
    cfg = compose("train")
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    return cfg, model, tok


def _roll(tiny, *, share: bool, batch_size: int, temperature: float, n: int = 3, seed: int = 5):
    cfg, model, tok = tiny
    engine_cfg = OmegaConf.merge(cfg.rollout, {"batch_size": batch_size, "share_prefill": share})
    return HFRollout(engine_cfg, model, tok).generate(PROMPTS, n=n, seed=seed, temperature=temperature, max_new_tokens=6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefill_samples_what_the_plain_path_samples(tiny, temperature):
    plain = _roll(tiny, share=False, batch_size=512, temperature=temperature)
    shared = _roll(tiny, share=True, batch_size=512, temperature=temperature)
    assert plain.response_ids.shape[0] == len(PROMPTS) * 3
    assert torch.equal(plain.prompt_ids, shared.prompt_ids) and torch.equal(plain.prompt_mask, shared.prompt_mask)
    assert torch.equal(plain.response_ids, shared.response_ids)
    assert torch.equal(plain.response_mask, shared.response_mask)
    assert plain.texts == shared.texts


def test_shared_prefill_keeps_groups_whole_when_the_batch_is_smaller(tiny):
    """``batch_size`` 4 with ``n`` 3: one prompt's group per call; greedy rows equal the plain path's
    (which cuts the same rows into calls of 4) and each group's rows are the same greedy answer."""
    plain = _roll(tiny, share=False, batch_size=4, temperature=0.0)
    shared = _roll(tiny, share=True, batch_size=4, temperature=0.0)
    assert torch.equal(plain.response_ids, shared.response_ids)
    groups = shared.response_ids.view(len(PROMPTS), 3, -1)
    assert all(torch.equal(g[0], g[k]) for g in groups for k in (1, 2))


def test_shared_prefill_with_a_single_response_is_the_plain_path(tiny):
    plain = _roll(tiny, share=False, batch_size=512, temperature=1.0, n=1)
    shared = _roll(tiny, share=True, batch_size=512, temperature=1.0, n=1)
    assert torch.equal(plain.response_ids, shared.response_ids)


def test_shared_prefill_prefills_each_prompt_once(tiny):
    """The rows of every multi-token forward (a prefill): one per prompt shared, one per response plain."""
    _, model, _ = tiny
    rows: list[int] = []

    def count(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            rows.append(int(ids.shape[0]))

    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        _roll(tiny, share=True, batch_size=512, temperature=1.0)
        shared, rows[:] = list(rows), []
        _roll(tiny, share=False, batch_size=512, temperature=1.0)
        plain = list(rows)
    finally:
        handle.remove()
    assert shared == [len(PROMPTS)] and plain == [len(PROMPTS) * 3]
