"""Rollout engines: prompts in, n sampled responses per prompt out, as padded token tensors.

``hf`` samples with Hugging Face ``generate`` inside the training process (CPU or one GPU): the
policy being trained *is* the sampler, so there are no weights to sync. Engines are registered by
name (``rollout.name``) so a vLLM engine can sit behind the same interface.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from entropyrl.errors import UserError


@dataclass
class Rollout:
    """A batch of ``B = len(prompts) * n`` responses, grouped: rows ``i*n .. i*n+n-1`` answer prompt i.

    prompt_ids:     [B, P] left-padded prompt tokens
    prompt_mask:    [B, P] 1 on real prompt tokens
    response_ids:   [B, R] sampled tokens, right-padded with pad after the first EOS
    response_mask:  [B, R] 1 on tokens that count: up to and including the first EOS
    texts:          decoded responses (special tokens dropped)
    truncated:      [B] bool, True where no EOS came before max_new_tokens
    sampling_logp:  [B, R] log-probs the sampler reported (vLLM), or None
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor
    sampling_logp: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    def select(self, rows: torch.Tensor) -> Rollout:
        idx = rows.nonzero().squeeze(-1) if rows.dtype == torch.bool else rows
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return Rollout(pick(self.prompt_ids), pick(self.prompt_mask), pick(self.response_ids),
                       pick(self.response_mask), [self.texts[i] for i in idx.tolist()],
                       pick(self.truncated), pick(self.sampling_logp))


def response_mask_from_eos(response_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mask [B,R], truncated [B])``: mask is 1 up to and including the first EOS."""
    is_eos = response_ids == eos_id
    # number of EOS strictly before each position: 0 means "still inside the response"
    eos_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()
    mask = (eos_before == 0).long()
    truncated = ~is_eos.any(dim=-1)
    return mask, truncated


def concat(rows: list[torch.Tensor], pad_id: int, width: int, left: bool) -> torch.Tensor:
    """Stack 1-D rows into ``[len(rows), width]``, padding on the left or right with ``pad_id``."""
    out = torch.full((len(rows), width), pad_id, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        if left:
            out[i, width - len(row):] = row
        else:
            out[i, : len(row)] = row
    return out


class HFRollout:
    """Sampling with ``model.generate`` (temperature, top-p, top-k), seeded per call."""

    def __init__(self, rollout_cfg, model, tokenizer):
        self.cfg = rollout_cfg
        self.model = model
        self.tokenizer = tokenizer

    def sync_weights(self) -> None:
        """Nothing to do: generation uses the live training model."""

    @torch.no_grad()
    def generate(self, prompts: list[str], *, n: int, seed: int, temperature: float | None = None,
                 max_new_tokens: int | None = None) -> Rollout:
        cfg, tok, model = self.cfg, self.tokenizer, self.model
        temperature = cfg.temperature if temperature is None else temperature
        max_new_tokens = int(cfg.max_new_tokens if max_new_tokens is None else max_new_tokens)
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        expanded = [p for p in prompts for _ in range(n)]
        chunks = []
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            for start in range(0, len(expanded), int(cfg.batch_size)):
                part = expanded[start: start + int(cfg.batch_size)]
                enc = tok(part, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
                kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
                if temperature and temperature > 0:
                    kwargs.update(do_sample=True, temperature=float(temperature), top_p=float(cfg.top_p),
                                  top_k=int(cfg.top_k) or None)
                else:
                    kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
                out = model.generate(**enc, **kwargs)
                width = enc["input_ids"].shape[1]
                chunks.append((enc["input_ids"].cpu(), enc["attention_mask"].cpu(), out[:, width:].cpu()))
        finally:
            torch.random.set_rng_state(generator_state)
            model.train(was_training)
        p_width = max(c[0].shape[1] for c in chunks)
        r_width = max(max(c[2].shape[1] for c in chunks), 1)
        prompt_ids = concat([r for c in chunks for r in c[0]], tok.pad_token_id, p_width, left=True)
        prompt_mask = concat([r for c in chunks for r in c[1]], 0, p_width, left=True)
        response_ids = concat([r for c in chunks for r in c[2]], tok.pad_token_id, r_width, left=False)
        response_mask, truncated = response_mask_from_eos(response_ids, tok.eos_token_id)
        response_ids = torch.where(response_mask.bool(), response_ids, tok.pad_token_id)
        texts = tok.batch_decode(response_ids, skip_special_tokens=True)
        return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, texts, truncated)


def cat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts from several generation rounds (dynamic sampling) into one batch."""
    if len(parts) == 1:
        return parts[0]
    def cat(attr, pad, left):
        tensors = [getattr(p, attr) for p in parts]
        width = max(x.shape[1] for x in tensors)
        return concat([row for x in tensors for row in x], pad, width, left)

    return Rollout(cat("prompt_ids", pad_id, True), cat("prompt_mask", 0, True),
                   cat("response_ids", pad_id, False), cat("response_mask", 0, False),
                   [t for p in parts for t in p.texts], torch.cat([p.truncated for p in parts]),
                   None if parts[0].sampling_logp is None else cat("sampling_logp", 0, False).float())


# name -> engine class, or "module:Class" for an engine whose module imports a heavy optional
# dependency (vLLM): it is imported only when a run asks for it.
ROLLOUT_ENGINES: dict[str, Callable | str] = {
    "hf": HFRollout,
    "vllm": "entropyrl.trainers.vllm_rollout:VLLMRollout",
}


def register_rollout(name: str, target: Callable | str | None = None):
    """Register a rollout engine under ``name`` (``rollout.name=<name>``): as a decorator on the
    class, or directly with a class or a lazy ``"module:Class"`` string."""
    if target is not None:
        ROLLOUT_ENGINES[name] = target
        return target

    def deco(cls):
        ROLLOUT_ENGINES[name] = cls
        return cls
    return deco


def rollout_engine(name: str) -> Callable:
    """The engine class registered as ``name`` (importing its module if it was registered lazily)."""
    if name not in ROLLOUT_ENGINES:
        raise UserError(f"unknown rollout={name}; valid: {', '.join(sorted(ROLLOUT_ENGINES))}")
    target = ROLLOUT_ENGINES[name]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
        ROLLOUT_ENGINES[name] = target
    return target


def build_rollout(rollout_cfg, model, tokenizer):
    return rollout_engine(rollout_cfg.name)(rollout_cfg, model, tokenizer)
