"""The one entry point that training and evaluation load a policy through: ``load_policy(model_cfg)``
returns ``(model, tokenizer)`` for the embedded tiny model (``models/tiny.py``) or for any local
Hugging Face folder / hub id (``model.path``)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..core.errors import UserError
from .tiny import embedded_model_dir


def load_policy(model_cfg, task_cfg=None, log=print):
    """``(model, tokenizer)`` for ``model_cfg``: the embedded tiny model or ``model_cfg.path``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_cfg.get("path")
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
