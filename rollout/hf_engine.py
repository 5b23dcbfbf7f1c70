"""The Hugging Face ``generate`` rollout engine (``rollout=hf``, ``eval.backend=hf``): samples from the
live model the trainer updates, so it needs no weight sync; with ``rollout.weights=int8`` or ``bfloat16``
it samples from a lower-precision copy of that model, made again after each weight sync, and reports
the copy's log-probs (``sampler_copy.py``). ``generate_ids`` continues token
sequences by one turn, stopping a row where a caller's test says so (the multi-turn driver,
``multi_turn.py``)."""

from __future__ import annotations

import copy
from typing import Callable

import torch

from ..core.errors import UserError
from .base import Rollout, concat, response_mask_from_eos, stop_token_ids
from .sampler_copy import COPY_WEIGHTS, check_copy_model, sampled_logp, sampler_copy
from .settings import SamplingSettings


class _StopWhen:
    """A ``StoppingCriteria``: row ``i`` is done once ``stop(its new ids)`` holds; records where."""

    def __init__(self, stop: Callable[[list[int]], bool], start: int):
        self.stop, self.start = stop, start
        self.at: dict[int, int] = {}

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for i in range(input_ids.shape[0]):
            if i in self.at:
                done[i] = True
            elif self.stop(input_ids[i, self.start :].tolist()):
                self.at[i] = input_ids.shape[1] - self.start
                done[i] = True
        return done


class _CountTokens:
    """A ``StoppingCriteria`` that stops nothing: after each decoding step it calls ``count(k)`` with
    the ``k`` rows that made a token (rows already ended by a stop id not counted): the tokens/s and
    ETA of a long generation (``progress.tokens``, ``evals.generation.GenerationMeter``)."""

    def __init__(self, count: Callable[[int], None], stop: list[int]):
        self.count, self.stop = count, torch.tensor(sorted(set(stop)) or [-1])
        self.ended: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        last = input_ids[:, -1].cpu()
        ended = self.ended if self.ended is not None else torch.zeros(last.shape[0], dtype=torch.bool)
        self.count(int((~ended).sum()))
        self.ended = ended | torch.isin(last, self.stop)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _shared_prefill(model, ids: torch.Tensor, mask: torch.Tensor, n: int):
    """The KV cache of each prompt's tokens but its last, computed once per prompt and repeated ``n``
    times in place (``[B, T]`` -> a cache of ``B * n`` rows, ``T - 1`` positions): the ``n`` responses of
    a prompt share one prefill instead of recomputing it ``n`` times. Positions follow the attention
    mask, as ``generate`` computes them for left-padded rows, so the cache equals the one ``generate``
    would build for the repeated rows."""
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], use_cache=True, logits_to_keep=1
    )
    cache = out.past_key_values
    if n > 1:
        cache.batch_repeat_interleave(n)
    return cache


def _stack(parts: list[torch.Tensor], pad_id: int, width: int, left: bool) -> torch.Tensor:
    """The ``[rows, w]`` blocks of each ``generate`` call padded to ``width`` (on the left or right
    with ``pad_id``) and stacked: ``concat`` of their rows, a block at a time."""
    pad = lambda t: (width - t.shape[1], 0) if left else (0, width - t.shape[1])  # noqa: E731
    return torch.cat([torch.nn.functional.pad(t, pad(t), value=pad_id) for t in parts])


