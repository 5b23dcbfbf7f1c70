"""Model folders written to disk: a whole Hugging Face folder from any process, and the cache
entries built once (the embedded model's warm start, a GGUF file's conversion).

transformers' ``save_pretrained`` writes nothing but on rank 0 of an initialised
``torch.distributed`` group, so a folder another rank saves for itself (a cache entry it builds
first, the start folder of its own vLLM engine) would come out without config or weights, and a
cache entry left so would break every later run. ``save_model_folder`` writes the whole folder on
the process that calls it and checks that it is complete; ``build_cached_folder`` builds an entry
in a staging folder under a lock (concurrent builders wait for the first) and renames it into
place, replacing an incomplete entry an older version or a killed builder left behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from ..core.folder_lock import build_lock

__all__ = ["WEIGHT_FILES", "is_model_folder", "save_model_folder", "build_cached_folder"]

# what holds a folder's weights (one of them), as save_pretrained writes them
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def is_model_folder(folder: Path) -> bool:
    """``folder`` holds a model's config and its weights."""
    folder = Path(folder)
    return (folder / "config.json").is_file() and any((folder / name).is_file() for name in WEIGHT_FILES)


def save_model_folder(model, folder: Path, tokenizer=None, **kwargs) -> Path:
    """``model.save_pretrained(folder, **kwargs)`` (and ``tokenizer``'s) written by this process
    whatever its rank (see the module docstring); ``RuntimeError`` if the folder is still not a
    whole model folder afterwards."""
    folder = Path(folder)
    own = "should_save_on_this_rank" in vars(model)
    previous = vars(model).get("should_save_on_this_rank")
    model.should_save_on_this_rank = lambda is_main_process=True: True  # this process writes, rank or not
    try:
        model.save_pretrained(str(folder), **kwargs)
    finally:
        if own:
            model.should_save_on_this_rank = previous
        else:
            del model.should_save_on_this_rank
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    if not is_model_folder(folder):
        raise RuntimeError(
            f"save_pretrained wrote no config or weights into {folder} (files: {sorted(p.name for p in folder.iterdir())})"
        )
    return folder


def build_cached_folder(target: Path, build: Callable[[Path], None], *, waiting: str, log=print) -> Path:
    """The cache entry ``target``: returned at once when it is a whole model folder, else built by
    ``build(staging)`` into a fresh staging folder beside it and renamed into place. One builder at
    a time (a lock file beside the entry); a process that waited logs ``waiting`` and takes the
    first one's result. An incomplete entry in the way is replaced, and the staging folders of
    builders that were killed are removed. ``OSError`` from making the
    staging folder is the caller's to word."""
    target = Path(target)
    if is_model_folder(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(target.parent / f".{target.name}.lock", on_wait=lambda: log(waiting)) as alone:
        if is_model_folder(target):  # built while this process waited
            return target
        if alone:  # what a builder killed mid-way left behind (nobody else builds this entry now)
            for stale in target.parent.glob(f".{target.name}-tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-tmp-"))
        try:
            build(staging)
            if not is_model_folder(staging):
                raise RuntimeError(f"building {target.name} left no model folder in {staging}")
            _install(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already when it became the entry
    return target


def _install(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; an incomplete ``target`` (this process holds the build
    lock, so nobody is writing it) is moved aside and removed first."""
    try:
        os.replace(staging, target)  # atomic: an unlocked concurrent builder races harmlessly
        return
    except OSError:
        if is_model_folder(target) or not target.exists():  # another builder got there first, or no way in
            if not target.exists():
                raise
            return
    aside = target.with_name(f".{target.name}-incomplete-{os.getpid()}")
    os.replace(target, aside)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(staging, target)
