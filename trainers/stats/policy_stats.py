"""Token statistics of a batch of (prompt, response) rows under a model: the log-prob of each
sampled token and the entropy of the distribution it was sampled from, at valid response positions.

The trainer's recomputation of the sampler's statistics (``old_logp``, ``H``), the log-probs the
loss differentiates, and the diagnostics' probe batch all go through ``response_token_stats``.
With ``body_dtype`` (``trainer.dtype=bfloat16`` on one process without FSDP) the transformer body runs
under ``torch.autocast`` in that dtype (its products in bfloat16, the parameters, gradients and
optimizer state float32); the output head and the token statistics stay float32.
"""

from __future__ import annotations

import contextlib

import torch

from ...rollout.base import Rollout
from .token_stats import chunked_token_stats
from .vocab_stats import chunked_vocab_stat

__all__ = ["sequence_inputs", "shared_prompt_hidden", "response_token_stats", "batch_token_stats", "masked_mean"]


def sequence_inputs(rollout: Rollout, device) -> dict[str, torch.Tensor]:
    """Prompt + response as one left-padded sequence, with positions that match generation."""
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1).to(device)
    attention = torch.cat([rollout.prompt_mask, rollout.response_mask], dim=1).to(device)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids}


def shared_prompt_hidden(base, rollout: Rollout, device) -> torch.Tensor | None:
    """``[B, R, D]``: the last hidden state at each position that predicts a response token (the
    prompt's last position, then the response's but its last), with each distinct prompt of the batch
    run through ``base`` once: its KV cache (and last hidden state) is computed for one row and
    gathered to every row that shares it, then the responses run on top of it. Rows of one group share
    their prompt, so the prompt positions cost ``1/n`` of a full forward, and the gradient through the
    gather sums each row's share into the one prompt pass (the same gradient; equal to the plain
    forward's up to float rounding, ``tests/trainers/test_shared_prompt_forward.py``). Positions and the
    attention mask are ``sequence_inputs``'. None where it does not apply: no two rows share a prompt,
    gradient checkpointing is on in training mode (Hugging Face models keep no cache then), or the model's cache cannot
    be gathered by row."""
    if rollout.response_ids.shape[1] == 0 or (getattr(base, "gradient_checkpointing", False) and base.training):
        return None
    key = torch.cat([rollout.prompt_ids, rollout.prompt_mask.to(rollout.prompt_ids.dtype)], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    if len(unique) == len(key):
        return None
    first = torch.empty(len(unique), dtype=torch.long).scatter_(0, inverse, torch.arange(len(key)))  # a row of each prompt
    prompt_ids, prompt_mask = rollout.prompt_ids[first].to(device), rollout.prompt_mask[first].to(device)
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = base(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True)
    cache, inverse = out.past_key_values, inverse.to(device)
    if not hasattr(cache, "reorder_cache"):
        return None
    cache.reorder_cache(inverse)  # each row's copy of its prompt's keys and values (index_select: differentiable)
    attention = torch.cat([rollout.prompt_mask, rollout.response_mask], dim=1).to(device)
    response_positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, rollout.prompt_ids.shape[1] :]
    response = base(
        input_ids=rollout.response_ids.to(device),
        attention_mask=attention,
        position_ids=response_positions,
        past_key_values=cache,
        use_cache=False,
    ).last_hidden_state  # [B, R, D]
    return torch.cat([out.last_hidden_state[inverse, -1:], response[:, :-1]], dim=1)


def response_token_stats(
    model,
    rollout: Rollout,
    *,
    temperature: float,
    chunk_size: int,
    entropy_grad: bool = False,
    vocab_stats: dict | None = None,
    share_prompts: bool = False,
    body_dtype: torch.dtype | None = None,
):
    """``(logp [B,R], entropy [B,R])`` of the response tokens under ``model`` at ``temperature``.

    With ``vocab_stats`` ``{key: (name, params)}`` (what ``Algorithm.vocab_stats()`` asks for) a third
    element ``{key: [B, R]}`` holds those full-distribution statistics (``vocab_stats.py``).

    Log-probs and entropy come from the last hidden states and the output projection in token
    chunks (``token_stats.chunked_token_stats``), only at valid response positions, so no
    ``[B, T, V]`` logits tensor is ever built. ``logp`` carries gradients when grad is enabled.
    ``share_prompts`` (``trainer.share_prompt_forward``): rows with the same prompt run it once
    (``shared_prompt_hidden``; on one process: FSDP's root forward takes whole rows).
    ``body_dtype``: the transformer body under ``torch.autocast`` in that dtype (None: as its parameters);
    its last hidden states are taken to float32 for the head.
    """
    device = next(model.parameters()).device
    base = getattr(model, model.base_model_prefix)
    fsdp_forward = getattr(model, "response_hidden", None)  # FSDP root forward (distributed.py)
    with _autocast(device, body_dtype):
        hidden = shared_prompt_hidden(base, rollout, device) if share_prompts and fsdp_forward is None else None
        if hidden is None:
            inputs = sequence_inputs(rollout, device)
            hidden = fsdp_forward(**inputs) if fsdp_forward is not None else base(**inputs).last_hidden_state  # [B, P+R, D]
            p_len, r_len = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
            hidden = hidden[:, p_len - 1 : p_len + r_len - 1]  # position t predicts token t+1
    if body_dtype is not None:
        hidden = hidden.float()
    mask = rollout.policy_mask.to(device).bool()
    head = model.get_output_embeddings()
    logp_valid, ent_valid = chunked_token_stats(
        hidden[mask],
        head.weight,
        rollout.response_ids.to(device)[mask],
        bias=getattr(head, "bias", None),
        temperature=temperature,
        chunk_size=chunk_size,
        entropy_grad=entropy_grad,
    )
    logp = torch.zeros(mask.shape, dtype=logp_valid.dtype, device=device).masked_scatter(mask, logp_valid)
    entropy = torch.zeros(mask.shape, dtype=ent_valid.dtype, device=device).masked_scatter(mask, ent_valid)
    if not vocab_stats:
        return logp, entropy
    extra = {}
    for key, (name, params) in vocab_stats.items():
        vals = chunked_vocab_stat(
            hidden[mask],
            head.weight,
            name,
            params,
            bias=getattr(head, "bias", None),
            temperature=temperature,
            chunk_size=chunk_size,
        )
        extra[key] = torch.zeros(mask.shape, dtype=vals.dtype, device=device).masked_scatter(mask, vals)
    return logp, entropy, extra


def _autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` on ``device``'s type in ``dtype``; nothing when ``dtype`` is None."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


@torch.no_grad()
def batch_token_stats(model, rollout: Rollout, rows_per_chunk: int, *, vocab_stats: dict | None = None, **kw):
    """``(logp, entropy)`` ``[B, R]`` of ``response_token_stats``, ``rows_per_chunk`` rows at a time,
    without gradient; with ``vocab_stats`` a third element ``{key: [B, R]}`` as there."""
    outs = [
        response_token_stats(
            model, rollout.select(torch.arange(s, min(s + rows_per_chunk, len(rollout.texts)))), vocab_stats=vocab_stats, **kw
        )
        for s in range(0, len(rollout.texts), rows_per_chunk)
    ]
    logp, entropy = torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
    if not vocab_stats:
        return logp, entropy
    return logp, entropy, {key: torch.cat([o[2][key] for o in outs]) for key in vocab_stats}


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else float("nan")
