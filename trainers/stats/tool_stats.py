"""Statistics of multi-turn responses with a tool (``tools=code_interpreter``), pure functions of a
batch's ``ToolTrace`` (``rollout/base.py``) and its token statistics.

- ``tool_use_metrics``: ``tools/turns/mean``, ``tools/calls/mean`` (per response),
  ``tools/error_frac`` (calls that errored / calls), ``tools/seconds`` (wall time in tools; the
  trainer turns it into ``tools/time_frac`` of the step), ``tools/called_frac`` (responses with a
  call), ``tokens/kind/<kind>`` (mean tokens of each kind per response).
- ``token_kind_metrics``: ``entropy/kind/<kind>`` for the policy's kinds (``text``, ``code``,
  ``post_tool``; tool outputs are not the policy's and have no entropy here), and
  ``entropy/turn/first`` / ``entropy/turn/later`` (policy tokens of the first generation turn
  against those of every later one). NaN where a batch has no such token.
- ``tool_shaping``: the optional reward term (``tools.shaping``), 0 when off.
- ``invalid_call_rows``: [B] responses with a malformed call, which ``tools.mask_invalid_calls``
  leaves out of the loss (a STARE recipe switch).
"""

from __future__ import annotations

import torch

from ...rollout.base import TOKEN_KINDS, ToolTrace

__all__ = ["tool_use_metrics", "token_kind_metrics", "tool_shaping", "invalid_call_rows", "POLICY_KINDS"]

POLICY_KINDS = tuple(k for k in TOKEN_KINDS if k != "tool")


def tool_use_metrics(trace: ToolTrace, response_mask: torch.Tensor) -> dict[str, float]:
    """Per-response tool use of a batch (see the module docstring). ``response_mask`` [B, R]."""
    calls = trace.calls.float()
    out = {
        "tools/turns/mean": trace.turns.float().mean().item(),
        "tools/calls/mean": calls.mean().item(),
        "tools/error_frac": (trace.errors.sum() / calls.sum()).item() if calls.sum() > 0 else 0.0,
        "tools/called_frac": (calls > 0).float().mean().item(),
        "tools/seconds": float(trace.seconds),
    }
    if trace.malformed is not None:
        out["tools/malformed_frac"] = (trace.malformed > 0).float().mean().item()
    valid = response_mask.bool()
    for i, kind in enumerate(TOKEN_KINDS):
        out[f"tokens/kind/{kind}"] = ((trace.kind == i) & valid).sum(-1).float().mean().item()
    return out


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else float("nan")


def token_kind_metrics(entropy: torch.Tensor, mask: torch.Tensor, trace: ToolTrace) -> dict[str, float]:
    """Mean entropy of the policy's tokens by kind and by turn. ``entropy``, ``mask`` [B, R] (``mask``:
    the policy mask, 0 on tool outputs)."""
    kind, turn = trace.kind.to(entropy.device), trace.turn.to(entropy.device)
    m = mask.to(entropy.dtype)
    out = {f"entropy/kind/{k}": _masked_mean(entropy, m * (kind == TOKEN_KINDS.index(k)).to(m.dtype)) for k in POLICY_KINDS}
    out["entropy/turn/first"] = _masked_mean(entropy, m * (turn == 0).to(m.dtype))
    out["entropy/turn/later"] = _masked_mean(entropy, m * (turn > 0).to(m.dtype))
    return out


def tool_shaping(trace: ToolTrace, call_bonus: float, error_penalty: float) -> torch.Tensor:
    """[B] reward term: ``call_bonus`` for a response with a call that did not error, minus
    ``error_penalty`` per errored call."""
    clean = ((trace.calls - trace.errors) > 0).float()
    return call_bonus * clean - error_penalty * trace.errors.float()


def invalid_call_rows(trace: ToolTrace) -> torch.Tensor:
    """[B] bool: responses with at least one malformed call (none when the trace does not say)."""
    if trace.malformed is None:
        return torch.zeros(trace.calls.shape, dtype=torch.bool)
    return trace.malformed > 0
