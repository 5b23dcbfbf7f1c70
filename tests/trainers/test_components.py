"""The trainer's components build alone (trainers/components.py, trainers/collect.py): a batch is
sampled and scored from a policy, a prompt source, an algorithm and a rollout engine, with no
trainer, no output folder, no tracking store and no optimizer."""

from __future__ import annotations

import torch

from entropyrl.conf import compose
from entropyrl.rollout.base import build_rollout
from entropyrl.trainers import components
from entropyrl.trainers.collect import collect_rollouts
from entropyrl.trainers.optim import build_optimizer, build_scheduler
from entropyrl.trainers.parallel import distributed


def test_a_batch_from_components_alone(in_tmp):
    cfg = compose("train", ["trainer.prompts_per_step=4", "rollout.n=3", "output_dir=never", "trainer.threads=1"])
    dist = distributed.setup(cfg.trainer)
    components.seed_everything(0)
    model, tokenizer = components.build_policy(cfg, dist, log=lambda *_: None)
    source = components.build_source(cfg, tokenizer)
    algo = components.build_algorithm(cfg)
    engine = build_rollout(cfg.rollout, model, tokenizer)
    batch, metrics = collect_rollouts(
        cfg, source=source, rollout=engine, algo=algo, dist=dist, pad_token_id=tokenizer.pad_token_id, step=0
    )
    roll, rewards, correct, group_ids = batch.responses, batch.rewards, batch.correct, batch.group_ids
    assert len(roll.texts) == rewards.shape[0] == correct.shape[0] == 12
    assert group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert set(correct.tolist()) <= {0.0, 1.0} and 0.0 <= metrics["acc/mean"] <= 1.0
    # each response's text facts, found beside its reward, carried row by row
    assert batch.facts.chars.tolist() == [len(t) for t in roll.texts] and "repetition/score/mean" in metrics
    again = collect_rollouts(
        cfg, source=source, rollout=engine, algo=algo, dist=dist, pad_token_id=tokenizer.pad_token_id, step=0
    )
    assert again[0].responses.texts == roll.texts  # the step seeds prompts and sampling
    assert algo.intervention_names == [] and components.build_tracker(cfg, in_tmp / "never", dist).enabled
    # the optimizer and its schedule from the optim section, over the policy alone
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, int(cfg.trainer.total_steps))
    assert isinstance(optimizer, torch.optim.AdamW) and scheduler.get_last_lr() == [cfg.optim.lr]
    assert sorted(p.name for p in in_tmp.iterdir()) == []  # no output folder, no mlflow.db
