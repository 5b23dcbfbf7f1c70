"""The quadrant sign experiment: does an update restricted to one quadrant's tokens move entropy the
way the theory says (Q1 exploitation and Q3 suppression down, Q2 exploration and Q4 error-correction
up)?

From a fixed checkpoint (the run's starting policy), for each of ``batches`` fresh rollout batches
and each quadrant: restore the checkpoint, take one small plain-SGD policy-gradient step on that
quadrant's tokens only (``-sum_t A_t logp_t`` over the quadrant, divided by the batch's valid
tokens), and measure the realised entropy change on a fixed held-out probe batch. Plain SGD with a
small step because a reused Adam state or a large step breaks the first-order picture (measured on the earlier toy lab, see docs/lab.md).

Beside each realised change it records two predictions of it: the network's own first-order one,
``g_H . (theta_after - theta_before)`` with ``g_H = dH_probe/dtheta`` taken once at the checkpoint
(``stats/attribution.py``), and the tabular-softmax formula's (``diagnostics.effective_entropy_change``
summed over the quadrant's tokens, times the step size: every position treated as its own logit
table, the picture behind ``quadrant/*/pred_dH``). The formula predicts the change at the trained
tokens' own positions, not at the probe's, so only its signs and the quadrants' shares compare.

    entropyrl lab --experiment quadrants --seeds 0,1,2

In a sweep it is the job kind ``quadrant_probe`` (``QuadrantJob``, the lab ablation's ``quadrants``
variant): one job per seed, writing ``<output_dir>/quadrants.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig, open_dict

from ...conf import compose
from ...core.files import atomic_write_text
from ...rollout.base import build_rollout
from ...trainers import components
from ...trainers.collect import CollectSettings, collect_rollouts
from ...trainers.parallel import distributed
from ...trainers.stats.attribution import predicted_change, probe_entropy_gradient
from ...trainers.stats.diagnostics import QUADRANTS, effective_entropy_change, quadrant_ids
from ...trainers.stats.policy_stats import batch_token_stats, response_token_stats
from ...trainers.stats.probe import ProbeBatch
from ..jobs import TrainJob

__all__ = ["quadrant_sign_experiment", "QuadrantJob", "RESULT_FILE"]

RESULT_FILE = "quadrants.json"


def quadrant_sign_experiment(cfg, *, batches: int = 20, lr: float = 1e-3, log=print) -> dict:
    """``{"q1": [realised change per batch], ..., "q4": [...], "predicted": {"q1": [...], ...},
    "tabular": {"q1": [...], ...}}`` (nats/token on the probe batch; see the module docstring).

    ``cfg``: a composed ``train`` config (the model, task and batch size to use).
    """
    dist = distributed.setup(cfg.trainer)  # one process: this rank's device, no process group
    components.seed_everything(int(cfg.trainer.seed))
    model, tokenizer = components.build_policy(cfg, dist, log=log)  # only what the experiment uses:
    source = components.build_source(cfg, tokenizer)  # no output folder, tracking or optimizer
    algo = components.build_algorithm(cfg)
    engine = build_rollout(cfg.rollout, model, tokenizer)
    collect = CollectSettings.from_config(cfg)
    try:
        kw = components.stats_kwargs(cfg)
        rows = int(cfg.trainer.micro_batch_responses)
        probe = ProbeBatch(
            source.validation(int(cfg.diagnostics.probe_prompts)),
            source.prompt,
            engine,
            lambda m, r: batch_token_stats(m, r, rows, **kw),
            int(cfg.diagnostics.probe_responses),
        )
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        h0 = probe.entropy(model)
        model.eval()
        params = [p for p in model.parameters() if p.requires_grad]
        g_h = probe_entropy_gradient(
            model, probe.batch, lambda m, r: response_token_stats(m, r, entropy_grad=True, **kw)[1], rows
        )
        theta0 = [p.detach().clone() for p in params]
        out: dict = {q: [] for q in QUADRANTS}
        out["predicted"], out["tabular"] = {q: [] for q in QUADRANTS}, {q: [] for q in QUADRANTS}
        for b in range(batches):
            # fresh prompts, apart from the training stream (steps 10_000 + b)
            batch, _m = collect_rollouts(
                collect, source=source, rollout=engine, algo=algo, dist=dist, pad_token_id=tokenizer.pad_token_id, step=10_000 + b
            )
            if batch is None:
                continue
            roll, rewards, group_ids = batch.responses, batch.rewards, batch.group_ids
            mask = roll.policy_mask.to(dist.device).float()
            old_logp, entropy = batch_token_stats(model, roll, rows, **kw)
            adv = algo.advantages(rewards.to(dist.device), group_ids.to(dist.device), mask, entropy=entropy)
            ids = quadrant_ids(old_logp, entropy, adv, mask)
            n_valid = mask.sum().clamp(min=1.0)
            for i, q in enumerate(QUADRANTS, start=1):
                sel = (ids == i).float()
                if sel.sum() == 0:
                    continue
                model.load_state_dict(start)
                model.train()
                model.zero_grad(set_to_none=True)
                for s in range(0, len(roll.texts), rows):
                    idx = torch.arange(s, min(s + rows, len(roll.texts)))
                    logp, _ = response_token_stats(model, roll.select(idx), **kw)
                    (-(adv[idx] * logp * sel[idx]).sum() / n_valid).backward()
                with torch.no_grad():
                    for p in model.parameters():
                        if p.grad is not None:
                            p.add_(p.grad, alpha=-lr)
                model.eval()
                out[q].append(probe.entropy(model) - h0)
                out["predicted"][q].append(predicted_change(g_h, theta0, [p.detach() for p in params]))
                # the formula's coefficient: g_t = -dloss/dlogp_t = A_t sel_t / n_valid, times the step
                coef = adv * sel / n_valid
                out["tabular"][q].append(lr * float(effective_entropy_change(coef, old_logp, entropy, sel).sum()))
            log(
                f"quadrant probe batch {b + 1}/{batches}: "
                + " ".join(f"{q} {out[q][-1]:+.2e} (pred {out['predicted'][q][-1]:+.2e})" for q in QUADRANTS if out[q])
            )
        model.load_state_dict(start)
        return out
    finally:
        close = getattr(engine, "close", None)  # an engine that runs apart (vLLM)
        if close is not None:
            close()
        distributed.cleanup(dist)


class QuadrantJob(TrainJob):
    """The sweep job kind ``quadrant_probe``: the experiment from the job's training config
    (tracking off: it trains nothing), ``params.batches`` batches, its result in
    ``<output_dir>/quadrants.json``."""

    def run(self, cfg: DictConfig) -> dict:
        batches = int((self.spec.get("extra") or {}).get("params", {}).get("batches", 20))
        with open_dict(cfg):
            cfg.tracking.enabled = False
        torch.set_num_threads(int(cfg.trainer.threads) or 1)
        result = quadrant_sign_experiment(cfg, batches=batches, log=self._log)
        atomic_write_text(self.output_dir / RESULT_FILE, json.dumps(result))  # whole or absent, never half
        return {"status": "FINISHED", "steps": batches}


def main(argv: list[str]) -> None:
    """``python -m entropyrl.sweeps.lab.quadrant_probe OUT.json BATCHES key=value...`` (the
    experiment alone, outside a sweep)."""
    out, batches, overrides = Path(argv[0]), int(argv[1]), argv[2:]
    cfg = compose("train", overrides)
    torch.set_num_threads(int(cfg.trainer.threads) or 1)
    result = quadrant_sign_experiment(cfg, batches=batches, log=lambda m: print(m, flush=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
