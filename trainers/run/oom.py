"""A training step that runs out of memory: one line naming the knobs that lower a step's memory,
instead of the allocator's traceback.

torch reports exhaustion three ways: ``torch.OutOfMemoryError`` (CUDA and other accelerators), a
``RuntimeError`` from the CPU allocator (``DefaultCPUAllocator: can't allocate memory``), and
Python's ``MemoryError`` (told apart in ``core/oom.py``, shared with ``entropyrl eval``). Which knob helps depends on the run, so the line lists those not yet
turned (micro-batch, packing by tokens, LoRA, gradient checkpointing, response length) and names
``entropyrl plan``, which estimates the memory per rank for the same overrides. What the run
keeps is said too: the steps before it are in metrics.jsonl and the summary, and the last
checkpoint is intact (a step that failed mid-update is never saved: its weights are half-updated).
"""

from __future__ import annotations

from ...core.errors import UserError
from ...core.oom import OOM_WORDS, is_out_of_memory

__all__ = ["OOM_WORDS", "is_out_of_memory", "memory_advice", "memory_error"]  # the classifier lives in core/oom.py


def _get(cfg, dotted: str, default=None):
    node = cfg
    for part in dotted.split("."):
        try:
            node = node.get(part) if hasattr(node, "get") else None
        except Exception:  # noqa: BLE001 - a missing or odd section reads as unset
            node = None
        if node is None:
            return default
    return node


def memory_advice(cfg) -> list[str]:
    """The knobs that lower a training step's memory, those this run has not turned yet first."""
    advice = []
    micro = _get(cfg, "trainer.micro_batch_responses")
    if _get(cfg, "trainer.micro_batch_tokens") is None:
        advice.append(f"lower trainer.micro_batch_responses (now {micro}) or pack by trainer.micro_batch_tokens=<tokens>")
    else:
        advice.append(f"lower trainer.micro_batch_tokens (now {_get(cfg, 'trainer.micro_batch_tokens')})")
    if not int(_get(cfg, "model.lora.rank", 0) or 0):
        advice.append("train a LoRA adapter (model.lora.rank=8)")
    if not bool(_get(cfg, "trainer.gradient_checkpointing", False)):
        advice.append("turn on trainer.gradient_checkpointing=true")
    advice.append(f"shorten rollout.max_new_tokens (now {_get(cfg, 'rollout.max_new_tokens')})")
    return advice


def memory_error(exc: BaseException, cfg, step: int, saved_step: int, device: str = "") -> UserError:
    """The one line for a training step ``step`` that ran out of memory (``exc``), with what to turn
    and where a resume starts."""
    said = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    said = said if len(said) <= 160 else said[:157] + "..."
    if step <= 1:
        kept = "no step had finished and no checkpoint was saved yet"
    elif saved_step:
        kept = (
            f"steps 1-{step - 1} are in metrics.jsonl and the checkpoint at step {saved_step} is intact: "
            f"the same command resumes from it"
        )
    else:
        kept = f"steps 1-{step - 1} are in metrics.jsonl; no checkpoint was saved yet"
    where = f" on {device}" if device else ""
    return UserError(
        f"out of memory{where} in training step {step} ({said}): "
        + "; ".join(memory_advice(cfg))
        + "; `entropyrl plan <the same overrides>` estimates the memory per rank. "
        + kept
    )
