"""Rollout engines: prompts in, ``n`` sampled responses per prompt out, as padded token tensors.

One stack for training and evaluation. An engine follows ``RolloutEngine`` (``generate``,
``sync_weights``, ``close``) and is registered by name: ``rollout=<name>`` picks the training
sampler, ``eval.backend=<name>`` the evaluation one; both build it with
``build_rollout(engine_cfg, model, tokenizer)``, which reads the section once into a
``settings.SamplingSettings`` and hands the engine that.

- ``hf`` (``hf_engine.HFRollout``): Hugging Face ``generate`` on the in-memory model (the policy
  being trained *is* the sampler, so there are no weights to sync), batched, left padding, seeded
  per call in a forked RNG (the caller's RNG state is left as it was); temperature 0 = greedy.
- ``vllm`` (``vllm_engine.VLLMRollout``): a ``vllm.LLM`` engine; registered as a
  ``"module:Class"`` string so vLLM's module is imported only when a run asks for it.

The engine config (``conf/rollout/<name>.yaml`` for training; built from ``eval.*`` for eval)
holds the defaults a call may override: ``temperature``, ``top_p``, ``top_k`` (0 = off),
``max_new_tokens``, ``batch_size`` (sequences per ``generate`` call), ``add_special_tokens``
(false: prompts that went through a chat template, or the built-in tasks' raw prompts). Every key
an engine reads, with its default, is a field of ``SamplingSettings`` (``rollout/settings.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch

from ..core.errors import UserError
from ..core.registry import Registry
from .settings import SamplingSettings

__all__ = [
    "Rollout",
    "ToolTrace",
    "TOKEN_KINDS",
    "RolloutEngine",
    "ROLLOUT_ENGINES",
    "register_rollout",
    "rollout_engine",
    "build_rollout",
    "stop_token_ids",
    "check_prompt_lengths",
    "response_mask_from_eos",
    "concat",
    "cat_rollouts",
]


#: What each response token is (``ToolTrace.kind``): the policy's reasoning text, the code it
#: writes inside a tool call, the tool's output (appended, never sampled: out of every loss and
#: statistic), and the policy's text after a tool result.
TOKEN_KINDS = ("text", "code", "tool", "post_tool")
TOOL_KIND = TOKEN_KINDS.index("tool")


@dataclass
class ToolTrace:
    """What a multi-turn rollout with tools adds to a batch of ``B`` responses of width ``R``.

    kind:         [B, R] index into ``TOKEN_KINDS`` of each response token (0 on padding)
    turn:         [B, R] the generation turn (0, 1, ...) of each token; a tool output carries the
                  turn it answers
    turns:        [B] generation turns of each response
    calls:        [B] tool calls run (malformed calls included: they get an error as output)
    errors:       [B] calls that were malformed, raised, timed out or hit a limit
    seconds:      wall seconds spent running tools for this batch
    gen_seconds:  wall seconds of the whole multi-turn generation (tools included)
    malformed:    [B] calls that were malformed (not run; their error was the output), or None
    repeated:     [B] calls whose code is that of an earlier call of the same response (after
                  stripping the whitespace around it), or None
    void:         [B] void turns: generation turns that ended with neither a closed call nor a
                  final answer (``tools.answer_pattern``), or None
    not_run:      [B] complete calls written after the first of a message and not run
                  (``tools.tool_turn=chat`` runs one call per message, as verl's default
                  ``max_parallel_calls=1``; inline turns stop at the first call's end), or None
    """

    kind: torch.Tensor
    turn: torch.Tensor
    turns: torch.Tensor
    calls: torch.Tensor
    errors: torch.Tensor
    seconds: float = 0.0
    gen_seconds: float = 0.0
    malformed: torch.Tensor | None = None
    repeated: torch.Tensor | None = None
    void: torch.Tensor | None = None
    not_run: torch.Tensor | None = None

    #: the optional per-response counts, which ``select`` and ``cat_rollouts`` carry along
    ROW_COUNTS = ("malformed", "repeated", "void", "not_run")

    def select(self, idx: torch.Tensor) -> ToolTrace:
        pick = {a: None if getattr(self, a) is None else getattr(self, a)[idx] for a in self.ROW_COUNTS}
        return ToolTrace(
            self.kind[idx],
            self.turn[idx],
            self.turns[idx],
            self.calls[idx],
            self.errors[idx],
            self.seconds,
            self.gen_seconds,
            **pick,
        )

    def narrow(self, width: int) -> ToolTrace:
        return ToolTrace(
            self.kind[:, :width],
            self.turn[:, :width],
            self.turns,
            self.calls,
            self.errors,
            self.seconds,
            self.gen_seconds,
            **{a: getattr(self, a) for a in self.ROW_COUNTS},
        )


@dataclass
class Rollout:
    """A batch of ``B = len(prompts) * n`` responses, grouped: rows ``i*n .. i*n+n-1`` answer prompt i.

    prompt_ids:     [B, P] left-padded prompt tokens
    prompt_mask:    [B, P] 1 on real prompt tokens
    response_ids:   [B, R] sampled tokens, right-padded with pad after the first EOS
    response_mask:  [B, R] 1 on tokens that count: up to and including the first EOS
    texts:          decoded responses (special tokens dropped)
    truncated:      [B] bool, True where no EOS came before max_new_tokens
    sampling_logp:  [B, R] log-probs the sampler reported (vLLM), or None (placeholders 0 on tool tokens)
    tools:          the multi-turn trace (token kinds, turns, calls) when tools are on, else None

    ``response_mask`` marks every token of the sequence (the model attends to tool outputs);
    ``policy_mask`` only the tokens the policy sampled: what the loss and every statistic count.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    texts: list[str]
    truncated: torch.Tensor
    sampling_logp: torch.Tensor | None = None
    tools: ToolTrace | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    @property
    def policy_mask(self) -> torch.Tensor:
        """[B, R] 1 on response tokens the policy sampled: ``response_mask`` without tool outputs."""
        if self.tools is None:
            return self.response_mask
        return self.response_mask * (self.tools.kind != TOOL_KIND).to(self.response_mask.dtype)

    def grouped_texts(self, n: int) -> list[list[str]]:
        """``texts`` as one list of ``n`` responses per prompt."""
        return [self.texts[i : i + n] for i in range(0, len(self.texts), n)]

    def select(self, rows: torch.Tensor) -> Rollout:
        idx = rows.nonzero().squeeze(-1) if rows.dtype == torch.bool else rows
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return Rollout(
            pick(self.prompt_ids),
            pick(self.prompt_mask),
            pick(self.response_ids),
            pick(self.response_mask),
            [self.texts[i] for i in idx.tolist()],
            pick(self.truncated),
            pick(self.sampling_logp),
            None if self.tools is None else self.tools.select(idx),
        )


@runtime_checkable
class RolloutEngine(Protocol):
    """What training and evaluation ask of a sampler. Built as ``Engine(engine_cfg, model, tokenizer)``,
    ``engine_cfg`` a ``SamplingSettings`` (``build_rollout`` reads the section into one).

    ``generate``: ``n`` responses for each prompt, sampled with ``seed`` (same seed, same samples);
    ``temperature`` 0 = greedy; ``None`` arguments fall back to the engine config; ``progress(k)``
    is called as ``k`` more responses are done. ``sync_weights``: make the next ``generate`` use
    the model's current weights (a no-op for an engine that samples from the live model).
    ``close``: release processes and files. An engine class may set ``loads_from_path = True`` when
    it can start from the model's folder alone; evaluation then passes ``model=None`` and puts
    the folder in ``engine_cfg.model_path`` instead of loading the model into this process."""

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
    ) -> Rollout: ...

    def sync_weights(self) -> None: ...

    def close(self) -> None: ...


