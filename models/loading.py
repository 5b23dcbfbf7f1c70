"""The one entry point that training and evaluation load a policy through: ``load_policy(model_cfg)``
returns ``(model, tokenizer)`` for the embedded tiny model (``models/tiny.py``) or for any local
Hugging Face folder / hub id (``model.path``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ..core.errors import UserError
from .tiny import embedded_model_dir

_STEP = re.compile(r"^step_(\d+)$")


def resolve_model_path(path: str, log=print) -> str:
    """The Hugging Face folder ``path`` stands for. An entropyrl checkpoint folder
    (``<run>/checkpoints/step_N``) holds the model in ``model/`` (with LoRA the adapter there, and
    the merged model in ``merged/`` when saved: that one is used); a run folder (``<run>``, holding
    ``checkpoints/``) stands for its latest checkpoint. Anything else (a model folder, a hub id) is
    returned unchanged. The choice is logged, so the folder that was loaded is on record."""
    p = Path(str(path)).expanduser()
    if not p.is_dir() or (p / "config.json").exists() or (p / "adapter_config.json").exists():
        return str(path)
    if (p / "checkpoints").is_dir():
        steps = sorted((int(m.group(1)), c) for c in (p / "checkpoints").iterdir()
                       if (m := _STEP.match(c.name)) and (c / "model").is_dir())
        if not steps:
            raise UserError(f"model.path={path}: a run folder without a checkpoint (no checkpoints/step_N/model): "
                            f"point model.path at a model folder")
        p = steps[-1][1]
        kind = f"a run folder; its latest checkpoint {p.name}"
    else:
        kind = "a checkpoint folder"
    if (p / "model").is_dir():
        inner = p / "model"
        if (inner / "adapter_config.json").exists() and (p / "merged" / "config.json").exists():
            inner = p / "merged"
        log(f"model.path={path}: {kind}; loading {inner}")
        return str(inner)
    return str(path)


def checkpoint_label(path: str) -> str:
    """``<run>-step<N>`` for a folder inside ``<run>/checkpoints/step_N``, else the folder's name:
    what names an evaluation run, so that runs of several checkpoints are told apart."""
    parts = Path(str(path)).expanduser().parts
    for i in range(len(parts) - 1, 0, -1):
        m = _STEP.match(parts[i])
        if m and parts[i - 1] == "checkpoints":
            run = parts[i - 2] if i >= 2 else "run"
            return f"{run}-step{int(m.group(1))}"
    return Path(str(path)).name or str(path)


def load_policy(model_cfg, task_cfg=None, log=print):
    """``(model, tokenizer)`` for ``model_cfg``: the embedded tiny model or ``model_cfg.path``
    (a checkpoint or run folder resolved to its model, ``resolve_model_path``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_cfg.get("path")
    if path:
        path = resolve_model_path(str(path), log=log)
    if not path:
        path = embedded_model_dir(model_cfg, task_cfg, log=log)
    elif not Path(str(path)).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise UserError(f"model path '{path}' does not exist and HF_HUB_OFFLINE=1: "
                        f"point model.path at a local Hugging Face folder")
    dtype = getattr(torch, str(model_cfg.get("dtype", "float32")))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except OSError as exc:
        raise UserError(f"cannot load model '{path}': {str(exc).splitlines()[0]} "
                        f"(set model.path to a local Hugging Face folder or a reachable hub id)") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer
