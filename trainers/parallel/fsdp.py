"""FSDP2 for the policy: sharding (``prepare_model``: ``fully_shard`` per decoder layer and the root,
bf16 mixed precision, gradient checkpointing) and full (unsharded) state dicts for checkpoints
(``checkpoint_views`` to save from rank 0, ``load_full_state`` to resume on every rank).
Without FSDP every helper passes the model and optimizer through. See ``distributed.py``.
"""

from __future__ import annotations

import types
from typing import Sequence

import torch

from ...core.errors import UserError
from .process_group import DistInfo

__all__ = [
    "decoder_layers",
    "is_fsdp",
    "prepare_model",
    "sharded_parameters",
    "checkpoint_views",
    "load_full_state",
    "full_weights",
]


def _response_hidden(self, **inputs):
    """Last hidden states of the base model: an FSDP forward method of the root (see module doc)."""
    return getattr(self, self.base_model_prefix)(**inputs).last_hidden_state


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise UserError(
            f"cannot find the decoder layers of {type(model).__name__} (expected "
            f"model.{getattr(model, 'base_model_prefix', 'model')}.layers) to shard with FSDP"
        )
    return list(layers)


def is_fsdp(model) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, FSDPModule)


def sharded_parameters(model) -> list[torch.nn.Parameter]:
    """The trainable parameters as the optimizer holds them: with FSDP the sharded ones (DTensors).
    Between a forward and its backward, or after a forward of the root (``reshard_after_forward=False``),
    ``model.parameters()`` yields the gathered full tensors instead; every FSDP module is resharded
    first (a no-op when it already is, no collective)."""
    if is_fsdp(model):
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
    return [p for p in model.parameters() if p.requires_grad]


def prepare_model(model, trainer_cfg, info: DistInfo, *, trainable: bool = True):
    """Gradient checkpointing (``trainer.gradient_checkpointing``, trainable models only) and
    FSDP2 sharding (``info.fsdp``): ``fully_shard`` per decoder layer, then the root. The model
    must already be on ``info.device``. Returns the same object (FSDP2 wraps in place)."""
    if trainable and bool(trainer_cfg["gradient_checkpointing"]):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not info.fsdp:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(info.device.type, (info.world_size,))
    if str(trainer_cfg["dtype"]) == "bfloat16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    # The root keeps its parameters gathered after forward: the output projection is used right
    # after the forward (token statistics read lm_head.weight directly) and again in backward.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    model.response_hidden = types.MethodType(_response_hidden, model)
    register_fsdp_forward_method(model, "response_hidden")
    model._is_fsdp_managed_module = True  # transformers' generate: synced_gpus across ranks
    return model


# ---------------------------------------------------------------------------------------------
# checkpoints: a full state dict, written by rank 0
# ---------------------------------------------------------------------------------------------
class _ModelView:
    """What ``checkpoint.save_checkpoint`` needs of a model: ``save_pretrained`` of the full weights."""

    def __init__(self, model, state_dict):
        self.model, self.state_dict_full = model, state_dict

    def save_pretrained(self, path, **kwargs):
        return self.model.save_pretrained(path, state_dict=self.state_dict_full, **kwargs)


class _OptimView:
    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def checkpoint_views(model, optimizer, info: DistInfo):
    """``(model, optimizer)`` to hand to ``checkpoint.save_checkpoint``: the objects themselves
    without FSDP; with FSDP, views holding the full (unsharded, CPU) model and optimizer state
    dicts, gathered from every rank (a collective: every rank must call it; only rank 0 receives
    the tensors)."""
    if not is_fsdp(model):
        return model, optimizer
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=opts)
    return _ModelView(model, model_sd), _OptimView(optim_sd)


def full_weights(model) -> dict[str, torch.Tensor]:
    """``model``'s state dict with every tensor whole and on the CPU, on every rank: without FSDP
    its own (detached) tensors; with FSDP each sharded tensor gathered, one at a time and in the
    same order on every rank (a collective: every rank must call it)."""
    if not is_fsdp(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from torch.distributed.tensor import DTensor

    out = {}
    for key, value in model.state_dict().items():
        whole = value.full_tensor() if isinstance(value, DTensor) else value
        out[key] = whole.detach().cpu()
    return out


def _param_names(model) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def _optim_keys_are_names(state: dict) -> bool:
    groups = state.get("param_groups") or []
    return any(isinstance(p, str) for g in groups for p in g.get("params", []))


def _optim_with_keys(state: dict, keys: list) -> dict:
    """Re-key an optimizer state dict (index <-> parameter name) in ``model.parameters()`` order,
    the order the trainer builds its optimizer in (FSDP keeps it)."""
    old = [p for g in state["param_groups"] for p in g["params"]]
    if len(old) != len(keys):
        raise UserError(
            f"checkpoint optimizer holds {len(old)} parameters, the model has {len(keys)}: resume with the same model"
        )
    mapping = dict(zip(old, keys))
    return {
        "state": {mapping[k]: v for k, v in state["state"].items()},
        "param_groups": [{**g, "params": [mapping[p] for p in g["params"]]} for g in state["param_groups"]],
    }


def load_full_state(model, optimizer, model_state: dict, optim_state: dict | None) -> None:
    """Load full (unsharded) state dicts into a model that may be sharded; every rank passes the
    full dicts (read from the shared checkpoint). Checkpoints are portable between one process
    and FSDP: optimizer states keyed by index (``optimizer.state_dict()``) or by parameter name
    (FSDP's full state dict) are converted as needed."""
    names = _param_names(model)
    if not is_fsdp(model):
        model.load_state_dict(model_state)
        if optim_state is not None:
            if _optim_keys_are_names(optim_state):
                optim_state = _optim_with_keys(optim_state, list(range(len(names))))
            optimizer.load_state_dict(optim_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=opts)
    if optim_state is not None:
        if not _optim_keys_are_names(optim_state):
            optim_state = _optim_with_keys(optim_state, names)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=optim_state, options=opts)
