"""The tool study's claim table (``entropyrl lab --experiment tools``): the lab's entropy claims
measured again with a code interpreter in the loop, and how the entropy of each token kind moves.

Pure functions of metric rows (each run's ``metrics.jsonl``), tested on synthetic rows. ``runs``
maps a variant of ``conf/ablation/lab_tools.yaml`` (``grpo``, ``stare``, ``steer``, ``clip_cov``)
to ``{seed: rows}``. ``entropy`` is over the policy's tokens only (tool outputs carry mask 0), so
the collapse and the band are the lab's claims with the same measures (``claims.entropy_ends``:
last tenth against first tenth; STARE's last third against h_tgt), on responses that hold tool
output. ``tool_entropy_by_kind`` is descriptive (it claims no direction): per variant, the first
and last tenth of ``entropy/kind/<kind>`` (``text``, ``code``, ``post_tool``) and of
``entropy/turn/first|later``, so the report says which kind's entropy moved under which method.

``tool_stare_holds_target`` is the lab's STARE claim (``claims.target_hold``): the band alone passed
a run whose entropy never moved (the tool warm start's entropy sits inside the band of h_tgt), so it
also needs entropy to have reached h_tgt from its start and the gate open on at least
``claims.GATE_MIN_OPEN_SHARE`` of the steps, and it shows the gate's open share per seed.
"""

from __future__ import annotations

import math

import numpy as np

from .claim_measures import metric_ends
from .claims import GATE_MIN_OPEN_SHARE, entropy_ends, stare_hold_claim
from .kit import fmt, make_claim, regime_reasons, seeds_with

__all__ = ["tool_claims", "kind_table", "KIND_KEYS", "TURN_KEYS", "COLLAPSE_RATIO", "BAND"]

KIND_KEYS = ("entropy/kind/text", "entropy/kind/code", "entropy/kind/post_tool")
TURN_KEYS = ("entropy/turn/first", "entropy/turn/later")
COLLAPSE_RATIO = 0.5  # the lab's collapse: last tenth below half the first tenth (claims.grpo_collapses)
BAND = 0.3  # the lab's band: STARE's last third within +/-30 % of h_tgt (claims.stare_holds_target)


def kind_table(runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    """Per variant and key (``KIND_KEYS`` + ``TURN_KEYS``): first and last tenth per seed and their
    means over seeds; keys no seed logged are left out."""
    out = []
    for variant, by_seed in runs.items():
        for key in (*KIND_KEYS, *TURN_KEYS):
            ends = {s: metric_ends(rows, key) for s, rows in sorted(by_seed.items())}
            ends = {s: e for s, e in ends.items() if math.isfinite(e[0]) and math.isfinite(e[1])}
            if not ends:
                continue
            first = float(np.mean([e[0] for e in ends.values()]))
            last = float(np.mean([e[1] for e in ends.values()]))
            out.append(
                {
                    "variant": variant,
                    "key": key,
                    "seeds": sorted(ends),
                    "first_tenth": [e[0] for e in ends.values()],
                    "last_tenth": [e[1] for e in ends.values()],
                    "first_mean": first,
                    "last_mean": last,
                    "ratio": last / first if first > 0 else float("nan"),
                }
            )
    return out


def _short(key: str) -> str:
    return key.split("/", 1)[1].replace("kind/", "").replace("turn/", "turn ")


def tool_claims(runs: dict[str, dict[int, list[dict]]], *, h_tgt: float, algo_cfgs: dict | None = None) -> list[dict]:
    """The tool study's claims (see the module docstring): ``tool_grpo_collapses``,
    ``tool_stare_holds_target`` and the descriptive ``tool_entropy_by_kind``."""
    algo_cfgs = algo_cfgs or {}
    claims = []

    per = []
    for s in seeds_with(runs, "grpo"):
        first, last = entropy_ends(runs["grpo"][s])
        ratio = last / first if first > 0 else float("nan")
        per.append({"seed": s, "first_tenth": first, "last_tenth": last, "ratio": ratio, "ok": last < COLLAPSE_RATIO * first})
    claims.append(
        make_claim(
            "tool_grpo_collapses",
            f"GRPO's entropy collapses under tool use: last tenth < {COLLAPSE_RATIO} x first tenth (policy tokens)",
            per,
            "ok",
            ", ".join(f"{fmt(p['first_tenth'])} -> {fmt(p['last_tenth'])} ({fmt(p['ratio'])}x)" for p in per),
            regime_reasons(runs, ("grpo",), algo_cfgs),
        )
    )

    claims.append(
        stare_hold_claim(
            runs,
            h_tgt,
            algo_cfgs,
            "tool_stare_holds_target",
            f"STARE holds its target band with tools: last third within +/-{BAND:.0%} of h_tgt={h_tgt}, entropy "
            f"reached h_tgt from its start and the gate open on at least {GATE_MIN_OPEN_SHARE:.0%} of steps",
            band=BAND,
        )
    )

    table = kind_table(runs)
    by_variant: dict[str, list[str]] = {}
    for t in table:
        by_variant.setdefault(t["variant"], []).append(
            f"{_short(t['key'])} {fmt(t['first_mean'])}->{fmt(t['last_mean'])} ({fmt(t['ratio'])}x)"
        )
    claims.append(
        {
            "id": "tool_entropy_by_kind",
            "claim": "How the entropy of text, code and post-tool tokens (and of first vs later turns) moves under each "
            "method: first tenth -> last tenth, mean over seeds (descriptive, no direction claimed)",
            "measured": "; ".join(f"{v}: " + ", ".join(cells) for v, cells in by_variant.items()),
            "reproduced": None,
            "per_seed": table,
            "descriptive": True,
        }
    )
    return claims
