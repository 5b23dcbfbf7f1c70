"""One training batch: sample prompts, generate responses, score them, and (with dynamic
sampling) keep generating until the batch has enough groups with a learning signal.

``collect_rollouts`` needs only the prompt source, the rollout engine and the algorithm
(``trainers/components.py``), not a trainer: the lab's quadrant experiment calls it too. What it
reads from the run's config is read once at set-up, into ``CollectSettings``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from ..core.seeds import group_seed, rank_seed, rollout_seed
from ..evals.generation import policy_texts
from ..evals.reflection import ResponseFacts, text_metrics
from ..rewards import build_reward_runner, reward_metrics
from ..rollout.base import Rollout, cat_rollouts
from ..rollout.settings import SamplingSettings, ToolSettings
from .algos.step_batch import StepBatch
from .parallel import distributed
from .stats.reflection import ReflectionSettings, reflection_settings
from .stats.tool_stats import policy_lengths, tool_shaping, tool_use_metrics

__all__ = ["CollectSettings", "collect_rollouts", "generate_groups"]


@dataclass(frozen=True)
class CollectSettings:
    """What collecting one batch reads from a ``train`` config, read once where the run is set up
    (its defaults are those of ``SamplingSettings`` and ``ToolSettings``, ``rollout/settings.py``)."""

    prompts_per_step: int  # trainer.prompts_per_step: the step's prompts over every rank
    n: int  # rollout.n: responses per prompt (a group)
    seed: int  # trainer.seed: the step's prompts and sampling seeds derive from it
    seed_scope: str  # rollout.seed_scope: call (one seed per generate call on a rank) | group (one per group)
    call_bonus: float  # tools.shaping.call_bonus: added to a response that ran a call without error
    error_penalty: float  # tools.shaping.error_penalty: subtracted per call that errored
    reflect: ReflectionSettings  # diagnostics.reflection: the text facts found beside each reward

    @classmethod
    def from_config(cls, cfg, reflect: ReflectionSettings | None = None) -> CollectSettings:
        """The settings of a composed ``train`` config (settings already built: returned as they are).
        ``reflect``: ``reflection_settings(cfg)`` when the caller has it already."""
        if isinstance(cfg, cls):
            return cfg
        sampling, tools = SamplingSettings.from_config(cfg.rollout), ToolSettings.from_config(cfg.get("tools"))
        return cls(
            prompts_per_step=int(cfg.trainer.prompts_per_step),
            n=sampling.n,
            seed=int(cfg.trainer.seed),
            seed_scope=sampling.seed_scope,
            call_bonus=tools.shaping.call_bonus,
            error_penalty=tools.shaping.error_penalty,
            reflect=reflect if reflect is not None else reflection_settings(cfg),
        )


def generate_groups(
    settings: CollectSettings, source, rollout, problems: list, n: int, *, seed: int, rank: int, first: int, pad_token_id: int
) -> Rollout:
    """``n`` responses to each of this rank's ``problems`` (``first``: the index of the first one
    among the step's prompts; ``seed``: the step's). ``rollout.seed_scope=group`` samples every group
    alone, seeded by its index in the step, so the responses do not depend on the number of ranks;
    the default ``call`` seeds one generate call per rank."""
    if settings.seed_scope != "group":
        return rollout.generate([source.prompt(p) for p in problems], n=n, seed=rank_seed(seed, rank))
    parts = [rollout.generate([source.prompt(p)], n=n, seed=group_seed(seed, first + i)) for i, p in enumerate(problems)]
    return cat_rollouts(parts, pad_token_id)


# size: one loop of generate, score and filter per attempt, with the bookkeeping each attempt adds to
def collect_rollouts(
    settings: CollectSettings, *, source, rollout, algo, dist, pad_token_id: int, step: int, reward_runner=None
) -> tuple[StepBatch | None, dict]:
    """Generate, score and (with dynamic sampling, as ``algo`` says) filter until the batch is full.

    ``step`` (the training step) seeds the prompts and the sampling; each rank of ``dist`` takes
    its share. Returns ``(batch, metrics)``: a ``StepBatch`` of the responses with their
    ``rewards [B]``, ``correct [B]`` and ``group_ids [B]``, None when nothing was kept.
    ``reward_runner``: the run's ``rewards.RewardRunner`` (None: the source's verifier alone, as
    ``reward.functions: []``). The runner also finds each response's text facts (reflection words,
    repetition: ``diagnostics.reflection``) while the reward runs; the batch carries them
    (``StepBatch.facts``) and the step's text metrics are added up from them. ``settings``: the
    run's ``CollectSettings`` (a composed ``train`` config is read into them here, for callers
    that have no set-up of their own).
    """
    settings = CollectSettings.from_config(settings)
    reflect, n = settings.reflect, settings.n
    text = reflect.text_facts
    if reward_runner is None:  # a runner for this call alone: no worker process to start and leave behind
        reward_runner, text = build_reward_runner(None, source), dataclasses.replace(text, workers=0)
    want = settings.prompts_per_step // dist.world_size  # this rank's share of the prompts
    max_batches = algo.max_num_gen_batches if algo.dynamic_sampling else 1
    kept: list[tuple[Rollout, torch.Tensor, torch.Tensor, torch.Tensor, ResponseFacts]] = []
    n_kept, all_correct, all_rewards, all_len, all_trunc, per_group = 0, [], [], [], [], defaultdict(list)
    own_len = []  # the policy's own tokens of each response (tool outputs left out): the text metrics' lengths
    unique_frac, attempts, scored, with_tools = [], 0, [], []
    for attempt in range(max_batches):
        attempts += 1
        problems = distributed.shard(source.sample(want * dist.world_size, step, attempt), dist)
        prompt_texts = [source.prompt(p) for p in problems]
        roll = generate_groups(
            settings,
            source,
            rollout,
            problems,
            n,
            seed=rollout_seed(settings.seed, step, attempt),
            rank=dist.rank,
            first=dist.rank * len(problems),
            pad_token_id=pad_token_id,
        )
        group_ids = torch.arange(len(problems)).repeat_interleave(n) + attempt * want
        batch = reward_runner.score(
            [problems[i // n] for i in range(len(roll.texts))],
            [prompt_texts[i // n] for i in range(len(roll.texts))],
            roll.texts,
            group_ids.tolist(),
            text=text,
            # in a tool run the text metrics read the policy's own text, never the interpreter's output
            facts_texts=None if roll.tools is None else policy_texts(roll, rollout.tokenizer),
        )
        scored.append(batch)
        correct = torch.tensor(batch.correct, dtype=torch.float32)  # the verifier's verdict: acc/*
        shaped = algo.shape_rewards(torch.tensor(batch.total, dtype=torch.float32), roll.lengths)
        if roll.tools is not None:  # multi-turn with a tool: its use, and the optional shaping term
            with_tools.append(roll)
            shaped = shaped + tool_shaping(roll.tools, settings.call_bonus, settings.error_penalty)
        all_correct.append(correct), all_rewards.append(shaped)
        all_len.append(roll.lengths.float()), all_trunc.append(roll.truncated.float())
        own_len.append(policy_lengths(roll).float())
        for i, p in enumerate(problems):
            per_group[source.group(p)].append(correct[i * n : (i + 1) * n].mean().item())
            unique_frac.append(len(set(roll.texts[i * n : (i + 1) * n])) / n)
        keep = algo.keep_groups(shaped, group_ids)
        if keep.any():
            facts = batch.facts.select(keep.nonzero()[:, 0].cpu().numpy())
            kept.append((roll.select(keep), shaped[keep], correct[keep], group_ids[keep], facts))
            n_kept += int(keep.sum()) // n
        if int(distributed.min_across(n_kept, dist)) >= want:  # every rank has its share
            break
    metrics = {
        "reward/mean": torch.cat(all_rewards).mean().item(),
        "acc/mean": torch.cat(all_correct).mean().item(),
        "response_length/mean": torch.cat(all_len).mean().item(),
        "response_length/clip_frac": torch.cat(all_trunc).mean().item(),
        "diversity/unique_frac": float(np.mean(unique_frac)),
        "dynamic_sampling/gen_batches": float(attempts),
        **{f"acc/{g}": float(np.mean(v)) for g, v in per_group.items()},
        **reward_metrics(scored),  # reward/<name>/mean, reward/<name>/fallback/<reason>
    }
    # long chain-of-thought text metrics of every generated response (diagnostics.reflection), on
    # the policy's own text and tokens (in a tool run, without the interpreter's outputs)
    generated = ResponseFacts.concat([b.facts for b in scored])
    metrics.update(
        text_metrics(generated, torch.cat(own_len).long().tolist(), torch.cat(all_correct).tolist(), reflect.matcher.enabled)
    )
    if with_tools:  # tools/turns/mean, tools/calls/mean, tools/error_frac, tokens/kind/<kind>
        every = cat_rollouts(with_tools, pad_token_id)
        metrics.update(tool_use_metrics(every.tools, every.response_mask))
    # Same number of rows on every rank (whole groups): FSDP needs matching forward passes.
    rows = int(distributed.min_across(min(want * n, sum(len(k[0].texts) for k in kept)), dist))
    if rows == 0:
        return None, metrics
    roll = cat_rollouts([k[0] for k in kept], pad_token_id)
    rewards, correct, group_ids = (torch.cat([k[i] for k in kept]) for i in (1, 2, 3))
    facts = ResponseFacts.concat([k[4] for k in kept])
    metrics["dynamic_sampling/kept_frac"] = n_kept / (attempts * want)
    return StepBatch(roll, rewards, correct, group_ids, facts=facts)[torch.arange(rows)], metrics
