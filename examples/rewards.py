"""Example reward functions for `entropyrl train reward.functions=[...]` (see examples/README.md).

A reward function takes keyword arguments only and returns one float per response:
``prompts``, ``responses``, ``group`` (responses to one prompt share a group index), ``problems``,
and every field of the problems as a list (``answer``, ``task``, ``id``, and each column of your
data file). Accept ``**fields`` so that new fields never break it.
"""

from __future__ import annotations


def plain_number(responses, **fields):
    """1.0 for a response that is a plain number without leading zeros (a format check)."""
    out = []
    for r in responses:
        text = r.strip()
        out.append(1.0 if text.isdigit() and (text == "0" or not text.startswith("0")) else 0.0)
    return out


def length_penalty(responses, answer, **fields):
    """-0.1 per character beyond the reference answer's length (never positive)."""
    return [-0.1 * max(0, len(r.strip()) - len(str(a))) for r, a in zip(responses, answer)]


def group_diversity(responses, group, **fields):
    """The share of distinct responses in the response's group: rewards groups that keep exploring."""
    by_group: dict[int, list[str]] = {}
    for g, r in zip(group, responses):
        by_group.setdefault(g, []).append(r.strip())
    return [len(set(by_group[g])) / len(by_group[g]) for g in group]
