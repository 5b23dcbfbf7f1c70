"""Entropy where reasoning turns: the sampling policy's token entropy and surprisal at the
reflection words of a step's responses, at the token just before each, and over all valid tokens;
and the share of reflecting responses by advantage sign. The words are found in the text
(``evals/reflection.py``); this maps them onto the ``[B, R]`` token grid the step already holds.
Definitions: ``docs/long-cot.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...conf import to_plain
from ...evals.reflection import ReflectionMatcher, TokenPieces, matcher_for, resolve_words, span_tokens
from .diagnostics import QUADRANTS, quadrant_ids

__all__ = ["ReflectionSettings", "reflection_settings", "reflection_token_masks", "reflection_entropy_metrics"]


@dataclass(frozen=True)
class ReflectionSettings:
    """``diagnostics.reflection`` of a training config: the matcher (disabled for an empty word
    list), the n of the repetition score, and whether the words are mapped onto tokens."""

    matcher: ReflectionMatcher
    repetition_n: int = 4
    entropy: bool = True

    @property
    def token_metrics(self) -> bool:
        return self.matcher.enabled and self.entropy


def reflection_settings(cfg) -> ReflectionSettings:
    """The run's ``diagnostics.reflection`` (its defaults where the config has no such section);
    ``UserError`` for a word list that is neither a known name nor a list of words."""
    section = to_plain(cfg.get("diagnostics", {}).get("reflection", None) if hasattr(cfg, "get") else None) or {}
    words = resolve_words(section.get("words", "default"))
    return ReflectionSettings(matcher_for(words), int(section.get("repetition_n", 4) or 4), bool(section.get("entropy", True)))


def reflection_token_masks(
    response_ids: torch.Tensor, mask: torch.Tensor, pieces: TokenPieces, matcher: ReflectionMatcher
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(at [B, R], before [B, R])`` bool: ``at`` the valid tokens overlapping a reflection word,
    ``before`` the valid token just before the first token of each (none for a word that opens the
    response). ``pieces``: token ids -> their text (``evals.reflection.TokenPieces``)."""
    at_rows: list[int] = []
    at_cols: list[int] = []
    before_rows: list[int] = []
    before_cols: list[int] = []
    lengths = mask.sum(-1).long().tolist()
    ids = response_ids.cpu().numpy()
    text_of, length_of = pieces.tables(ids)
    for b in range(ids.shape[0]):
        row = ids[b, : lengths[b]]
        spans = matcher.spans("".join(text_of[row]))
        if not spans:
            continue
        hits, firsts = span_tokens(np.cumsum(length_of[row]), spans)
        at_rows += [b] * len(hits)
        at_cols += hits
        starts = [f - 1 for f in firsts if f > 0]
        before_rows += [b] * len(starts)
        before_cols += starts
    at = torch.zeros(response_ids.shape, dtype=torch.bool)
    before = torch.zeros(response_ids.shape, dtype=torch.bool)
    at[at_rows, at_cols] = True
    before[before_rows, before_cols] = True
    valid = mask.bool().cpu()
    return at & valid, before & valid


def _masked_mean(values: torch.Tensor, where: torch.Tensor) -> float:
    n = int(where.sum())
    return float(torch.where(where, values, 0).sum()) / n if n else float("nan")


def reflection_entropy_metrics(
    entropy: torch.Tensor,
    logp: torch.Tensor,
    mask: torch.Tensor,
    at: torch.Tensor,
    before: torch.Tensor,
    advantages: torch.Tensor | None = None,
) -> dict[str, float]:
    """Means over a step's tokens, all ``[B, R]``:

    ``reflection/entropy_at``, ``/entropy_before``, ``/entropy_all`` (token entropy at reflection
    tokens, at the tokens just before them, at every valid token); ``reflection/surprisal_at``,
    ``/surprisal_before``, ``/surprisal_all`` the same for ``-logp`` of the sampled token;
    ``reflection/token_frac`` the share of valid tokens that are reflection tokens. With
    ``advantages`` (``[B, R]`` or ``[B]``): ``reflection/frac/adv_pos`` and ``/adv_neg``, the share of
    responses holding a reflection word among those with a positive (negative) advantage, and
    ``reflection/quadrant/q1`` .. ``q4``, the share of reflection tokens in each of the four
    quadrants (``diagnostics.quadrant_ids``; a token with a zero advantage is in none). A mean
    over no token is nan."""
    ent, surprisal = entropy.detach(), -logp.detach()  # on their device: scalars come back
    valid = mask.detach().bool()
    at, before = at.to(valid.device) & valid, before.to(valid.device) & valid
    out = {
        "reflection/entropy_at": _masked_mean(ent, at),
        "reflection/entropy_before": _masked_mean(ent, before),
        "reflection/entropy_all": _masked_mean(ent, valid),
        "reflection/surprisal_at": _masked_mean(surprisal, at),
        "reflection/surprisal_before": _masked_mean(surprisal, before),
        "reflection/surprisal_all": _masked_mean(surprisal, valid),
        "reflection/token_frac": float(at.sum()) / max(int(valid.sum()), 1),
    }
    if advantages is not None:
        adv = advantages.detach().double()
        per_row = (adv * valid).sum(-1) if adv.dim() == 2 else adv
        reflects = at.any(-1)
        for name, rows in (("adv_pos", per_row > 0), ("adv_neg", per_row < 0)):
            n = int(rows.sum())
            out[f"reflection/frac/{name}"] = float(reflects[rows].sum()) / n if n else float("nan")
        token_adv = adv if adv.dim() == 2 else adv[:, None].expand(at.shape)
        quadrant = quadrant_ids(logp.detach()[at], ent[at], token_adv[at], valid[at])  # the reflection tokens only
        n_at = int(at.sum())
        for k, name in enumerate(QUADRANTS, start=1):
            out[f"reflection/quadrant/{name}"] = float((quadrant == k).sum()) / n_at if n_at else float("nan")
    return out
