"""One training step's batch, as one typed object that the loop slices with ``batch[idx]``.

``collect`` fills the responses and their scores; the loop adds the per-token statistics of the
sampling policy, the advantages and the interventions' selections; then the same object is sliced
once per mini-batch and again per micro-batch, every row-aligned field with it::

    batch = StepBatch(responses, rewards, correct, group_ids)                  # collect()
    batch = batch.with_(policy_version=step)                                   # the weights it came from
    batch = batch.with_(mask=..., old_logp=..., entropy=..., advantages=...)   # the step
    mini = batch[order[m:m + mini_rows]]                                       # a mini-batch
    micro = mini[torch.arange(u, u + micro_rows)]                              # a micro-batch
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ...evals.reflection import ResponseFacts
from ...rollout.base import Rollout

__all__ = ["StepBatch"]


def _rows(t: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[idx]


@dataclass
class StepBatch:
    """``B`` responses of one training step and everything computed about them, row-aligned.

    responses:    the sampled responses (``Rollout``: prompt/response tokens, texts, lengths)
    rewards:      [B] shaped rewards (DAPO overlong penalty included when enabled)
    correct:      [B] the verifier's score before shaping
    group_ids:    [B] the prompt each response answers (responses of a prompt form a group)
    mask:         [B, T] 1.0 on response tokens that count (on the training device)
    old_logp:     [B, T] log-probs of the sampled tokens under the sampling policy (no grad)
    entropy:      [B, T] the sampling policy's token entropy (no grad)
    sampler_logp: [B, T] log-probs the rollout engine reported (vLLM), or None
    ref_logp:     [B, T] log-probs under the frozen reference policy (KL), or None
    advantages:   [B, T] token-level advantages (0 on masked tokens)
    selections:   ``{"<intervention>/<what>": [B, T]}`` token selections made on the whole batch
                  or a mini-batch (``Algorithm.select``), read back by their intervention's loss
    facts:        each response's text facts (reflection-word spans, repetition), found beside its
                  reward (``evals.reflection.ResponseFacts``), or None
    behaviour_entropy: the token-mean entropy of the batch under the weights that generated it, as
                  the rollout worker reported it (``trainer.staleness >= 1``; NaN when it reported
                  none), or None without a worker, where the trainer's policy sampled the batch itself
    policy_version: the version of the weights that generated the batch (training steps applied to
                  them): the trainer's step before its update when it sampled the batch itself, the
                  version the rollout worker stamped on it under ``trainer.staleness >= 1``; None
                  when the batch was handed over from elsewhere (a replayed batch)
    """

    responses: Rollout
    rewards: torch.Tensor
    correct: torch.Tensor
    group_ids: torch.Tensor
    mask: torch.Tensor | None = None
    old_logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    selections: dict[str, torch.Tensor] = field(default_factory=dict)
    facts: ResponseFacts | None = None
    behaviour_entropy: float | None = None
    policy_version: int | None = None

    def __len__(self) -> int:
        return len(self.responses.texts)

    def __getitem__(self, idx: torch.Tensor) -> StepBatch:
        """The rows ``idx`` (a 1-D index tensor) of every row-aligned field."""
        if not isinstance(idx, torch.Tensor) or idx.dim() != 1 or idx.dtype == torch.bool:
            raise TypeError("StepBatch[idx] takes a 1-D tensor of row indices")
        return StepBatch(
            responses=self.responses.select(idx),
            rewards=self.rewards[idx],
            correct=self.correct[idx],
            group_ids=self.group_ids[idx],
            mask=_rows(self.mask, idx),
            old_logp=_rows(self.old_logp, idx),
            entropy=_rows(self.entropy, idx),
            sampler_logp=_rows(self.sampler_logp, idx),
            ref_logp=_rows(self.ref_logp, idx),
            advantages=_rows(self.advantages, idx),
            selections={k: v[idx] for k, v in self.selections.items()},
            facts=None if self.facts is None else self.facts.select(idx.cpu().numpy()),
            behaviour_entropy=self.behaviour_entropy,
            policy_version=self.policy_version,
        )

    def with_(self, **changes) -> StepBatch:
        """A copy with ``changes`` (field=value) applied; the tensors are shared, not copied."""
        return dataclasses.replace(self, **changes)

    def narrowed(self, responses: Rollout, width: int) -> StepBatch:
        """The same rows with ``responses`` (the rollout trimmed of columns no row uses) and every
        per-token field cut to its first ``width`` response columns (a token-budget pass)."""
        cut = lambda t: None if t is None else t[:, :width]  # noqa: E731
        return dataclasses.replace(
            self,
            responses=responses,
            mask=cut(self.mask),
            old_logp=cut(self.old_logp),
            entropy=cut(self.entropy),
            sampler_logp=cut(self.sampler_logp),
            ref_logp=cut(self.ref_logp),
            advantages=cut(self.advantages),
            selections={k: v[:, :width] if v.dim() == 2 else v for k, v in self.selections.items()},
        )
