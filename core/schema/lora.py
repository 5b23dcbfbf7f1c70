"""The schema of ``model.lora`` (LoRA through PEFT, ``models/lora.py``) and the one check across its
keys: LoRA is on only with a rank."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass
from typing import Any

from ..errors import UserError
from ..rules import BOOL, integer, number, owned
from . import key

__all__ = ["Lora", "check_lora_is_on_where_set"]


@dataclass
class Lora:
    """``model.lora``: LoRA through PEFT (``models/lora.py``), for any ``model=`` choice: only the adapter trains;
    the KL reference (``algo.kl_coef > 0``) is the policy with the adapter disabled (no second model); checkpoints
    hold the adapter (plus ``merged/`` with ``save_merged``); vLLM gets merged weights on sync.

        entropyrl train model.lora.rank=8                 # all linear layers
        entropyrl train model=qwen2.5-7b model.lora.rank=64 model.lora.target_modules=[q_proj,v_proj]
    """

    rank: int | None = key(None, integer(1, nullable=True), "null: full fine-tuning; N: LoRA of rank N")
    alpha: float | None = key(None, number(0, open_low=True, nullable=True), "scale alpha/rank; null = 2 * rank")
    dropout: float = key(0.0, number(0, 1, open_high=True), "dropout on the LoRA adapter's input, in [0, 1)")
    target_modules: Any = key(
        "all-linear",
        owned("models/lora.py (all-linear, or a list of module names)"),
        "all-linear (every linear layer but the output head) or a list of module names",
    )
    save_merged: bool = key(False, BOOL, "also write <checkpoint>/merged: the merged model as a Hugging Face folder")


def check_lora_is_on_where_set(lora) -> None:
    """``model.lora`` (a mapping, or None): LoRA is on only with a ``rank``; its other keys set away
    from their defaults without one would be read by nothing (the run fine-tunes every weight), so
    that is one ``UserError`` naming them and both fixes."""
    lora = lora or {}
    if lora.get("rank"):
        return
    set_keys = [
        f"{f.name}={lora[f.name]}"
        for f in dataclasses.fields(Lora)
        if f.name != "rank" and f.name in lora and lora[f.name] != (f.default_factory() if f.default is MISSING else f.default)
    ]
    if set_keys:
        raise UserError(
            f"model.lora.{', model.lora.'.join(set_keys)} set but model.lora.rank is null, which means full fine-tuning "
            f"(LoRA off): set model.lora.rank=N for a LoRA run, or drop those keys"
        )
