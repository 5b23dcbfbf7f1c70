"""The ``hf`` engine's sampler copies (``rollout.weights=float32_packed | int8 | bfloat16``): a copy of
the policy that samples while the trainer updates the float32 original, made again after each weight
sync. Decoding a few rows is a chain of thin matrix products; a cheaper product per weight is a
cheaper decode step where the CPU has the kernels for it (``make bench`` key ``real_model`` measures
each against float32 on the machine it runs on).

- ``float32_packed``: the same float32 weights, each linear layer's laid out once in oneDNN's blocked
  format (``torch.ops.mkldnn._reorder_linear_weight``) and multiplied by its ``_linear_pointwise``, as
  PyTorch's inductor does for frozen CPU weights. A plain float32 ``linear`` on a few rows re-reads
  the weight in a layout made for large products; the packed one streams it as the product wants it.
  The numbers are float32's up to the order of a sum (CPU only).

- ``int8``: linear layers are torch's dynamically quantized int8 linears (weights int8 per tensor,
  activations quantized per batch at each call: ``torch.ao.quantization.quantize_dynamic``; CPU only).
- ``bfloat16``: every weight in bfloat16 (8 bits of mantissa; activations computed in bfloat16).

A copy is a different policy from the one trained; how far depends on the model and the precision.
The engine therefore reports the sampler's own log-probs of the tokens it drew
(``Rollout.sampling_logp``, as vLLM's engine does), so the run logs how far the two are
(``rollout/logp_diff_mean``) and the truncated importance weights (``algo.interventions=[tis]``) can
correct for it. ``sampled_logp`` computes them from the raw logits ``generate`` returns, at the
sampling temperature: the convention of the trainer's own log-probs (docs/algorithms.md §1).
"""

from __future__ import annotations

import copy
import sys
import warnings

import torch

from ..core.errors import UserError

__all__ = [
    "COPY_WEIGHTS",
    "bf16_copy",
    "check_copy_model",
    "int8_copy",
    "packed_copy",
    "sampled_logp",
    "sampler_copy",
]

#: the ``rollout.weights`` values that sample from a copy (``float32``: the live model samples)
COPY_WEIGHTS = ("float32_packed", "int8", "bfloat16")


def check_copy_model(model, weights: str) -> None:
    """Refuse, with one line, a model the ``weights`` copy cannot be made of: one sharded across ranks
    (FSDP: no rank holds the whole weights), and for ``int8`` one off the CPU (torch's dynamic int8
    linears run on CPU)."""
    params = list(model.parameters())
    kernels = {"int8": "torch's dynamic int8 linears", "float32_packed": "oneDNN's packed float32 linears"}
    if weights in kernels and any(p.device.type != "cpu" for p in params):
        raise UserError(
            f"rollout.weights={weights} samples on CPU only ({kernels[weights]}): on a GPU use rollout=vllm, "
            "or rollout.weights=float32"
        )
    if weights == "float32_packed" and not torch.backends.mkldnn.is_available():
        raise UserError(
            "rollout.weights=float32_packed needs a torch built with oneDNN (mkldnn), which this one is not: "
            "use rollout.weights=float32"
        )
    if any(type(p).__name__ == "DTensor" for p in params):
        raise UserError(
            f"rollout.weights={weights} needs the whole model in one process, and FSDP shards it: use trainer.fsdp=false "
            "or rollout.weights=float32"
        )


def sampler_copy(model: torch.nn.Module, weights: str, rows: int = 4) -> torch.nn.Module:
    """The ``weights`` copy of ``model`` for sampling (``COPY_WEIGHTS``); ``model`` is not changed.
    ``rows``: the rows a decode step multiplies at once (the packed layout's hint)."""
    if weights == "int8":
        return int8_copy(model)
    if weights == "float32_packed":
        return packed_copy(model, rows)
    if weights == "bfloat16":
        return bf16_copy(model)
    raise ValueError(f"no sampler copy for weights={weights!r}")


@torch.no_grad()
def int8_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An int8 copy of ``model`` for sampling (eval mode; ``model`` itself is not changed). LoRA
    adapters are merged into the copy first, so it quantizes the policy the trainer holds."""
    sampler = _frozen(_merged(copy.deepcopy(model)))
    with warnings.catch_warnings():  # torch points eager quantization users to torchao; the pinned torch runs it
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(sampler, {torch.nn.Linear}, dtype=torch.qint8)


class PackedLinear(torch.nn.Module):
    """A float32 ``nn.Linear`` for sampling whose weight is laid out once for oneDNN's product;
    ``forward(x [..., in]) -> [..., out]`` as the linear's, up to the order of its sums."""

    def __init__(self, linear: torch.nn.Linear, rows: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # rows: the product's expected rows, a hint for the layout; any number of rows is multiplied
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().float().contiguous(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


@torch.no_grad()
def packed_copy(model: torch.nn.Module, rows: int = 4) -> torch.nn.Module:
    """A float32 copy of ``model`` for sampling with every ``nn.Linear`` a ``PackedLinear`` (eval
    mode; ``model`` itself is not changed), LoRA adapters merged into it first. A weight tied to
    another (an output head sharing the embedding) is packed for the head and kept for the other."""
    sampler = _frozen(_merged(copy.deepcopy(model)))
    for name, module in list(sampler.named_modules()):
        if isinstance(module, torch.nn.Linear):
            parent, _, child = name.rpartition(".")
            setattr(sampler.get_submodule(parent) if parent else sampler, child, PackedLinear(module, rows))
    return sampler


@torch.no_grad()
def bf16_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A bfloat16 copy of ``model`` for sampling (eval mode; ``model`` itself is not changed), LoRA
    adapters merged into it first."""
    sampler = _frozen(_merged(copy.deepcopy(model)))
    return sampler.to(torch.bfloat16)


def _frozen(model: torch.nn.Module) -> torch.nn.Module:
    for p in model.parameters():
        p.requires_grad_(False)
        p.grad = None
    return model.eval()


def _merged(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with each PEFT adapter layer (LoRA: ``models/lora.py`` injects them in place) merged into
    its base layer and replaced by it: the plain linears the quantisation converts."""
    if "peft" not in sys.modules:  # no adapter was ever applied in this process
        return model
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module.get_base_layer())
    return model


def sampled_logp(logits: tuple[torch.Tensor, ...], new_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[B, R]`` log-probs of the drawn tokens ``new_ids [B, R]`` under ``logits`` (``generate``'s
    ``output_logits``: one ``[B, V]`` per new position, raw) at ``temperature`` (0: greedy, taken at 1)."""
    scale = float(temperature) if temperature > 0 else 1.0
    steps = [
        torch.log_softmax(step.float() / scale, dim=-1).gather(-1, new_ids[:, t : t + 1].to(step.device)).squeeze(-1)
        for t, step in enumerate(logits[: new_ids.shape[1]])
    ]
    if not steps:
        return torch.zeros(new_ids.shape, dtype=torch.float32)
    return torch.stack(steps, dim=1).cpu()
