"""Model folders written to disk: a whole Hugging Face folder from any process, and the cache
entries built once (the embedded model's warm start, a GGUF file's conversion).

transformers' ``save_pretrained`` writes nothing but on rank 0 of an initialised
``torch.distributed`` group, so a folder another rank saves for itself (a cache entry it builds
first, the start folder of its own vLLM engine) would come out without config or weights, and a
cache entry left so would break every later run. ``save_model_folder`` writes the whole folder on
the process that calls it and checks that it is complete; ``build_cached_folder`` builds an entry
in a staging folder under a lock (concurrent builders wait for the first) and renames it into
place, replacing an incomplete entry an older version or a killed builder left behind.

A cache entry is whole or absent: the builder writes a completion record (``RECORD``: the size and
SHA-256 of every file) last, and every read checks the files against it, so a weights file cut
short afterwards (a full disk, a copy of the cache interrupted, a file edited by hand) is found
and the entry rebuilt with a line saying so, instead of failing every later run in the loader.
An entry an older version built without a record is checked for structure (each safetensors
file as long as its header says, each JSON file parseable) and, when whole, given its record.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Callable

from ..core.alive import still_working
from ..core.files import atomic_write_text
from ..core.folder_lock import build_lock

__all__ = [
    "WEIGHT_FILES",
    "RECORD",
    "is_model_folder",
    "save_model_folder",
    "build_cached_folder",
    "write_record",
    "folder_damage",
    "weights_damage",
    "HF_JSON_FILES",
    "loadable_folder_damage",
]

# what holds a folder's weights (one of them), as save_pretrained writes them
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# the JSON files transformers reads from a model folder when they are there: the model's config, its
# generation settings, the tokenizer's files, a sharded checkpoint's index, a PEFT adapter's config
HF_JSON_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "vocab.json",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    "adapter_config.json",
)
# the completion record of a cache entry, written last by its builder (see the module docstring)
RECORD = "entropyrl_complete.json"
_CHUNK = 1 << 22


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


def _files(folder: Path) -> list[Path]:
    """The regular files under ``folder`` but the record, sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_record(folder: Path) -> None:
    """Write ``folder``'s completion record: the size and SHA-256 of each of its files."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in _files(folder)}
    atomic_write_text(folder / RECORD, json.dumps({"version": 1, "files": files}, indent=1, sort_keys=True))


def _record_damage(folder: Path, record: dict) -> str | None:
    """What differs between ``folder``'s files and its record (None when nothing does)."""
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files or not all(isinstance(v, dict) for v in files.values()):
        return f"its completion record {RECORD} lists no files"
    for name, want in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want.get("size"):
            return f"{name} holds {size} bytes, its completion record says {want.get('size')}"
    for name, want in sorted(files.items()):  # sizes first: a cut file is named without hashing the rest
        if _sha256(folder / name) != want.get("sha256"):
            return f"{name} differs from its completion record (SHA-256)"
    return None


