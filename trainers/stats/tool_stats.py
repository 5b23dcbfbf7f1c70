"""Statistics of multi-turn responses with a tool (``tools=code_interpreter``), pure functions of a
batch's ``ToolTrace`` (``rollout/base.py``) and its token statistics.

- ``tool_use_metrics``: ``tools/turns/mean``, ``tools/calls/mean`` (per response),
  ``tools/error_frac`` (calls that errored / calls), ``tools/seconds`` (wall time in tools; the
  trainer turns it into ``tools/time_frac`` of the step), ``tools/called_frac`` (responses with a
  call), ``tools/{malformed,repeated,void}_frac`` (responses with a malformed call, a repeated
  call, a void turn), ``tokens/kind/<kind>`` (mean tokens of each kind per response).
- ``token_kind_metrics``: ``entropy/kind/<kind>`` for the policy's kinds (``text``, ``code``,
  ``post_tool``; tool outputs are not the policy's and have no entropy here), and
  ``entropy/turn/first`` / ``entropy/turn/later`` (policy tokens of the first generation turn
  against those of every later one). NaN where a batch has no such token.
- ``policy_lengths``: each response's own token count, the tool's outputs left out: with its own
  text (``evals.generation.policy_texts``), what the text-level long-CoT metrics read in a tool run
  (reflection words, repetition, lengths by verdict; ``docs/long-cot.md``), so an interpreter's
  output is never counted as the policy's writing.
- ``tool_shaping``: the optional reward term (``tools.shaping``), 0 when off.
- ``invalid_call_rows``: [B] responses with a malformed call, which ``tools.mask_invalid_calls``
  leaves out of the loss (a STARE recipe switch).
- ``left_out_rows``: [B] responses the recipe switches leave out of the loss: a malformed call
  (``tools.mask_invalid_calls``), a repeated call (``tools.mask_repeated``), a void turn
  (``tools.drop_void_turns``); ``loss_mask`` is the policy mask with those rows zeroed. A row left
  out keeps its reward, so it still enters its group's baseline: only its tokens leave the loss.
  ``tools/repeated_frac`` and ``tools/void_frac`` (every step, from ``tool_use_metrics``) count the
  responses each switch would drop; ``tools/masked_frac`` those the switches on did drop.
- ``overlong_filter``: the same for the responses cut at the length budget (DAPO's overlong
  filtering, ``algo.overlong.filter``; not a tool switch, but the same mask); ``overlong/filtered_frac``.
- ``step_loss_mask``: the step's loss mask, both of the above applied, with the shares they left
  out (``tools/masked_frac``, ``overlong/filtered_frac``): the one place the mask is built.
"""

from __future__ import annotations

import torch

from ...evals.runner import tool_summary
from ...rollout.base import TOKEN_KINDS, Rollout, ToolTrace

__all__ = [
    "tool_use_metrics",
    "token_kind_metrics",
    "tool_shaping",
    "policy_lengths",
    "invalid_call_rows",
    "left_out_rows",
    "loss_mask",
    "overlong_filter",
    "step_loss_mask",
    "POLICY_KINDS",
]

POLICY_KINDS = tuple(k for k in TOKEN_KINDS if k != "tool")


def tool_use_metrics(trace: ToolTrace, response_mask: torch.Tensor) -> dict[str, float]:
    """Per-response tool use of a batch (see the module docstring). ``response_mask`` [B, R]. The
    figures validation and ``entropyrl eval`` log too are ``evals.runner.tool_summary``'s, so the
    three read the same."""
    out = {**tool_summary(trace), "tools/seconds": float(trace.seconds)}
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


def policy_lengths(roll: Rollout) -> torch.Tensor:
    """[B] the tokens each response's policy sampled (``roll.lengths`` less the tool's outputs)."""
    return roll.policy_mask.sum(-1)


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


def _rows(counts: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(like.shape, dtype=torch.bool) if counts is None else counts > 0


def left_out_rows(
    trace: ToolTrace, *, invalid_calls: bool = False, repeated: bool = False, void_turns: bool = False
) -> torch.Tensor:
    """[B] bool: responses left out of the loss by the switches that are on (see the module docstring)."""
    out = torch.zeros(trace.calls.shape, dtype=torch.bool)
    if invalid_calls:
        out |= invalid_call_rows(trace)
    if repeated:
        out |= _rows(trace.repeated, trace.calls)
    if void_turns:
        out |= _rows(trace.void, trace.calls)
    return out


def loss_mask(roll: Rollout, **switches: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(mask [B, R] float, left out [B] bool or None)``: the policy mask (0 on tool outputs) with the
    rows the switches (``left_out_rows``' keywords) leave out set to 0; None when no switch is on
    or the batch has no tool trace."""
    mask = roll.policy_mask.float()
    if roll.tools is None or not any(switches.values()):
        return mask, None
    out = left_out_rows(roll.tools, **switches)
    return mask * (~out).to(mask).unsqueeze(-1), out


def overlong_filter(mask: torch.Tensor, truncated: torch.Tensor) -> tuple[torch.Tensor, float]:
    """DAPO's overlong filtering (``algo.overlong.filter``): ``(mask [B, R] with the rows of the
    responses cut at the length budget zeroed, the share of such rows)``. ``truncated``: [B] bool
    (or 0/1). Their rewards are untouched, so they stay in their groups' baselines."""
    cut = truncated.bool()
    return mask * (~cut).to(mask).unsqueeze(-1), cut.float().mean().item()


def step_loss_mask(
    roll: Rollout, switches: dict[str, bool], *, overlong: bool, device: torch.device | str
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(mask [B, R] float on device, shares)``: the tokens a step trains on. Tool outputs are 0
    (not the policy's tokens); with the recipe switches on (``switches``: ``loss_mask``' keywords),
    whole responses leave the loss (a malformed call, a repeated call, a void turn), and with
    ``overlong`` (DAPO's overlong filtering) those cut at the length budget too; their rewards stay
    in the baselines. ``shares``: ``tools/masked_frac`` when a switch applied, and
    ``overlong/filtered_frac`` with ``overlong``."""
    mask, left_out = loss_mask(roll, **switches)
    mask = mask.to(device)
    shares: dict[str, float] = {}
    if left_out is not None:
        shares["tools/masked_frac"] = left_out.float().mean().item()
    if overlong:
        mask, shares["overlong/filtered_frac"] = overlong_filter(mask, roll.truncated.to(device))
    return mask, shares