class HFRollout:
    """Sampling with ``model.generate`` (temperature, top-p, top-k), seeded per call. With
    ``rollout.share_prefill`` (the default) the ``n`` responses of a prompt share one prefill of it.
    ``settings``: a ``SamplingSettings``, or the engine section it is read from."""

    def __init__(self, settings: SamplingSettings, model, tokenizer):
        self.settings = SamplingSettings.from_config(settings)
        self.model = model
        self.tokenizer = tokenizer
        if self.settings.weights not in ("float32", *COPY_WEIGHTS):
            raise UserError(
                f"weights={self.settings.weights} is not allowed (rollout.weights, eval.hf.weights): it must be one of "
                f"float32, {', '.join(COPY_WEIGHTS)}"
            )
        self.copies = self.settings.weights in COPY_WEIGHTS  # a copy samples (sampler_copy.py), not the live model
        self._copy = None  # made at the first generate after a weight sync
        if self.copies:
            check_copy_model(model, self.settings.weights)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token

    @property
    def cfg(self) -> SamplingSettings:
        """The settings under their former name (they read like the section: ``cfg["top_k"]``)."""
        return self.settings

    def sync_weights(self) -> None:
        """Nothing to do when the live model samples; a sampler copy is made again at the next generate."""
        self._copy = None

    def close(self) -> None:
        """Nothing held beyond the model, which belongs to the caller (and the sampler copy, dropped)."""
        self._copy = None

    def _sampler(self, rows: int):
        """The model that samples: the live one, or its ``rollout.weights`` copy (made once per weight
        sync; ``rows``: the rows a call decodes at once, the layout's hint for a packed copy)."""
        if not self.copies:
            return self.model
        if self._copy is None:
            self._copy = sampler_copy(self.model, self.settings.weights, rows=rows)
        return self._copy

    def _generate(self, sampler, config, temperature: float, width: int, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(new ids [rows, R], their sampler log-probs [rows, R] or None)`` of one ``generate`` call;
        the log-probs only from a sampler copy, which is not the trained model."""
        if not self.copies:
            return sampler.generate(generation_config=config, **kwargs)[:, width:].cpu(), None
        config = copy.deepcopy(config)
        config.return_dict_in_generate, config.output_logits = True, True
        out = sampler.generate(generation_config=config, **kwargs)
        new = out.sequences[:, width:].cpu()
        return new, sampled_logp(out.logits, new, temperature)

    @torch.no_grad()
    def generate_ids(
        self,
        sequences: list[list[int]],
        *,
        seed: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        stop: Callable[[list[int]], bool] | None = None,
        stop_strings: list[str] | None = None,
    ) -> list[tuple[list[int], list[float] | None]]:
        """``(new ids, log-probs)`` of each sequence (log-probs None: the trainer's model sampled; else the sampler copy's),
        sampled until EOS (kept), ``stop(new ids)`` or ``max_new_tokens``.
        Rows are left-padded and batched ``batch_size`` at a time; seeded per call as ``generate``.
        ``stop_strings`` is not used: ``stop`` tests each step exactly."""
        from transformers import GenerationConfig, StoppingCriteriaList

        settings, tok, model = self.settings, self.tokenizer, self.model
        batch_size = max(1, settings.batch_size)
        eos = stop_token_ids(model, tok)
        sample = temperature > 0
        config = GenerationConfig(
            max_new_tokens=max(1, int(max_new_tokens)),
            do_sample=sample,
            pad_token_id=tok.pad_token_id,
            eos_token_id=eos,
            **({"temperature": temperature, "top_p": top_p, "top_k": settings.top_k} if sample else {}),
        )
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        sampler = self._sampler(rows=max(1, min(batch_size, len(sequences))))
        out_rows: list[tuple[list[int], list[float] | None]] = []
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(int(seed))
                for start in range(0, len(sequences), batch_size):
                    part = [list(s) for s in sequences[start : start + batch_size]]
                    width = max(len(s) for s in part)
                    ids = concat([torch.tensor(s, dtype=torch.long) for s in part], tok.pad_token_id, width, left=True)
                    mask = concat([torch.ones(len(s), dtype=torch.long) for s in part], 0, width, left=True)
                    criteria = _StopWhen(stop, width) if stop is not None else None
                    new, logp = self._generate(
                        sampler,
                        config,
                        temperature,
                        width,
                        input_ids=ids.to(device),
                        attention_mask=mask.to(device),
                        stopping_criteria=StoppingCriteriaList([criteria]) if criteria else None,
                    )
                    for i in range(len(part)):
                        row = new[i].tolist()
                        cut = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
                        if criteria is not None and i in criteria.at:
                            cut = min(cut, criteria.at[i])
                        out_rows.append((row[:cut], None if logp is None else logp[i, :cut].tolist()))
        finally:
            model.train(was_training)
        return out_rows

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        *,
        n: int,
        seed: int,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Rollout:
        from transformers import GenerationConfig, StoppingCriteriaList

        settings, tok, model = self.settings, self.tokenizer, self.model
        temperature = float(settings.temperature if temperature is None else temperature)
        top_p = float(settings.top_p if top_p is None else top_p)
        max_new_tokens = int(settings.max_new_tokens if max_new_tokens is None else max_new_tokens)
        batch_size = max(1, settings.batch_size)
        special = settings.add_special_tokens
        stop = stop_token_ids(model, tok)
        sample = temperature > 0
        # An explicit config: the model's generation_config.json (repetition penalty, top_k...) stays
        # out of the sampling, as with vLLM's generation_config="vllm".
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            pad_token_id=tok.pad_token_id,
            eos_token_id=stop,
            **({"temperature": temperature, "top_p": top_p, "top_k": settings.top_k} if sample else {}),
        )
        device = next(model.parameters()).device
        was_training, side = model.training, tok.padding_side
        tok.padding_side = "left"
        model.eval()
        n = int(n)
        sampler = self._sampler(rows=max(1, min(batch_size, len(prompts) * n)))
        # share_prefill: whole groups per call (a prompt's n rows together), each prompt prefilled once
        share = settings.share_prefill and n > 1
        per_call = max(1, batch_size // n) if share else batch_size
        units = list(prompts) if share else [p for p in prompts for _ in range(n)]
        chunks = []
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(int(seed))
                for start in range(0, len(units), per_call):
                    part = units[start : start + per_call]
                    enc = tok(part, return_tensors="pt", padding=True, add_special_tokens=special).to(device)
                    count = getattr(progress, "tokens", None)  # a caller that shows tokens/s (evals/progress_display.py)
                    extra = {"stopping_criteria": StoppingCriteriaList([_CountTokens(count, stop)])} if callable(count) else {}
                    if share and enc["input_ids"].shape[1] > 1:
                        extra["past_key_values"] = _shared_prefill(sampler, enc["input_ids"], enc["attention_mask"], n)
                    if share:
                        enc = {k: v.repeat_interleave(n, dim=0) for k, v in enc.items()}
                        part = [p for p in part for _ in range(n)]
                    width = enc["input_ids"].shape[1]
                    new, logp = self._generate(sampler, config, temperature, width, **enc, **extra)
                    chunks.append((enc["input_ids"].cpu(), enc["attention_mask"].cpu(), new, logp))
                    if progress:
                        progress(len(part))
        finally:
            tok.padding_side = side
            model.train(was_training)
        p_width = max(c[0].shape[1] for c in chunks)
        r_width = max(max(c[2].shape[1] for c in chunks), 1)
        prompt_ids = _stack([c[0] for c in chunks], tok.pad_token_id, p_width, left=True)
        prompt_mask = _stack([c[1] for c in chunks], 0, p_width, left=True)
        response_ids = _stack([c[2] for c in chunks], tok.pad_token_id, r_width, left=False)
        response_mask, truncated = response_mask_from_eos(response_ids, stop)
        response_ids = torch.where(response_mask.bool(), response_ids, tok.pad_token_id)
        texts = tok.batch_decode(response_ids, skip_special_tokens=True)
        sampling_logp = None
        if self.copies:
            sampling_logp = _stack([c[3] for c in chunks], 0.0, r_width, left=False) * response_mask
        return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, texts, truncated, sampling_logp=sampling_logp)
