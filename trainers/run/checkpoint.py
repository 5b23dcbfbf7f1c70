"""Checkpoints: Hugging Face model folder + optimizer, RNG and algorithm state, written atomically.

Layout: ``<output_dir>/checkpoints/step_000020/{model/, trainer_state.pt, config.yaml}`` (a LoRA run: ``model/``
holds the adapter, and ``merged/`` the merged model when ``model.lora.save_merged``). A checkpoint is
written to a hidden staging folder (``.tmp-*``), its files and folders are fsync'd, and only then
is it renamed into place (and the parent folder fsync'd), so neither a crash mid-write nor a power
loss right after leaves a half checkpoint that resume would pick up. Staging folders left behind by
a killed save are removed at the next save or resume. On resume, a checkpoint that fails to load
(a truncated ``trainer_state.pt``, a damaged weights file) is skipped with a warning and the
previous intact one is used (``load_latest_intact``).

A run with a rollout worker (``trainer.staleness=k >= 1``) also keeps, per trainer rank, the
batches that rank drew from its worker for the next steps: ``pending_batches_rank<r>.pt``
(``trainers/async_rollout.py``: ``AsyncRollouts.checkpoint_record``), written by rank 0 into the
same staging folder, so they appear together with the weights they follow or not at all.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from ...core.files import fsync_dir

_STEP_DIR = re.compile(r"^step_(\d+)$")
STAGING_PREFIX = ".tmp-"
CONFIG_COPY = "config.yaml"  # each checkpoint's copy of the run's config (resume checks against it)
PENDING_BATCHES = "pending_batches_rank{rank}.pt"  # a trainer rank's batches drawn ahead (staleness k >= 1)


def pending_batches_name(rank: int) -> str:
    """The file of trainer rank ``rank``'s pending batches in a checkpoint folder."""
    return PENDING_BATCHES.format(rank=int(rank))


def checkpoint_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def _step_dirs(output_dir: Path) -> list[tuple[int, Path]]:
    """``[(step, folder)]`` of the complete-looking checkpoints, oldest first."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / "trainer_state.pt").exists()
    )


def checkpoint_steps(output_dir: Path) -> list[int]:
    return [s for s, _ in _step_dirs(output_dir)]


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete-looking checkpoint folder, or None."""
    found = _step_dirs(output_dir)
    return found[-1][1] if found else None


def remove_staging(output_dir: Path) -> list[Path]:
    """Delete ``.tmp-*`` staging folders a killed save left behind; returns what was removed."""
    root = checkpoint_dir(output_dir)
    stale = [p for p in root.glob(f"{STAGING_PREFIX}*")] if root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every folder (deepest first), then ``root``."""
    folders = []
    for dirpath, _dirnames, filenames in os.walk(root):
        folders.append(dirpath)
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
    for d in reversed(folders):
        fsync_dir(Path(d))


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _storage_failing(folder: Path) -> bool:
    """Whether ``folder``'s disk is (nearly) full, judged after a write failed."""
    try:
        return shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return True


def save_checkpoint(
    output_dir: Path,
    step: int,
    model,
    tokenizer,
    optimizer,
    extra: dict,
    keep: int = 2,
    export=None,
    config_text: str | None = None,
    objects: dict[str, object] | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically and delete all but the newest ``keep``. ``model``: what
    ``save_pretrained`` writes (a LoRA run: the adapter); ``export(folder)`` writes more into the
    staging folder (a LoRA run's merged model) before it is made visible; ``config_text``: the
    run's config as YAML, kept as ``CONFIG_COPY`` (what a resume compares with when the run
    folder's config.yaml is lost); ``objects``: ``{file name: object}`` saved with ``torch.save``
    beside the trainer state (every rank's pending batches, ``pending_batches_name``)."""
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    remove_staging(output_dir)
    final = root / f"step_{step:06d}"
    staging = Path(tempfile.mkdtemp(dir=root, prefix=STAGING_PREFIX))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would make the checkpoint private to its writer
    try:
        model.save_pretrained(staging / "model")
        tokenizer.save_pretrained(staging / "model")
        if export is not None:
            export(staging)
        torch.save({"step": step, "optimizer": optimizer.state_dict(), "rng": rng_state(), **extra}, staging / "trainer_state.pt")
        if config_text is not None:
            (staging / CONFIG_COPY).write_text(config_text)
        for name, value in (objects or {}).items():
            torch.save(value, staging / name)
        record = Path(output_dir) / "metrics.jsonl"
        if record.exists():  # the record up to this step: rebuilt from here if it is lost
            shutil.copyfile(record, staging / "metrics.jsonl")
        fsync_tree(staging)  # data on disk before the rename makes it visible
    except BaseException as exc:  # a full disk, a signal: no half checkpoint stays behind
        full = isinstance(exc, Exception) and not isinstance(exc, OSError) and _storage_failing(root)
        shutil.rmtree(staging, ignore_errors=True)
        if full:
            # torch/safetensors report a full disk as RuntimeError: say what it is
            raise OSError(errno.ENOSPC, f"no space left while writing checkpoint step {step}", str(root)) from None
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    fsync_dir(root)
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    # Checkpoints past this step belong to a timeline that was abandoned (resumed from an earlier,
    # intact one because they failed to load): they must never be resumed from again.
    for s, later in steps:
        if s > step:
            shutil.rmtree(later, ignore_errors=True)
    steps = [(s, p) for s, p in steps if s <= step]
    for _, old in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(ckpt: Path) -> dict:
    return torch.load(Path(ckpt) / "trainer_state.pt", map_location="cpu", weights_only=False)


def load_pending_batches(ckpt: Path, rank: int) -> dict | None:
    """Trainer rank ``rank``'s pending batches as ``save_checkpoint`` wrote them, or None when the
    checkpoint has none (a synchronous run, or one saved before they were kept); raises whatever
    reading a damaged file raises."""
    path = Path(ckpt) / pending_batches_name(rank)
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def load_checkpoint(path: Path, dtype=None) -> tuple[dict, dict]:
    """``(trainer_state, model_state_dict)`` of one checkpoint; raises whatever loading raises."""
    from transformers import AutoModelForCausalLM

    state = load_trainer_state(path)
    missing = [k for k in ("step", "optimizer", "rng") if k not in state]
    if missing:
        raise ValueError(f"trainer_state.pt lacks {', '.join(missing)}")
    if (Path(path) / "model" / "adapter_config.json").exists():  # a LoRA run: the adapter only
        from safetensors.torch import load_file

        return state, load_file(str(Path(path) / "model" / "adapter_model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(Path(path) / "model", dtype=dtype)
    return state, model.state_dict()


def load_latest_intact(output_dir: Path, dtype=None, warn=print) -> tuple[Path, dict, dict] | None:
    """The newest checkpoint that loads: ``(path, trainer_state, model_state_dict)``, or None.

    A checkpoint that fails to load (truncated or missing files) is skipped with a warning and the
    previous one is tried; the next save removes the skipped ones (``save_checkpoint``).
    """
    for _step, path in reversed(_step_dirs(output_dir)):
        try:
            state, weights = load_checkpoint(path, dtype)
        except Exception as exc:  # noqa: BLE001 - any failure to read means: not usable
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            warn(
                f"warning: checkpoint {path} cannot be loaded ({type(exc).__name__}: {reason}); "
                f"skipping it and trying the previous one"
            )
            continue
        return path, state, weights
    return None