def _safetensors_damage(path: Path) -> str | None:
    """Whether a safetensors file is as long as its header says (None when it is)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length)) if 8 + length <= size else None
    except (OSError, struct.error, ValueError):
        header = None
    if not isinstance(header, dict):
        return f"{path.name} is cut inside its header ({size} bytes)"
    ends = [
        v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
    ]
    need = 8 + length + max(ends, default=0)
    if size != need:
        return f"{path.name} holds {size} bytes, its header describes {need}"
    return None


def _json_damage(path: Path) -> str | None:
    """Why the JSON file ``path`` does not parse (its name and the parser's first line), or None."""
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{path.name} is not whole JSON ({str(exc).splitlines()[0]})"
    return None


def _structure_damage(folder: Path) -> str | None:
    """A record-less entry's structural check: safetensors lengths, JSON files parse."""
    for path in _files(folder):
        if path.suffix == ".safetensors":
            problem = _safetensors_damage(path)
        elif path.suffix == ".json":
            problem = _json_damage(path)
        else:
            continue
        if problem:
            return problem
    return None


def weights_damage(folder: Path) -> str | None:
    """Why a model folder's safetensors weights are not whole (a file shorter or longer than its
    header says), or None: a cheap check (headers only) of any folder, before a loader reads it."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_damage(path)
        if problem:
            return problem
    return None


def loadable_folder_damage(folder: Path) -> str | None:
    """Why the local model folder ``folder`` would not load whole (in words), or None: no
    ``config.json`` or no weights file (unless it is a PEFT adapter's folder), a file of
    ``HF_JSON_FILES`` that does not parse, or a safetensors file cut short (``weights_damage``). A cheap check of any folder before a loader reads
    it: transformers raises a bare ``JSONDecodeError`` for most of these, and for a damaged
    ``generation_config.json`` silently falls back to the model config's defaults (another end of
    response). Not a folder (a hub id): None."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    adapter = (folder / "adapter_config.json").is_file()  # a PEFT adapter's folder: its base model loads from elsewhere
    if not (folder / "config.json").is_file() and not adapter:
        return "it has no config.json"
    if not adapter and not any((folder / name).is_file() for name in WEIGHT_FILES):
        return f"it has no weights file ({' or '.join(WEIGHT_FILES[::2])})"
    for name in HF_JSON_FILES:
        problem = _json_damage(folder / name) if (folder / name).is_file() else None
        if problem:
            return problem
    return weights_damage(folder)


def folder_damage(folder: Path) -> str | None:
    """Why the cache entry ``folder`` is not whole (in words), or None when it is: not a model
    folder, a file missing or differing from its completion record, or -- an entry with no record
    -- a file cut short."""
    folder = Path(folder)
    if not folder.is_dir():
        return "it does not exist"
    if not is_model_folder(folder):
        return "it holds no config or weights"
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return _structure_damage(folder)
    except (OSError, ValueError):
        return f"its completion record {RECORD} is unreadable"
    return _record_damage(folder, record)


def build_cached_folder(target: Path, build: Callable[[Path], None], *, waiting: str, log=print) -> Path:
    """The cache entry ``target``: returned at once when it is whole (``folder_damage``), else built
    by ``build(staging)`` into a fresh staging folder beside it, given its completion record and
    renamed into place. One builder at a time (a lock file beside the entry); a process that waited
    logs ``waiting`` and takes the first one's result. A damaged entry in the way is replaced, with
    a line saying why, and the staging folders of builders that were killed are removed. An entry
    an older version built without a record is given one when whole. ``OSError`` from making the
    staging folder is the caller's to word."""
    target = Path(target)
    with still_working(log, f"checking the cache entry {target.name} against its record"):  # every file hashed
        whole = folder_damage(target) is None and (target / RECORD).is_file()
    if whole:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(target.parent / f".{target.name}.lock", on_wait=lambda: log(waiting)) as alone:
        problem = folder_damage(target)
        if problem is None:  # built while this process waited, or an entry from before completion records
            if not (target / RECORD).is_file():
                try:
                    write_record(target)
                except OSError:  # a read-only cache: the entry is whole, it just stays without its record
                    pass
            return target
        if target.exists():
            log(f"the cache entry {target} is damaged ({problem}): building it again")
        if alone:  # what a builder killed mid-way left behind (nobody else builds this entry now)
            for stale in target.parent.glob(f".{target.name}-tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-tmp-"))
        try:
            build(staging)
            if not is_model_folder(staging):
                raise RuntimeError(f"building {target.name} left no model folder in {staging}")
            write_record(staging)  # last: an entry with a record is whole
            _install(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already when it became the entry
    return target


def _install(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; a damaged ``target`` (this process holds the build lock,
    so nobody is writing it) is moved aside and removed first."""
    try:
        os.replace(staging, target)  # atomic: an unlocked concurrent builder races harmlessly
        return
    except OSError:
        if not target.exists():  # no way in
            raise
        if folder_damage(target) is None and (target / RECORD).is_file():  # another builder got there first
            return
    aside = target.with_name(f".{target.name}-incomplete-{os.getpid()}")
    os.replace(target, aside)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(staging, target)
