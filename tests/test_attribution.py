"""``diagnostics.attribution`` (issue 21, item 1): ``entropy_change/predicted_net = g_H . dtheta``
with ``g_H = dH_probe/dtheta`` on the probe batch. On the embedded tiny model a small SGD step's
measured probe-entropy change (finite difference) matches the prediction within 5 %; a training run
logs it beside the realised change on the measured steps."""

from __future__ import annotations

import json
import math

import torch

from entropyrl.conf import compose
from entropyrl.models.loading import load_policy
from entropyrl.rollout.base import build_rollout
from entropyrl.trainers.data.prompts_source import build_prompt_source
from entropyrl.trainers.stats.attribution import predicted_change, probe_entropy_gradient
from entropyrl.trainers.stats.policy_stats import response_token_stats
from entropyrl.trainers.stats.probe import probe_entropy


def test_prediction_matches_a_finite_difference_of_a_small_sgd_step():
    cfg = compose("train", [])
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    source = build_prompt_source(cfg.data, 0, tokenizer=tok)
    roll = build_rollout(cfg.rollout, model, tok).generate([source.prompt(p) for p in source.validation(16)],
                                                          n=4, seed=1)
    kw = dict(temperature=float(cfg.rollout.temperature), chunk_size=int(cfg.trainer.token_chunk_size))
    mask = roll.response_mask.bool()

    def probe_h() -> float:
        with torch.no_grad():
            return probe_entropy(response_token_stats(model, roll, **kw)[1], mask)

    h_before = probe_h()
    params = [p for p in model.parameters() if p.requires_grad]
    grads_before = [None if p.grad is None else p.grad.clone() for p in params]
    g_h = probe_entropy_gradient(model, roll, lambda m, r: response_token_stats(m, r, entropy_grad=True, **kw)[1], 16)
    assert all((p.grad is None) == (g is None) for p, g in zip(params, grads_before))   # .grad untouched
    before = [p.detach().clone() for p in params]
    # one SGD step of a policy-gradient loss with random advantages, of length 1e-3
    adv = torch.randn(len(roll.texts), 1, generator=torch.Generator().manual_seed(0))
    logp, _ = response_token_stats(model, roll, **kw)
    grads = torch.autograd.grad(-(adv * logp * mask).sum() / mask.sum(), params)
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(1e-3 * g / norm)
    realized = probe_h() - h_before
    predicted = predicted_change(g_h, before, [p.detach() for p in params])
    assert abs(realized) > 1e-5                       # the step moved the entropy measurably
    assert abs(predicted - realized) <= 0.05 * abs(realized), (predicted, realized)


def test_a_run_logs_the_net_prediction_beside_the_realised_change(tmp_path):
    from entropyrl.trainers.trainer import train

    cfg = compose("train", ["trainer.total_steps=3", "trainer.threads=1", "trainer.val_every=0",
                            "trainer.progress=false", "tracking.enabled=false", "trainer.prompts_per_step=8",
                            "trainer.mini_batch_prompts=8", "diagnostics.attribution=true",
                            "diagnostics.attribution_every=2", "diagnostics.probe_prompts=8",
                            f"output_dir={tmp_path / 'run'}"])
    train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [("entropy_change/predicted_net" in r) for r in rows] == [True, False, True]   # steps 1, 3
    for r in rows:
        assert math.isfinite(r["entropy_change/realized"])
    measured = [r for r in rows if "entropy_change/predicted_net" in r]
    assert all(math.isfinite(r["entropy_change/predicted_net"]) and r["entropy_change/predicted_net"] != 0.0
               for r in measured)
