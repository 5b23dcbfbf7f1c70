"""Score a training batch with the configured reward functions (``reward.*`` of the train config).

``reward.functions`` lists entries ``{fn: <ref>, weight: w, name: <metric name>}`` (``refs.py``
for references) or ``{url: http://..., weight: w}``; ``reward.url`` adds one HTTP entry (weight 1).
The total reward of a response is ``sum_i w_i * r_i``. With no entries the run's own verifier
(the data source's grader) is the reward, as before this existed.

Accuracy (``acc/*``) stays the built-in verifier's verdict: the values of the first ``builtin:``
entry, else the data source's own grader (one extra grading pass for math data).

Per step and entry: ``reward/<name>/mean`` (the raw component, before its weight) and
``reward/<name>/fallback/<reason>`` (responses given ``reward.fallback``: ``exception``,
``timeout``, ``non_finite``, ``http_error``); their totals go into ``summary.json``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

from ..conf import to_plain
from ..core.errors import UserError
from ..evals.reflection import ResponseFacts
from .builtin import BUILTIN_REWARDS
from .calls import Outcome, WorkerPool, call_in_child, run_call
from .http import check_reachable, post_rewards
from .refs import builtin_name, resolve_user
from .text_facts import TextFactsPool, TextFactsSpec

#: Keywords every reward function receives besides the problem fields (which never shadow them).
RESERVED = ("prompts", "responses", "group", "problems", "source")
FALLBACK_REASONS = ("exception", "timeout", "non_finite", "http_error")


@dataclass
class RewardEntry:
    name: str
    weight: float
    kind: str  # builtin | user | http
    ref: str  # builtin name, user reference, or URL
    timeout: float | None
    workers: int
    fallback: float
    fn: Callable | None = None
    pool: WorkerPool | None = None


@dataclass
class ScoredBatch:
    """One scored batch: ``total`` (the reward), ``correct`` (the verifier's verdict), per entry its
    values and ``{reason: responses}`` given the fallback, and ``facts`` (each response's text
    facts, ``evals.reflection.ResponseFacts``) when ``score`` was asked for them."""

    total: list[float]
    correct: list[float]
    components: dict[str, list[float]] = field(default_factory=dict)
    fallbacks: dict[str, dict[str, int]] = field(default_factory=dict)
    facts: ResponseFacts | None = None


#: The problem's own fields: ``answer`` is the gold the verifier grades against.
OWN_FIELDS = ("answer", "task", "id")


def problem_fields(problems: Sequence) -> dict[str, list]:
    """Every field of the problems as a list per field: ``answer`` (the gold the verifier grades
    against, not a raw column), ``task``, ``id``, and each column of the data row (``Problem.fields``;
    code problems' ``extra``) untouched; a column whose name is one of those or a reserved keyword
    (GSM8K's ``answer`` column holds the whole solution) comes as ``row_<name>``. None where absent."""
    rows = []
    for p in problems:
        columns = getattr(p, "fields", None) or getattr(p, "extra", None) or {}
        row = {(f"row_{k}" if k in OWN_FIELDS or k in RESERVED else k): v for k, v in columns.items()}
        row.update({k: getattr(p, k) for k in OWN_FIELDS if hasattr(p, k)})
        rows.append(row)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: [r.get(k) for r in rows] for k in keys}


def _number(entry: dict, key: str, default, where: str, cast=float):
    value = entry.get(key, default)
    if value is None:
        return None
    try:
        out = cast(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {key}={value!r} is not a number") from None
    if isinstance(out, float) and not math.isfinite(out):
        raise UserError(f"{where}: {key}={value!r} must be finite")
    return out


class RewardRunner:
    """The reward of a run: built from ``reward_cfg`` and the run's prompt source."""

    def __init__(self, reward_cfg, source, log=print):
        cfg = to_plain(reward_cfg) if reward_cfg is not None else {}
        cfg = cfg or {}
        self.source, self.log = source, log
        self.timeout = _number(cfg, "timeout_s", 60.0, "reward")
        self.workers = _number(cfg, "workers", 0, "reward", int)
        self.fallback = _number(cfg, "fallback", 0.0, "reward")
        self.retries = _number(cfg, "retries", 2, "reward", int)
        self.backoff = _number(cfg, "backoff_s", 0.5, "reward")
        raw = list(cfg.get("functions") or [])
        if cfg.get("url"):
            raw.append({"url": cfg["url"], "weight": 1.0})
        self.entries = [self._entry(i, e) for i, e in enumerate(raw)]
        self.text_pool: TextFactsPool | None = None  # the responses' text facts, beside the reward
        for i, e in enumerate(self.entries):  # a metric name part: reward/<name>/mean
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", e.name):
                raise UserError(
                    f"reward.functions[{i}]: name {e.name!r} is not usable in metric names: "
                    f"use letters, digits, _ . - (name: ...)"
                )
        names = Counter(e.name for e in self.entries)
        dup = next((n for n, c in names.items() if c > 1), None)
        if dup:
            raise UserError(f"reward.functions: two entries are named {dup!r}: give one a name: ...")
        for e in self.entries:
            if e.kind == "http":  # a judge that is down: say so before training
                check_reachable(e.ref)

    def _entry(self, i: int, raw) -> RewardEntry:
        where = f"reward.functions[{i}]"
        if isinstance(raw, str):
            raw = {"fn": raw}
        if not isinstance(raw, dict) or bool(raw.get("fn")) == bool(raw.get("url")):
            raise UserError(
                f"{where}: give either fn: <pkg.module:fn | path/to/file.py:fn | builtin:math> "
                f"or url: http://..., with weight: (got {raw!r})"
            )
        unknown = sorted(set(raw) - {"fn", "url", "weight", "name", "timeout_s", "workers", "fallback"})
        if unknown:
            raise UserError(f"{where}: unknown key {unknown[0]!r}; valid: fn, url, weight, name, timeout_s, workers, fallback")
        common = dict(
            weight=_number(raw, "weight", 1.0, where),
            timeout=_number(raw, "timeout_s", self.timeout, where),
            workers=_number(raw, "workers", self.workers, where, int),
            fallback=_number(raw, "fallback", self.fallback, where),
        )
        if common["weight"] is None or common["fallback"] is None:
            raise UserError(f"{where}: weight and fallback must be numbers")
        if common["timeout"] is not None and common["timeout"] <= 0 or (common["workers"] or 0) < 0:
            raise UserError(f"{where}: timeout_s must be > 0 (or null) and workers >= 0")
        common["workers"] = common["workers"] or 0
        if raw.get("url"):
            return RewardEntry(str(raw.get("name") or "http"), kind="http", ref=str(raw["url"]), **common)
        ref = str(raw["fn"])
        builtin = builtin_name(ref)
        if builtin is not None:
            return RewardEntry(
                str(raw.get("name") or builtin), kind="builtin", ref=builtin, fn=BUILTIN_REWARDS[builtin], **common
            )
        fn = resolve_user(ref)  # fail now on a reference that does not load, not at step 1
        entry = RewardEntry(
            str(raw.get("name") or getattr(fn, "__name__", ref.rpartition(":")[2])), kind="user", ref=ref, fn=fn, **common
        )
        if entry.workers:
            entry.pool = WorkerPool(ref, entry.workers)
        return entry

    def bind(self, source) -> None:
        """The run's prompt source (its verifier, grading settings, code sandbox), once it exists."""
        self.source = source

    # -- scoring ------------------------------------------------------------------------------
    def _verifier(self, problems: Sequence, responses: Sequence[str]) -> list[float]:
        batch = getattr(self.source, "rewards", None)  # sources that grade a batch at once
        if batch is not None:
            return [float(v) for v in batch(list(problems), list(responses))]
        return [float(self.source.reward(p, r)) for p, r in zip(problems, responses)]

    def _run(self, e: RewardEntry, kwargs: dict, n: int) -> Outcome:
        label = f"reward function {e.ref}" if e.kind != "http" else f"reward.url {e.ref}"
        if e.kind == "builtin":  # trusted, with its own limits (grader pool, sandbox)
            return run_call(label, lambda: e.fn(source=self.source, log=self.log, **kwargs), n, e.fallback)
        if e.kind == "http":
            payload = {k: v for k, v in kwargs.items() if k != "problems"}
            call = partial(post_rewards, e.ref, payload, timeout=e.timeout, retries=self.retries, backoff=self.backoff)
        elif e.pool is not None:
            plain = {k: v for k, v in kwargs.items() if k != "problems"}  # problem objects stay here
            call = partial(e.pool.call, plain, n, e.timeout, label)
        else:
            call = partial(call_in_child, e.fn, kwargs, e.timeout)  # killed at the deadline
        out = run_call(label, call, n, e.fallback)
        for reason, count in out.fallbacks.items():
            self.log(
                f"warning: reward {e.name}: {count} of {n} responses got the fallback {e.fallback:g} ({reason}: {out.detail})"
            )
        return out

    def start_text_facts(self, spec: TextFactsSpec) -> TextFactsPool:
        """The pool that finds ``spec``'s text facts, its processes started (once)."""
        if self.text_pool is None or self.text_pool.workers != spec.workers:
            if self.text_pool is not None:
                self.text_pool.close()
            self.text_pool = TextFactsPool(spec.workers, log=self.log)
        self.text_pool.start()
        return self.text_pool

    def score(
        self,
        problems: Sequence,
        prompts: Sequence[str],
        responses: Sequence[str],
        group: Sequence[int],
        text: TextFactsSpec | None = None,
        facts_texts: Sequence[str] | None = None,
    ) -> ScoredBatch:
        """Rewards of ``responses`` (one per response; ``problems[i]`` / ``prompts[i]`` its problem).
        With ``text``, also each response's text facts (``ScoredBatch.facts``), found in the text
        pool's processes while the reward runs, in ``facts_texts`` (one per response: in a tool run
        the policy's own text, without the tool's outputs) or else in ``responses``."""
        if facts_texts is not None and len(facts_texts) != len(responses):
            raise ValueError(f"score: {len(facts_texts)} texts for the facts of {len(responses)} responses")
        read = responses if facts_texts is None else facts_texts
        pending = self.start_text_facts(text).submit(read, text) if text is not None else None
        try:
            batch = self._score(problems, prompts, responses, group)
        finally:  # collected even when the reward fails: the workers' answers must not stay in their sockets
            facts = pending.result() if pending is not None else None
        batch.facts = facts
        return batch

    def _score(self, problems: Sequence, prompts: Sequence[str], responses: Sequence[str], group: Sequence[int]) -> ScoredBatch:
        n = len(responses)
        if not self.entries:
            verdict = self._verifier(problems, responses)
            return ScoredBatch(list(verdict), list(verdict))
        kwargs = {
            "prompts": list(prompts),
            "responses": list(responses),
            "group": [int(g) for g in group],
            "problems": list(problems),
            **problem_fields(problems),
        }
        total = [0.0] * n
        correct = None
        batch = ScoredBatch(total, [])
        for e in self.entries:
            out = self._run(e, kwargs, n)
            batch.components[e.name] = out.values
            batch.fallbacks[e.name] = out.fallbacks
            for i, v in enumerate(out.values):
                total[i] += e.weight * v
            if correct is None and e.kind == "builtin":
                correct = out.values
        batch.correct = list(correct) if correct is not None else self._verifier(problems, responses)
        return batch

    def close(self) -> None:
        for e in self.entries:
            if e.pool is not None:
                e.pool.kill()
        if self.text_pool is not None:
            self.text_pool.close()
            self.text_pool = None


def reward_metrics(batches: Sequence[ScoredBatch]) -> dict[str, float]:
    """``reward/<name>/mean`` over every response of ``batches`` and ``reward/<name>/fallback/<reason>``
    (responses given the fallback, summed)."""
    out: dict[str, float] = {}
    names = dict.fromkeys(n for b in batches for n in b.components)
    for name in names:
        values = [v for b in batches for v in b.components.get(name, [])]
        out[f"reward/{name}/mean"] = float(sum(values) / len(values)) if values else float("nan")
        counts: Counter = Counter()
        for b in batches:
            counts.update(b.fallbacks.get(name, {}))
        for reason in FALLBACK_REASONS:
            out[f"reward/{name}/fallback/{reason}"] = float(counts.get(reason, 0))
    return out


def build_reward_runner(reward_cfg, source, log=print) -> RewardRunner:
    return RewardRunner(reward_cfg, source, log=log)
