"""The samples table of a training run: every ``trainer.samples_every`` steps (and at step 1) a few
of the step's responses with their prompt, reward, verdict and mean token entropy, appended to
``<output_dir>/samples.jsonl`` (one JSON object a row, with its ``step``) and sent to MLflow as the
artifact ``samples/samples.jsonl`` through the tracker's queue (the trainer never waits on it).
So a reader sees what the policy wrote before and after its entropy fell.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ...core.files import atomic_write_lines

__all__ = ["SAMPLES_FILE", "samples_due", "pick_rows", "sample_rows", "append_samples", "drop_after"]

SAMPLES_FILE = "samples.jsonl"


def samples_due(step: int, every: int) -> bool:
    """Whether step ``step`` (1-based, as logged) writes samples: step 1 and every ``every``-th; 0 = never."""
    return every > 0 and (step == 1 or step % every == 0)


def pick_rows(batch_rows: int, group_size: int, rows: int) -> list[int]:
    """Which rows to keep: the first response of as many groups as possible, spread over the batch,
    then further responses of those groups until ``rows``."""
    groups = max(batch_rows // max(group_size, 1), 1)
    stride = max(groups // max(rows, 1), 1)
    firsts = [g * group_size for g in range(0, groups, stride)][:rows]
    extra = [r for r in range(batch_rows) if r not in set(firsts)]
    return sorted((firsts + extra)[: min(rows, batch_rows)])


def sample_rows(
    step: int,
    prompts: Sequence[str],
    responses: Sequence[str],
    rewards: Sequence[float],
    correct: Sequence[float],
    entropy_mean: Sequence[float],
    lengths: Sequence[int],
    reflection: Sequence[int] | None = None,
) -> list[dict]:
    """One dict per response: ``step``, ``prompt``, ``response``, ``reward``, ``correct``,
    ``entropy_mean`` (mean token entropy of the sampling policy over the response), ``length`` (tokens)
    and, with a word list, ``reflection`` (its count of reflection words)."""
    out = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        row = {
            "step": int(step),
            "prompt": p,
            "response": r,
            "reward": float(rewards[i]),
            "correct": float(correct[i]),
            "entropy_mean": float(entropy_mean[i]),
            "length": int(lengths[i]),
        }
        if reflection is not None:
            row["reflection"] = int(reflection[i])
        out.append(row)
    return out


def append_samples(output_dir: Path, rows: list[dict]) -> Path:
    """Append ``rows`` to the run's samples table (the folder made if a step runs before ``fit``)."""
    path = Path(output_dir) / SAMPLES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def drop_after(output_dir: Path, step: int) -> None:
    """On resume from step ``step``: drop the rows of later steps (the run redoes them)."""
    path = Path(output_dir) / SAMPLES_FILE
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                kept.append(line)
        except (ValueError, AttributeError):
            continue
    atomic_write_lines(path, kept)
