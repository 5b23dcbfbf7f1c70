"""The shared-batch check of ``make bench-peers`` (keys ``peers.same_batch`` and
``peers.real_model.same_batch``): do both trainers compute the same update from the same batch?

Equal settings leave each side's batch to its own sampler, so their learning curves differ by the
draw; this check removes the draw. Our trainer collects one step's batch and trains on it
(``perf/_peer_gradient.py``, product venv); TRL trains one step on that batch
(``perf/_peer_trl.py --replay``, peer venv): its generation hands back our responses once the prompt
ids it tokenized are checked equal to ours, its reward function our shaped rewards. With one update
over the whole batch and clipping off on both (``one_update``), the two gradients are compared
(``gradient_agreement``). Negating the rewards on TRL's side (``flip``) is the check's own null: the
gradients then point apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NO_CLIP = 1e9  # trainer.grad_clip of the check: no clipping (TRL's max_grad_norm the same)


def one_update(base: list[str]) -> list[str]:
    """``base`` with one update a step over the whole batch and no gradient clipping: the shared-batch
    check compares one gradient, and its norm as each side computed it."""
    from entropyrl.conf import compose

    prompts = int(compose("train", base).trainer.prompts_per_step)
    return [*base, f"trainer.mini_batch_prompts={prompts}", "trainer.ppo_epochs=1", f"trainer.grad_clip={NO_CLIP}"]


def gradient_agreement(ours: dict, theirs: dict) -> dict:
    """How two ``{parameter name: gradient}`` agree: the cosine of the whole flattened gradients, their
    norms' ratio (ours over TRL's), the largest difference of an entry relative to TRL's largest entry,
    and the lowest cosine of one parameter. Raises ValueError when the names differ."""
    import torch

    if set(ours) != set(theirs):
        raise ValueError(f"parameters differ: {sorted(set(ours) ^ set(theirs))[:5]}")
    names = sorted(ours)
    a = torch.cat([ours[n].flatten().double() for n in names])
    b = torch.cat([theirs[n].flatten().double() for n in names])
    per = [torch.nn.functional.cosine_similarity(ours[n].flatten().double(), theirs[n].flatten().double(), dim=0) for n in names]
    return {
        "cosine": round(float(torch.nn.functional.cosine_similarity(a, b, dim=0)), 6),
        "norm_ratio": round(float(a.norm() / b.norm()), 6),
        "max_rel_diff": float(f"{float((a - b).abs().max() / b.abs().max()):.3g}"),
        "min_param_cosine": round(float(min(per)), 6),
        "parameters": len(names),
    }


def same_batch(overrides: list[str], threads: int, job: dict, python: Path, flip: bool = False) -> dict:
    """Both sides' gradient on one batch: ours collects a step's batch with ``overrides`` and takes its
    update (``perf/_peer_gradient.py``), TRL (``python``: the peer venv's) replays it on the workload of
    ``job`` (its generation returns our responses after its prompt ids are checked equal to ours, its
    reward our shaped rewards; ``flip`` negates them), and its first update's gradient is compared with
    ours (``gradient_agreement``)."""
    import torch

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory(prefix="bench-peers-batch-") as tmp:
        folder = Path(tmp)
        job_path = folder / "job.json"
        job_path.write_text(json.dumps(job))
        for cmd in (
            [sys.executable, str(HERE / "_peer_gradient.py"), json.dumps(overrides), str(folder)],
            [str(python), str(HERE / "_peer_trl.py"), "--replay", str(job_path), str(folder / "batch.json"), str(folder)]
            + (["--flip"] if flip else []),
        ):
            done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(cmd[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
        rows = json.loads((folder / "batch.json").read_text())["rows"]
        agreement = gradient_agreement(torch.load(folder / "ours_grad.pt"), torch.load(folder / "trl_grad.pt"))
    return {**agreement, "responses": len(rows), "response_tokens": sum(len(r["response_ids"]) for r in rows)}


def describe(sb: dict) -> str:
    """``same_batch``'s result in a sentence, for the peer section of docs/performance.md."""
    return (
        f"The same batch, both gradients: our trainer collected one step's batch ({sb['responses']} responses, "
        f"{sb['response_tokens']} response tokens) and TRL trained one step on it (its generation handed our responses "
        "back after its prompt ids were checked equal to ours, its reward function our rewards), one update over the "
        f"whole batch, no clipping on either side: cosine {sb['cosine']} between the two gradients "
        f"({sb['parameters']} parameters; lowest of one parameter {sb['min_param_cosine']}), norm ratio "
        f"{sb['norm_ratio']}, largest entry difference {sb['max_rel_diff']} of TRL's largest entry."
    )
