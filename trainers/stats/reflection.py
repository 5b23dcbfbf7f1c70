"""Entropy where reasoning turns: the sampling policy's token entropy and surprisal at the first
token of each reflection word of a step's responses (the decision to turn), over all the words'
tokens, at the token just before each word, and over all valid tokens; and the share of
reflecting responses by advantage sign. In a tool run only the policy's own tokens count (the
interpreter's output is not its writing). The words are found in the text
(``evals/reflection.py``); this maps them onto the ``[B, R]`` token grid the step already holds.
Definitions: ``docs/long-cot.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...conf import to_plain
from ...evals.reflection import ReflectionMatcher, ResponseFacts, TokenPieces, matcher_for, resolve_words
from ...rewards.text_facts import TextFactsSpec
from .diagnostics import QUADRANTS, quadrant_ids

__all__ = ["ReflectionSettings", "reflection_settings", "reflection_token_masks", "reflection_entropy_metrics"]


@dataclass(frozen=True)
class ReflectionSettings:
    """``diagnostics.reflection`` of a training config: the matcher (disabled for an empty word
    list), the n of the repetition score, whether the words are mapped onto tokens, and how many
    processes find each response's text facts beside its reward."""

    matcher: ReflectionMatcher
    repetition_n: int = 4
    entropy: bool = True
    workers: int = 1

    @property
    def token_metrics(self) -> bool:
        return self.matcher.enabled and self.entropy

    @property
    def text_facts(self) -> TextFactsSpec:
        """What ``RewardRunner.score`` finds in each response for these settings."""
        return TextFactsSpec(self.matcher, self.repetition_n, self.workers)


def reflection_settings(cfg) -> ReflectionSettings:
    """The run's ``diagnostics.reflection`` (of a composed ``train`` config); ``UserError`` for a
    word list that is neither a known name nor a list of words."""
    section = to_plain(cfg.diagnostics.reflection)
    words = resolve_words(section["words"])
    return ReflectionSettings(
        matcher_for(words),
        int(section["repetition_n"] or 4),
        bool(section["entropy"]),
        int(section["workers"] or 0),
    )


