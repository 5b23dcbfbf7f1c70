"""The per-response text facts of the long-CoT metrics (docs/long-cot.md) and where they are
computed: the candidate-position matcher against a plain ``finditer`` of the same pattern, the
hashed repetition score against exact n-gram sets, ``ResponseFacts`` rows, the token mapping from
the facts' spans (no matching in the trainer) with its fallback for texts the pieces do not rebuild,
the entropy means, and the worker pool beside the reward."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropyrl.evals.reflection import (
    WORD_LISTS,
    ReflectionMatcher,
    ResponseFacts,
    TokenPieces,
    repetition_score,
    response_facts,
    response_text_metrics,
    text_metrics,
)
from entropyrl.rewards import build_reward_runner
from entropyrl.rewards.text_facts import TextFactsPool, TextFactsSpec
from entropyrl.trainers.stats.diagnostics import QUADRANTS, quadrant_ids
from entropyrl.trainers.stats.reflection import reflection_entropy_metrics, reflection_token_masks

DEFAULT = ReflectionMatcher(WORD_LISTS["default"])


# -- references: what the fast paths must reproduce -----------------------------------------------
def finditer_spans(matcher: ReflectionMatcher, text: str) -> list[tuple[int, int]]:
    """The pattern tried at every position (``finditer``), on the lower-cased text, or on the text
    as given, case-insensitively, when lower-casing changes its length."""
    if matcher.regex is None:
        return []
    low = text.lower()
    if len(low) == len(text):
        return [m.span() for m in matcher.regex.finditer(low)]
    return [m.span() for m in re.compile(matcher.regex.pattern, re.IGNORECASE).finditer(text)]


def exact_repetition(text: str, n: int = 4) -> float:
    words = text.lower().split()
    total = len(words) - n + 1
    if total <= 0:
        return 0.0
    return 1.0 - len(set(zip(*(words[i:] for i in range(n))))) / total


TRICKY_WORDS = [
    "wait", "try", "try again", "again", "a", "aa", "check", "recheck", "heck", "re-", "-wait", "wait!",
    "go", "go over the steps", "o", "ab ab", "x_y", "1st", "\u00e9t\u00e9", "stra\u00dfe", "\u0130i", "k", "--",
]  # fmt: skip
FRAGMENTS = TRICKY_WORDS + [
    " ", "  ", "\t", "\n", "\u00a0", "\u2003", ",", ".", "-", "_", "'", "!", "0", "7", "x", "re", "await", "ing",
    "WAIT", "Try", "AGAIN", "ReCheck", "\u0130", "\u212a", "\u03a3", "\u00df", "\ufb01", "\u00c9T\u00c9", "aaa",
]  # fmt: skip
texts_of_fragments = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)
word_lists = st.lists(st.sampled_from(TRICKY_WORDS), min_size=1, max_size=6, unique=True)


# -- the matcher ----------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(words=word_lists, text=texts_of_fragments)
def test_candidate_matching_equals_finditer_on_crafted_texts(words, text):
    matcher = ReflectionMatcher(words)
    assert matcher.spans(text) == finditer_spans(matcher, text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200) | texts_of_fragments)
def test_candidate_matching_equals_finditer_on_any_text(text):
    for name in ("default", "orz", "oat_zero"):
        matcher = ReflectionMatcher(WORD_LISTS[name])
        assert matcher.spans(text) == finditer_spans(matcher, text)
        assert matcher.count(text) == len(finditer_spans(matcher, text))


def test_candidate_matching_by_hand():
    assert ReflectionMatcher(["try", "try again"]).spans("try again, try") == [(0, 9), (11, 14)]  # longer first
    assert DEFAULT.spans("retry. recheck! check again") == [(0, 5), (7, 14), (16, 27)]  # found through "try", "check"
    assert DEFAULT.spans("re-evaluate reevaluation reevaluate") == [(0, 11), (12, 24), (25, 35)]
    assert DEFAULT.spans("await waiting wait_ 2wait wait2 wait") == [(32, 36)]  # "_" and digits are word characters
    hyphen = ReflectionMatcher(["-a-"])
    assert hyphen.spans("-a-a-") == [(0, 3)]  # the overlapping candidate at 2 is inside the first match
    assert ReflectionMatcher(["aa"]).spans("aaa aa") == [(4, 6)]
    odd = "\u0130 Wait, \u0130 try\u00a0 again"  # lower-casing lengthens the text: case-insensitive on the text itself
    assert [odd[a:b] for a, b in DEFAULT.spans(odd)] == ["Wait", "try\u00a0 again"]


# -- the repetition score -------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(st.sampled_from(["a", "b", "c", "A", "\u00e9", "x_y", "1", "WAIT", "wait"]), max_size=60),
    seps=st.lists(st.sampled_from([" ", "  ", "\n", "\t", "\u00a0", "\u2003", "\x1c"]), min_size=1, max_size=5),
    n=st.integers(1, 5),
)
def test_hashed_repetition_equals_exact_ngram_sets(words, seps, n):
    text = "".join(w + seps[i % len(seps)] for i, w in enumerate(words))
    assert repetition_score(text, n) == exact_repetition(text, n)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=300))
def test_hashed_repetition_equals_exact_on_any_text(text):
    assert repetition_score(text) == exact_repetition(text)


# -- the facts of a batch -------------------------------------------------------------------------
TEXTS = ["Wait, no. Wait.", "fine", "Recheck it", "", "a b c d a b c d try again"]


def test_facts_hold_each_response_and_select_rows():
    facts = response_facts(TEXTS, DEFAULT)
    assert facts.chars.tolist() == [len(t) for t in TEXTS]
    assert facts.counts.tolist() == [2, 0, 1, 0, 1]
    assert [facts.row_spans(i) for i in range(len(TEXTS))] == [DEFAULT.spans(t) for t in TEXTS]
    assert facts.repetition.tolist() == [exact_repetition(t) for t in TEXTS]
    picked = facts.select([4, 0, 0, 1])
    assert [picked.row_spans(i) for i in range(4)] == [DEFAULT.spans(TEXTS[i]) for i in (4, 0, 0, 1)]
    assert picked.chars.tolist() == [len(TEXTS[i]) for i in (4, 0, 0, 1)]
    both = ResponseFacts.concat([facts.select([2]), facts.select([0, 4])])
    assert [both.row_spans(i) for i in range(3)] == [DEFAULT.spans(TEXTS[i]) for i in (2, 0, 4)]
    assert len(ResponseFacts.concat([])) == 0 and len(facts.select([])) == 0
    lengths, correct = [10, 20, 10, 1, 30], [1.0, 0.0, 0.0, 1.0, 0.0]
    assert text_metrics(facts, lengths, correct, reflection=True) == response_text_metrics(TEXTS, lengths, correct, DEFAULT)
    off = response_facts(TEXTS, ReflectionMatcher(()))
    assert off.counts.tolist() == [0] * 5 and not any(
        k.startswith("reflection/") for k in text_metrics(off, lengths, correct, False)
    )


# -- tokens: the facts' spans mapped, the joined pieces only where they do not rebuild the text --
class NoMatching(ReflectionMatcher):
    """A matcher the trainer must not use: the spans come from the facts."""

    def spans(self, text):
        raise AssertionError("the trainer matched a text")


def _batch(seed: int, rows: int = 6, width: int = 24):
    """Random responses over a vocabulary of word pieces (some empty, one a multi-space)."""
    table = ["", " wait", "Wait", ",", " try", " again", "  ", "re", "check", " ok", "x", "\n", "go", " over", " the", " steps"]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, len(table), (rows, width), generator=gen)
    lengths = torch.randint(0, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    texts = ["".join(table[i] for i in ids[b, : int(lengths[b])].tolist()) for b in range(rows)]
    return TokenPieces(table.__getitem__), ids, mask, texts


def per_row_token_masks(ids, mask, pieces, matcher):
    """Each row's valid pieces joined in order and matched, the spans' tokens found one row at a
    time among the valid positions; ``before`` only where the token before a word's first token is
    valid and next to it in the response."""
    at, before, first = (torch.zeros(ids.shape, dtype=torch.bool) for _ in range(3))
    for b in range(ids.shape[0]):
        place = mask[b].nonzero().flatten().tolist()
        if not place:
            continue
        row = pieces.pieces(ids[b, place].tolist())
        ends = np.cumsum([len(p) for p in row])
        for start, stop in matcher.spans("".join(row)):
            lo = int(np.searchsorted(ends, start, side="right"))
            hi = min(int(np.searchsorted(ends, stop, side="left")), len(ends) - 1)
            at[b, place[lo : hi + 1]] = True
            first[b, place[lo]] = True
            if lo > 0 and place[lo - 1] == place[lo] - 1:
                before[b, place[lo - 1]] = True
    return at, before, first


@pytest.mark.parametrize("seed", range(8))
def test_token_masks_from_facts_equal_matching_the_pieces(seed):
    pieces, ids, mask, texts = _batch(seed)
    expected = per_row_token_masks(ids, mask, pieces, DEFAULT)
    assert all(torch.equal(a, b) for a, b in zip(reflection_token_masks(ids, mask, pieces, DEFAULT), expected, strict=True))
    got = reflection_token_masks(ids, mask, pieces, NoMatching(WORD_LISTS["default"]), facts=response_facts(texts, DEFAULT))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert expected[0].any()  # the batches hold words


def test_a_mask_with_holes_reads_only_the_text_of_its_valid_tokens():
    pieces, ids, mask, texts = _batch(5)
    holed = mask.clone()
    holed[:, 1::3] = 0  # tokens left out inside the responses (as the policy mask of a tool run)
    expected = per_row_token_masks(ids, holed, pieces, DEFAULT)
    kept = [texts_of(pieces, ids[b][holed[b].bool()]) for b in range(ids.shape[0])]  # the valid tokens' text
    for facts in (None, response_facts(kept, DEFAULT)):
        matcher = DEFAULT if facts is None else NoMatching(WORD_LISTS["default"])
        got = reflection_token_masks(ids, holed, pieces, matcher, facts=facts)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        assert not (got[0] & ~holed.bool()).any() and got[2].any()


@pytest.mark.parametrize("seed", range(6))
def test_random_stretches_left_out_match_the_per_row_reference(seed):
    """Stretches of each response left out at random (as tool outputs are), with and without facts."""
    pieces, ids, mask, texts = _batch(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    holed = mask.clone()
    for b in range(ids.shape[0]):
        start = int(torch.randint(0, ids.shape[1], (1,), generator=gen))
        holed[b, start : start + int(torch.randint(1, 8, (1,), generator=gen))] = 0
    expected = per_row_token_masks(ids, holed, pieces, DEFAULT)
    kept = [texts_of(pieces, ids[b][holed[b].bool()]) for b in range(ids.shape[0])]
    for facts in (None, response_facts(kept, DEFAULT)):
        matcher = DEFAULT if facts is None else NoMatching(WORD_LISTS["default"])  # with facts: their spans alone
        got = reflection_token_masks(ids, holed, pieces, matcher, facts=facts)
        assert all(torch.equal(x, y) for x, y in zip(got, expected, strict=True))


def test_a_word_in_a_tool_output_is_not_the_policys():
    """A tool run: the interpreter's output (policy mask 0) says "Wait" and "however"; the policy
    reflects once, right after that output. Only the policy's word is found, with no token before
    it (the token before it in the response is the tool's)."""
    table = ["x=1", "=M", ":", "Wait", " however", " wait", " so", " 2", ""]
    ids = torch.tensor([[0, 1, 2, 3, 4, 2, 5, 6, 7, 8]])
    policy = torch.tensor([[1, 1, 0, 0, 0, 0, 1, 1, 1, 0]], dtype=torch.float32)  # tokens 2-5: the tool's
    pieces = TokenPieces(table.__getitem__)
    own = "".join(pieces.pieces(ids[0][policy[0].bool()].tolist()))
    assert own == "x=1=M wait so 2"
    for facts in (None, response_facts([own], DEFAULT)):
        at, before, first = reflection_token_masks(ids, policy, pieces, DEFAULT, facts=facts)
        assert at.nonzero().tolist() == [[0, 6]] and first.nonzero().tolist() == [[0, 6]]
        assert not before.any()
    at, before, first = reflection_token_masks(ids, (ids != 8).float(), pieces, DEFAULT)  # the whole response
    assert at.nonzero().tolist() == [[0, 3], [0, 4], [0, 6]]  # what the tool said, read as the policy's


def texts_of(pieces, ids) -> str:
    return "".join(pieces.pieces(ids.tolist()))


def test_a_row_whose_text_is_not_its_pieces_is_matched_on_its_pieces():
    pieces, ids, mask, texts = _batch(3)
    expected = reflection_token_masks(ids, mask, pieces, DEFAULT)
    cleaned = list(texts)
    row = next(b for b, t in enumerate(texts) if DEFAULT.spans(t) and "  " in t)
    cleaned[row] = texts[row].replace("  ", " ")  # a decode that tidied spaces: the spans index another text
    facts = response_facts(cleaned, DEFAULT)
    assert facts.chars[row] != len(texts[row]) and facts.row_spans(row) != DEFAULT.spans(texts[row])
    got = reflection_token_masks(ids, mask, pieces, DEFAULT, facts=facts)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    with pytest.raises(AssertionError, match="matched a text"):  # only that row is matched here
        reflection_token_masks(ids, mask, pieces, NoMatching(WORD_LISTS["default"]), facts=facts)
    with pytest.raises(ValueError, match="facts of 5 responses"):
        reflection_token_masks(ids, mask, pieces, DEFAULT, facts=facts.select(range(5)))


def test_token_masks_by_hand_from_facts():
    table = ["So", " wait", ",", " no", "ok", " fine", ".", "", " wa", "it"]
    ids = torch.tensor([[0, 1, 2, 3, 7], [4, 8, 9, 6, 7], [1, 7, 7, 7, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    texts = ["So wait, no", "ok wait.", " wait"]
    at, before, first = reflection_token_masks(
        ids, mask, TokenPieces(table.__getitem__), NoMatching(WORD_LISTS["default"]), facts=response_facts(texts, DEFAULT)
    )
    assert at.nonzero().tolist() == [[0, 1], [1, 1], [1, 2], [2, 0]]
    assert first.nonzero().tolist() == [[0, 1], [1, 1], [2, 0]]  # " wa" begins the word of row 1
    assert before.nonzero().tolist() == [[0, 0], [1, 0]]  # none for the word that opens row 2


# -- the entropy means ----------------------------------------------------------------------------
def reference_entropy_metrics(entropy, logp, mask, at, before, advantages):
    """The means over boolean masks, computed plainly."""

    def masked_mean(values, where):
        n = int(where.sum())
        return float(torch.where(where, values, 0).sum()) / n if n else float("nan")

    valid = mask.bool()
    at, before = at & valid, before & valid
    out = {
        "reflection/entropy_at": masked_mean(entropy, at),
        "reflection/entropy_before": masked_mean(entropy, before),
        "reflection/entropy_all": masked_mean(entropy, valid),
        "reflection/surprisal_at": masked_mean(-logp, at),
        "reflection/surprisal_before": masked_mean(-logp, before),
        "reflection/surprisal_all": masked_mean(-logp, valid),
        "reflection/token_frac": float(at.sum()) / max(int(valid.sum()), 1),
    }
    adv = advantages.double()
    per_row = (adv * valid).sum(-1) if adv.dim() == 2 else adv
    for name, rows in (("adv_pos", per_row > 0), ("adv_neg", per_row < 0)):
        n = int(rows.sum())
        out[f"reflection/frac/{name}"] = float(at.any(-1)[rows].sum()) / n if n else float("nan")
    token_adv = adv if adv.dim() == 2 else adv[:, None].expand(at.shape)
    quadrant = quadrant_ids(logp[at], entropy[at], token_adv[at], valid[at])
    for k, name in enumerate(QUADRANTS, start=1):
        out[f"reflection/quadrant/{name}"] = float((quadrant == k).sum()) / int(at.sum()) if at.any() else float("nan")
    return out


@pytest.mark.parametrize("seed", range(4))
def test_entropy_means_equal_the_plain_masked_means(seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (7, 33)
    entropy, logp = torch.rand(shape, generator=gen) * 2, -torch.rand(shape, generator=gen) * 3
    mask = (torch.rand(shape, generator=gen) < 0.8).float()
    at, before = torch.rand(shape, generator=gen) < 0.2, torch.rand(shape, generator=gen) < 0.1
    for adv in (torch.randn(7, generator=gen), torch.randn(shape, generator=gen) * mask, torch.zeros(7)):
        got, want = (
            reflection_entropy_metrics(entropy, logp, mask, at, before, adv),
            reference_entropy_metrics(entropy, logp, mask, at, before, adv),
        )
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert (math.isnan(got[key]) and math.isnan(value)) or got[key] == pytest.approx(value, rel=1e-6), key


# -- beside the reward ----------------------------------------------------------------------------
def test_the_pool_finds_the_same_facts_as_this_process():
    texts = TEXTS * 200  # several chunks
    here = response_facts(texts, DEFAULT, 3)
    pool = TextFactsPool(1)
    try:
        there = pool.submit(texts, TextFactsSpec(DEFAULT, 3, 1)).result()
    finally:
        pool.close()
    for field in ("chars", "repetition", "counts", "spans"):
        assert np.array_equal(getattr(there, field), getattr(here, field)), field
    inline = TextFactsPool(0).submit(texts, TextFactsSpec(DEFAULT, 3, 0)).result()
    assert np.array_equal(inline.spans, here.spans)


def test_a_failing_worker_leaves_its_part_to_this_process():
    said = []
    pool = TextFactsPool(2, log=said.append)
    spec = TextFactsSpec(DEFAULT, 4, 2)
    try:
        pool.start()
        pool._procs[1].proc.kill()  # the second half's worker is gone
        pool._procs[1].proc.wait()
        facts = pool.submit(TEXTS * 3, spec).result()
        assert facts.counts.tolist() == [2, 0, 1, 0, 1] * 3 and pool.failures == 1 and pool.restart
        assert said and "ran in this process" in said[0]
        again = pool.submit(TEXTS, spec).result()  # started afresh
        assert again.counts.tolist() == [2, 0, 1, 0, 1] and len(pool._procs) == 2 and pool.failures == 1
    finally:
        pool.close()


def test_a_stop_signal_to_the_process_group_leaves_the_workers_to_the_trainer():
    """Ctrl-C, ``timeout`` or a scheduler signal the whole group; the trainer stops at a step boundary
    and needs its helpers until then."""
    import signal

    said = []
    pool = TextFactsPool(1, log=said.append)
    spec = TextFactsSpec(DEFAULT, 4, 1)
    try:
        assert pool.submit(TEXTS, spec).result().counts.tolist() == [2, 0, 1, 0, 1]  # the worker is serving
        worker = pool._procs[0].proc
        for sig in (signal.SIGTERM, signal.SIGINT):
            worker.send_signal(sig)
        assert pool.submit(TEXTS, spec).result().counts.tolist() == [2, 0, 1, 0, 1]
        assert worker.poll() is None and pool.failures == 0 and not said
    finally:
        pool.close()
    assert worker.poll() == 0  # and it still ends when the pool closes


def test_a_batch_never_collected_does_not_block_the_next(monkeypatch):
    pool = TextFactsPool(1)
    spec = TextFactsSpec(DEFAULT, 4, 1)
    try:
        pool.submit(TEXTS * 400, spec)  # its reward failed: nobody asks for the result
        assert pool.submit(TEXTS, spec).result().counts.tolist() == [2, 0, 1, 0, 1]
    finally:
        pool.close()


def test_the_workers_do_not_run_the_callers_script_again(tmp_path):
    """A script without a main guard: a worker that re-imported ``__main__`` would run it twice."""
    import subprocess
    import sys

    marker = tmp_path / "runs.txt"
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from entropyrl.evals.reflection import WORD_LISTS, ReflectionMatcher\n"
        "from entropyrl.rewards.text_facts import TextFactsPool, TextFactsSpec\n"
        f"open({str(marker)!r}, 'a').write('run\\n')\n"
        "pool = TextFactsPool(1)\n"
        "print(pool.submit(['Wait, recheck'], TextFactsSpec(ReflectionMatcher(WORD_LISTS['default']), 4, 1)).result().counts)\n"
        "print(pool.failures)\n"
        "pool.close()\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[2]", "0"] and marker.read_text() == "run\n"


def test_the_reward_runner_returns_the_facts_with_the_rewards():
    class Source:
        def reward(self, problem, response):
            return 1.0 if "4" in response else 0.0

    runner = build_reward_runner(None, Source())
    try:
        batch = runner.score([None, None], ["p", "p"], ["Wait, 4", "5"], [0, 0], text=TextFactsSpec(DEFAULT, 4, 0))
        assert batch.total == [1.0, 0.0] and batch.facts.counts.tolist() == [1, 0]
        assert runner.score([None], ["p"], ["4"], [0]).facts is None
    finally:
        runner.close()
