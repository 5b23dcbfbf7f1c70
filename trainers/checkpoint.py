"""Checkpoints: Hugging Face model folder + optimizer, RNG and algorithm state, written atomically.

Layout: ``<output_dir>/checkpoints/step_000020/{model/, trainer_state.pt}``. A checkpoint is
written to a hidden temporary folder and renamed into place, so a crash mid-write never leaves a
half checkpoint that resume would pick up.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def latest_checkpoint(output_dir: Path) -> Path | None:
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))
             and (p / "trainer_state.pt").exists()]
    return max(found)[1] if found else None


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output_dir: Path, step: int, model, tokenizer, optimizer, extra: dict, keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically and delete all but the newest ``keep``."""
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    model.save_pretrained(staging / "model")
    tokenizer.save_pretrained(staging / "model")
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "rng": rng_state(), **extra},
               staging / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    for _, old in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(ckpt: Path) -> dict:
    return torch.load(Path(ckpt) / "trainer_state.pt", map_location="cpu", weights_only=False)