def _span_arrays(facts: ResponseFacts | None, redo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows [S], spans [S, 2])`` of ``facts`` less those of the rows in ``redo``."""
    if facts is None:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.int64)
    rows, spans = facts.span_rows, facts.spans
    if len(redo):
        kept = ~np.isin(rows, redo)
        rows, spans = rows[kept], spans[kept]
    return rows, spans


def reflection_token_masks(
    response_ids: torch.Tensor,
    mask: torch.Tensor,
    pieces: TokenPieces,
    matcher: ReflectionMatcher,
    facts: ResponseFacts | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(at [B, R], before [B, R], first [B, R])`` bool over the valid tokens of ``mask``: ``at``
    every token overlapping a reflection word, ``first`` the first token of each word (where the
    policy decides to turn), ``before`` the token just before that first token (none for a word
    that opens the response or follows a token ``mask`` leaves out, such as a tool output).
    ``pieces``: token ids -> their text (``evals.reflection.TokenPieces``).

    The words are those of the text the valid tokens write, in order: with a mask that has holes
    (``Rollout.policy_mask`` of a tool run, 0 on the interpreter's output) that is the policy's own
    text, and a word in a tool output is no reflection of the policy's.

    ``facts``: the rows' ``ResponseFacts``, whose spans were found in the decoded texts where the
    reward was computed (for a tool run, the policy's own texts): they are mapped onto the tokens as
    they are, with no matching here (one running sum of the tokens' text lengths and one binary
    search for the whole batch). A row whose valid tokens' texts do not add up to the length of the
    text its spans index (a tokenizer's decode that cleaned the text up, a character split over
    several tokens) is matched on its joined pieces instead, as every row is without ``facts``:
    positions never come from another text."""
    ids = response_ids.cpu().numpy()
    rows, width = ids.shape
    if facts is not None and len(facts) != rows:
        raise ValueError(f"reflection_token_masks: facts of {len(facts)} responses for a batch of {rows}")
    valid = mask.detach().cpu().reshape(-1)
    valid = (valid.float() if valid.dtype == torch.bfloat16 else valid).numpy() != 0  # numpy has no bfloat16
    at, before, first = (np.zeros(rows * width, dtype=bool) for _ in range(3))
    order = dest = None  # with holes in the mask: each row's valid tokens moved to its front, in order
    if rows and width:
        lengths = np.count_nonzero(valid.reshape(rows, width), axis=1)
        prefix = (np.arange(width)[None, :] < lengths[:, None]).ravel()
        if not np.array_equal(prefix, valid):  # dest: where each token goes; order: which token lands at each place
            kept = valid.reshape(rows, width)
            dest = np.where(kept, np.cumsum(kept, axis=1) - 1, lengths[:, None] + np.cumsum(~kept, axis=1) - 1)
            order = np.empty_like(dest)
            np.put_along_axis(order, dest, np.broadcast_to(np.arange(width), (rows, width)), axis=1)
            ids, valid = np.take_along_axis(ids, order, axis=1), prefix
        text_of, length_of = pieces.tables(ids)
        ends = np.cumsum(np.take(length_of.astype(np.int32), ids), axis=1, dtype=np.int32)  # where each token's text ends
        chars = np.where(lengths > 0, ends[np.arange(rows), np.maximum(lengths - 1, 0)], 0)
        whole = ends[:, -1].astype(np.int64)  # padding included: rows chained on these stay in order
        base = np.cumsum(whole) - whole  # where row b starts on one rising line over the whole batch
        kind = np.int32 if base[-1] + whole[-1] < 2**31 else np.int64
        flat = ends.astype(kind, copy=False)
        flat += base[:, None].astype(kind)
        flat = flat.ravel()
        redo = np.arange(rows) if facts is None else np.flatnonzero(facts.chars != chars)
        span_rows, spans = _span_arrays(facts, redo)
        found = [(b, a, z) for b in redo.tolist() for a, z in matcher.spans("".join(text_of[ids[b, : lengths[b]]]))]
        if found:
            extra = np.array(found, dtype=np.int64)
            span_rows, spans = np.concatenate([span_rows, extra[:, 0]]), np.concatenate([spans, extra[:, 1:]])
        if len(span_rows):
            row_start = span_rows * width
            lo = np.searchsorted(flat, (base[span_rows] + spans[:, 0]).astype(kind), side="right")  # holds the first character
            hi = np.searchsorted(flat, (base[span_rows] + spans[:, 1]).astype(kind), side="left")  # ... the last one
            hi = np.minimum(hi, row_start + np.maximum(lengths[span_rows] - 1, 0))
            size = hi - lo + 1
            covered = np.repeat(lo - (np.cumsum(size) - size), size) + np.arange(int(size.sum()))
            opening = lo[lo > row_start] - 1  # the token before each word (none for a word that opens its response)
            if order is not None:  # ... and next to it in the response, not across a left-out stretch
                place = order.ravel()
                opening = opening[place[opening] + 1 == place[opening + 1]]
            at[covered[valid[covered]]] = True  # valid tokens only
            before[opening[valid[opening]]] = True
            first[lo[valid[lo]]] = True
    shape = response_ids.shape
    out = []
    for m in (at, before, first):
        if dest is not None:  # back to the tokens' places in the response
            m = np.take_along_axis(m.reshape(rows, width), dest, axis=1)
        out.append(torch.from_numpy(np.ascontiguousarray(m).reshape(-1)).view(shape))
    return out[0], out[1], out[2]


def _valid_positions(where: torch.Tensor, valid_flat: torch.Tensor) -> torch.Tensor:
    """Flat indices, on ``valid_flat``'s device, of the tokens set in ``where`` (few: the reflection
    words' tokens) that ``valid_flat`` keeps; found on the CPU, where ``reflection_token_masks``
    builds them."""
    idx = np.flatnonzero(where.detach().cpu().numpy())
    if valid_flat.device.type == "cpu":
        return torch.from_numpy(idx[valid_flat.numpy()[idx]])
    idx = torch.from_numpy(idx).to(valid_flat.device)
    return idx[valid_flat[idx]]


