"""LoRA adapters through PEFT (``model.lora``): only the adapter trains; the reference policy of
the KL term is the same model with the adapter disabled, so no second copy is loaded.

``apply_lora(model, model_cfg)`` injects the adapter into ``model`` in place (the object the
trainer holds keeps its type and its forward, with LoRA layers inside) and returns a
``LoraPolicy`` that knows how to disable it (``reference()``), save and load it, and merge it for
a rollout engine (``merged_named_parameters``) or a Hugging Face export (``save_merged``).
``model.lora.rank: null`` (the default) leaves the model as it is.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from ..core.errors import UserError
from ..core.schema.lora import check_lora_is_on_where_set
from .folders import save_model_folder

__all__ = ["LoraPolicy", "apply_lora", "is_lora", "merged_named_parameters", "ADAPTER_CONFIG"]

ADAPTER_CONFIG = "adapter_config.json"  # what marks a saved adapter folder (PEFT's name)
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


def is_lora(model) -> bool:
    """Whether ``model`` holds injected LoRA layers."""
    return any("lora_" in name for name, _ in model.named_parameters())


@torch.no_grad()
def merged_named_parameters(model) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of the base model's parameters with each adapter folded in
    (``W + scale * B @ A``), under the base model's own names: what a rollout engine that knows
    only the base architecture (vLLM) loads on a sync. ``model`` is left untouched."""
    merged = {}
    for name, layer in _lora_layers(model):
        base = layer.get_base_layer()
        weight = base.weight.detach()
        for adapter in layer.active_adapters:
            if adapter in getattr(layer, "lora_A", {}) and not getattr(layer, "disable_adapters", False):
                weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
        merged[f"{name}.weight"] = weight
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    out = []
    for name, p in model.named_parameters():
        if "lora_" in name:
            continue
        clean = name.replace(".base_layer.", ".")
        if tied and clean.endswith("lm_head.weight"):
            continue
        out.append((clean, merged.get(clean, p.detach())))
    return out


class LoraPolicy:
    """The adapter of a policy (``peft``: the PeftModel wrapping ``model``)."""

    def __init__(self, peft_model, settings: dict):
        self.peft = peft_model
        self.model = peft_model.get_base_model()
        self.settings = settings

    @contextmanager
    def reference(self):
        """The base policy: the adapter disabled for the duration (no second model)."""
        with self.peft.disable_adapter():
            yield self.model

    def trainable(self) -> tuple[int, int]:
        """``(trainable parameters, all parameters)``."""
        params = list(self.model.parameters())
        return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)

    # -- saving / loading ---------------------------------------------------------------------
    def load_adapter(self, folder: Path) -> None:
        """Load a saved adapter's weights into this one (raises what reading raises)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        state = load_file(str(Path(folder) / ADAPTER_WEIGHTS))
        result = set_peft_model_state_dict(self.peft, state)
        missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if missing:
            raise ValueError(f"adapter weights do not fit this model ({missing[0]}): resume with the same model.lora")

    def checkpoint_parts(self, lora_cfg, tokenizer):
        """``(what save_pretrained writes: the adapter, export(folder) or None)``: a checkpoint's
        ``model/`` holds the adapter; with ``save_merged``, ``merged/`` the merged model."""
        if not lora_cfg["save_merged"]:
            return self.peft, None
        return self.peft, lambda folder: self.save_merged(Path(folder) / "merged", tokenizer)

    def save_merged(self, folder: Path, tokenizer=None) -> None:
        """The base model with the adapter folded in, as a plain Hugging Face folder (what
        ``entropyrl eval model.path=`` and vLLM load)."""
        state = {k: v.contiguous() for k, v in merged_named_parameters(self.model)}
        save_model_folder(self.model, folder, tokenizer, state_dict=state)


def lora_settings(model_cfg) -> dict | None:
    """``model.lora`` as PEFT settings, or None when LoRA is off (no rank)."""
    raw = model_cfg.get("lora") if model_cfg is not None else None
    check_lora_is_on_where_set(raw)
    if not raw or not raw.get("rank"):
        return None
    rank = raw.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise UserError(f"model.lora.rank={rank} is not allowed: it must be a positive integer, or null (no LoRA)")
    targets = raw["target_modules"]
    targets = "all-linear" if targets in (None, "all-linear") else [str(t) for t in targets]
    dropout = float(raw["dropout"] or 0.0)
    if not 0.0 <= dropout < 1.0:
        raise UserError(f"model.lora.dropout={dropout:g} is not allowed: it must be in [0, 1)")
    return {
        "r": rank,
        "lora_alpha": float(raw.get("alpha", 2 * rank) or 2 * rank),
        "lora_dropout": dropout,
        "target_modules": targets,
    }


def _check_targets(model, targets) -> None:
    """Every name of a ``target_modules`` list names a module of ``model`` (PEFT's list matching: the
    module's name, or its last dotted parts); PEFT itself refuses only a list of which none matches."""
    if isinstance(targets, str):
        return
    names = [name for name, _ in model.named_modules()]
    unknown = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if unknown:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise UserError(
            f"model.lora.target_modules names {', '.join(unknown)}, which this model does not have: its "
            f"linear layers are {', '.join(linear)} (or set model.lora.target_modules=all-linear)"
        )


def apply_lora(model, model_cfg, log=None) -> LoraPolicy | None:
    """Inject ``model.lora``'s adapter into ``model`` (in place: every base weight frozen), or None."""
    settings = lora_settings(model_cfg)
    if settings is None:
        return None
    from peft import LoraConfig, get_peft_model

    _check_targets(model, settings["target_modules"])
    try:
        peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", bias="none", **settings))
    except ValueError as exc:  # e.g. target modules the model does not have
        raise UserError(
            f"model.lora: {str(exc).splitlines()[0]} (set model.lora.target_modules to module "
            f"names of this model, e.g. [q_proj, v_proj], or all-linear)"
        ) from None
    policy = LoraPolicy(peft_model, settings)
    if log is not None:
        trainable, total = policy.trainable()
        log(f"LoRA rank {settings['r']}: {trainable:,} of {total:,} parameters train")
    return policy