def stop_token_ids(model, tokenizer) -> list[int]:
    """Every end-of-sequence id the model declares (its ``generation_config``) and the tokenizer's:
    a response ends at the first of them."""
    ids: list[int] = []
    for src in (tokenizer, getattr(model, "generation_config", None)):
        eos = getattr(src, "eos_token_id", None)
        for e in eos if isinstance(eos, (list, tuple)) else [eos]:
            if e is not None and int(e) not in ids:
                ids.append(int(e))
    return ids


def check_prompt_lengths(lengths: list[int], context: int, option: str) -> None:
    """One-line ``UserError`` when a prompt leaves no room for a response in the engine's context
    (for vLLM: its ``max_model_len``), instead of the engine's own traceback. ``option``:
    the setting that chose the engine (``rollout`` or ``eval.backend``)."""
    longest = max(range(len(lengths)), key=lengths.__getitem__, default=None)
    if longest is not None and lengths[longest] >= context:
        raise UserError(
            f"prompt {longest} has {lengths[longest]} tokens but the model's context "
            f"(max_model_len) is {context}, leaving no room for a response: use a "
            f"model with a longer context, shorter prompts, or {option}=hf"
        )


def response_mask_from_eos(response_ids: torch.Tensor, eos_id: int | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mask [B,R], truncated [B])``: mask is 1 up to and including the first EOS (any of ``eos_id``)."""
    ids = [eos_id] if isinstance(eos_id, int) else list(eos_id)
    is_eos = torch.isin(response_ids, torch.tensor(ids, dtype=response_ids.dtype))
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
            out[i, width - len(row) :] = row
        else:
            out[i, : len(row)] = row
    return out


def cat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts from several generation rounds (dynamic sampling) into one batch."""
    if len(parts) == 1:
        return parts[0]

    def cat(attr, pad, left):
        tensors = [getattr(p, attr) for p in parts]
        width = max(x.shape[1] for x in tensors)
        return concat([row for x in tensors for row in x], pad, width, left)

    tools = None
    if parts[0].tools is not None:
        width = max(p.response_ids.shape[1] for p in parts)
        field = lambda a: concat([row for p in parts for row in getattr(p.tools, a)], 0, width, left=False)  # noqa: E731
        tools = ToolTrace(
            field("kind"),
            field("turn"),
            *(torch.cat([getattr(p.tools, a) for p in parts]) for a in ("turns", "calls", "errors")),
            sum(p.tools.seconds for p in parts),
            sum(p.tools.gen_seconds for p in parts),
            **{
                a: None if any(getattr(p.tools, a) is None for p in parts) else torch.cat([getattr(p.tools, a) for p in parts])
                for a in ToolTrace.ROW_COUNTS
            },
        )
    return Rollout(
        cat("prompt_ids", pad_id, True),
        cat("prompt_mask", 0, True),
        cat("response_ids", pad_id, False),
        cat("response_mask", 0, False),
        [t for p in parts for t in p.texts],
        torch.cat([p.truncated for p in parts]),
        None if parts[0].sampling_logp is None else cat("sampling_logp", 0, False).float(),
        tools,
    )


