"""The schema of ``entropyrl sweep``'s own keys (the ablation and launcher groups declare theirs in their YAML
options; the tracking group's keys are in ``tracking.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..rules import (
    FOLDER,
    NONNEG,
    OPEN_PROB,
    POS,
    STR_LIST,
    Rule,
)
from . import key, section

#: the entropy threshold of an ablation that names none: STARE's published h_tgt (nats)
PUBLISHED_H_TGT = 0.3


@dataclass
class SweepReport:
    """``report``: how the sweep's report reads the runs' entropy."""

    entropy_threshold: float = key(
        f"${{oc.select:ablation.report.entropy_threshold,{PUBLISHED_H_TGT}}}",
        NONNEG,
        (
            '"first step below": the first step whose entropy < this (nats; STARE\'s h_tgt); drawn as `h_tgt` in the '
            "plots. Default: the ablation's own report.entropy_threshold, else 0.3 (STARE's published h_tgt)"
        ),
    )
    tail_frac: float = key(0.1, OPEN_PROB, '"last tenth": mean/min entropy over this final fraction of the steps')


@dataclass
class SweepSchema:
    """The keys ``conf/sweep.yaml`` itself owns (the sweep's folder, seeds, variants, budget, report)."""

    sweep_dir: str = key(
        "outputs/sweeps/${ablation.name}-${now:%Y%m%d-%H%M%S}",
        FOLDER,
        (
            "One folder per sweep: sweep.json (the plan), runs/<variant>/s<seed>/ (each job's output_dir), logs/ "
            "(launcher logs), report.md, comparison.csv, runs.csv, plots/*.png. Pass an existing one to continue it."
        ),
    )
    seeds: list[int] = key([0, 1, 2], Rule("int_list", low=0), "every variant runs once per seed")
    variants: list[str] | None = key(
        None, Rule("str_list", nullable=True), "run only these variants of the ablation, e.g. [gated,off]; null = all"
    )
    budget: list[str] = key(
        [],
        STR_LIST,
        ("training overrides for every job, before the variant's; on the command line: \"budget=['trainer.total_steps=200']\""),
    )
    poll_seconds: float = key(2.0, POS, "how often the sweep looks at its jobs")
    report: SweepReport = section(SweepReport)
