"""Our side of ``make bench-peers``' shared-batch check: one batch our trainer collects, and the gradient
of the update it takes on it.

Run by ``perf/peers.py`` with the product venv's interpreter::

    python perf/_peer_gradient.py OVERRIDES_JSON OUT_FOLDER

Composes ``entropyrl train`` with the overrides (one update a step: the check compares one gradient),
collects one step's batch with the trainer's own engine and reward, and trains one step on it. Writes,
into ``OUT_FOLDER``: ``batch.json``, each response's prompt ids, response ids (up to and including the
stop token) and shaped reward, in the trainer's order; ``ours_grad.pt``, ``{parameter name:
gradient}`` as the optimizer step received it (after the trainer's gradient clipping). TRL's side
replays ``batch.json`` (``perf/_peer_trl.py --replay``) and saves its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(overrides_json: str, out: str) -> int:
    import torch

    from entropyrl.conf import compose
    from entropyrl.trainers.trainer import GRPOTrainer

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = compose("train", [*json.loads(overrides_json), "trainer.total_steps=1", f"output_dir={folder / 'ours_run'}"])
    trainer = GRPOTrainer(cfg, log=lambda *_: None)
    batch, metrics = trainer.collect()
    roll = batch.responses
    rows = [
        {
            "prompt_ids": roll.prompt_ids[i][roll.prompt_mask[i].bool()].tolist(),
            "response_ids": roll.response_ids[i][roll.response_mask[i].bool()].tolist(),
            "reward": float(batch.rewards[i]),
        }
        for i in range(len(batch))
    ]
    grads: list[dict] = []
    step = trainer.optimizer.step

    def step_seen(*args, **kwargs):  # the gradient as the optimizer receives it
        grads.append(
            {
                n.removeprefix("_orig_mod."): p.grad.detach().clone()
                for n, p in trainer.model.named_parameters()
                if p.grad is not None
            }
        )
        return step(*args, **kwargs)

    trainer.optimizer.step = step_seen
    trainer.train_step((batch, metrics))
    trainer.close()
    if len(grads) != 1:
        raise SystemExit(f"the check compares one update; this workload took {len(grads)} on its batch")
    torch.save(grads[0], folder / "ours_grad.pt")
    (folder / "batch.json").write_text(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