# name -> engine class, or "module:Class" for an engine whose module imports a heavy optional
# dependency (vLLM): it is imported only when a run asks for it.
ROLLOUT_ENGINES: Registry = Registry(
    "rollout",
    {
        "hf": "entropyrl.rollout.hf_engine:HFRollout",
        "vllm": "entropyrl.rollout.vllm_engine:VLLMRollout",
    },
)


def register_rollout(name: str, target: Callable | str | None = None):
    """Register a rollout engine under ``name`` (``rollout=<name>``, ``eval.backend=<name>``): as a
    decorator on the class, or directly with a class or a lazy ``"module:Class"`` string."""
    if target is not None:
        ROLLOUT_ENGINES[name] = target
        return target

    def deco(cls):
        ROLLOUT_ENGINES[name] = cls
        return cls

    return deco


def rollout_engine(name: str, option: str = "rollout") -> Callable:
    """The engine class registered as ``name`` (importing its module if it was registered lazily).
    ``option``: the setting that named it, for the error line (``rollout``, ``eval.backend``)."""
    return ROLLOUT_ENGINES.lookup(name, option)


def build_rollout(rollout_cfg, model, tokenizer, option: str = "rollout") -> RolloutEngine:
    """The engine ``rollout_cfg.name`` built on ``model`` / ``tokenizer``. ``rollout_cfg``: the engine
    section (OmegaConf node or dict), read here once into a ``SamplingSettings``, or one already built."""
    settings = SamplingSettings.from_config(rollout_cfg)
    return rollout_engine(settings.name, option)(settings, model, tokenizer)