def reflection_entropy_metrics(
    entropy: torch.Tensor,
    logp: torch.Tensor,
    mask: torch.Tensor,
    at: torch.Tensor,
    before: torch.Tensor,
    advantages: torch.Tensor | None = None,
    first: torch.Tensor | None = None,
) -> dict[str, float]:
    """Means over a step's tokens, all ``[B, R]`` (``at``, ``before``, ``first``: the masks of
    ``reflection_token_masks``):

    ``reflection/entropy_first`` (with ``first``) the token entropy at the first token of each
    reflection word, where the policy decides to turn, averaged over the words; ``/entropy_at``
    the mean over every token of the words (a word of several tokens weighs its continuation
    tokens in, which are nearly determined once the word has begun: it dilutes the decision);
    ``/entropy_before`` at the token just before each word's first token (the context the decision
    is made in, not the decision); ``/entropy_all`` at every valid token.
    ``reflection/surprisal_first``, ``_at``, ``_before``, ``_all`` the same for ``-logp`` of the
    sampled token. ``reflection/token_frac`` the share of valid tokens that are reflection tokens. With
    ``advantages`` (``[B, R]`` or ``[B]``): ``reflection/frac/adv_pos`` and ``/adv_neg``, the share of
    responses holding a reflection word among those with a positive (negative) advantage, and
    ``reflection/quadrant/q1`` .. ``q4``, the share of reflection tokens in each of the four
    quadrants (``diagnostics.quadrant_ids``; a token with a zero advantage is in none). A mean
    over no token is nan."""
    ent, lp = entropy.detach(), logp.detach()  # on their device: scalars come back
    valid = mask.detach().bool()
    valid_flat, ent_flat, lp_flat = valid.flatten(), ent.flatten(), lp.flatten()
    n_valid = int(torch.count_nonzero(valid))
    at_idx, before_idx = _valid_positions(at, valid_flat), _valid_positions(before, valid_flat)
    first_idx = None if first is None else _valid_positions(first, valid_flat)
    nan = float("nan")

    def mean(values: torch.Tensor, idx: torch.Tensor) -> float:
        return float(values[idx].sum()) / len(idx) if len(idx) else nan

    out = {
        "reflection/entropy_at": mean(ent_flat, at_idx),
        "reflection/entropy_before": mean(ent_flat, before_idx),
        "reflection/entropy_all": float(torch.where(valid, ent, 0).sum()) / n_valid if n_valid else nan,
        "reflection/surprisal_at": -mean(lp_flat, at_idx),
        "reflection/surprisal_before": -mean(lp_flat, before_idx),
        "reflection/surprisal_all": -float(torch.where(valid, lp, 0).sum()) / n_valid if n_valid else nan,
        "reflection/token_frac": len(at_idx) / max(n_valid, 1),
    }
    if first_idx is not None:
        out["reflection/entropy_first"] = mean(ent_flat, first_idx)
        out["reflection/surprisal_first"] = -mean(lp_flat, first_idx)
    if advantages is not None:
        adv = advantages.detach()
        per_row = torch.where(valid, adv, 0).sum(-1, dtype=torch.float64) if adv.dim() == 2 else adv.double()
        width = at.shape[-1]
        reflects = torch.zeros(at.shape[0], dtype=torch.bool, device=at_idx.device)
        reflects[at_idx // width] = True
        for name, rows in (("adv_pos", per_row > 0), ("adv_neg", per_row < 0)):
            n = int(rows.sum())
            out[f"reflection/frac/{name}"] = float(reflects[rows].sum()) / n if n else nan
        token_adv = adv.flatten()[at_idx] if adv.dim() == 2 else adv[at_idx // width]
        quadrant = quadrant_ids(lp_flat[at_idx], ent_flat[at_idx], token_adv, torch.ones_like(at_idx, dtype=torch.bool))
        n_at = len(at_idx)
        for k, name in enumerate(QUADRANTS, start=1):
            out[f"reflection/quadrant/{name}"] = float((quadrant == k).sum()) / n_at if n_at else nan
    return out
