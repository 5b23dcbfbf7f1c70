"""A study's finished sweep as its report step reads it: the runs' metric rows and saved configs, and the
two settings every study's claims read from them (STARE's ``h_tgt`` and the name of the pass@k metric).

``read_study_runs(sweep, statuses, stare_preset=..., base_preset=...)`` is the first line of every report
step: it reads the folder's finished jobs (``collect_lab_runs``: each training run's ``metrics.jsonl``
rows and saved ``config.yaml`` under ``runs/<variant>/s<seed>/``, each quadrant job's
``quadrants.json``) and takes the settings from a finished run's saved config, so a report says what
its runs ran. A sweep with no finished STARE run (or none at all) takes them from the study's presets
composed with the sweep's overrides for every job, which is what its runs would have been given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ...conf import compose
from ...core.errors import UserError
from ..aggregate import load_rows
from ..jobs import TRAIN_KIND, job_kind
from ..run_records import read_saved_config
from ..state import DONE
from .quadrant_probe import RESULT_FILE

__all__ = ["StudyRuns", "collect_lab_runs", "read_study_runs"]


@dataclass(frozen=True)
class StudyRuns:
    """What a report step computes its claims, tables and figures from."""

    sweep: dict  # the sweep's state (sweeps/state.py): its ablation, jobs, command and overrides
    statuses: list  # every job's status (sweeps/jobs.read_job_state), finished or not
    runs: dict  # {variant: {seed: metrics.jsonl rows}} of the finished training jobs
    quadrants: dict  # {seed: quadrants.json} of the finished quadrant jobs (the lab's sign experiment)
    configs: dict  # {variant: the saved config of its first finished seed}
    algo_cfgs: dict  # {variant: that config's algo section}
    every_job: list  # the sweep's overrides for every job (``train_overrides``)
    h_tgt: float  # STARE's target entropy as its runs ran it
    pass_key: str  # ``val/pass_at_<k>``, the pass@k metric's name in metrics.jsonl (core/tracking.py)


def collect_lab_runs(sweep: dict, statuses: list) -> tuple[dict, dict, dict]:
    """``(runs, quadrants, configs)`` of the sweep's finished jobs: ``{variant: {seed: rows}}``,
    ``{seed: {"q1": [...], ...}}`` and ``{variant: saved training config of its first seed whose config
    reads}`` (None when none does)."""
    kinds = {r["key"]: job_kind(r) for r in sweep.get("jobs", [])}
    runs: dict[str, dict[int, list[dict]]] = {}
    quadrants: dict[int, dict] = {}
    configs: dict[str, dict] = {}
    for st in statuses:
        if st.state != DONE:
            continue
        out = Path(st.output_dir)
        if kinds.get(st.key, TRAIN_KIND) == TRAIN_KIND:
            rows = load_rows(out)
            if rows:
                runs.setdefault(st.variant, {})[st.seed] = rows
                if configs.get(st.variant) is None:  # a seed whose config cannot be read gives none (the sweep report says it)
                    configs[st.variant] = read_saved_config(out)[0]
        elif (out / RESULT_FILE).exists():
            quadrants[st.seed] = _read_quadrants(out / RESULT_FILE, st.key)
    return runs, quadrants, configs


def _read_quadrants(path: Path, key: str) -> dict:
    """A finished quadrant job's result; one error line when it is not whole JSON or not an object (a
    claim over the seeds must not quietly lose one)."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        result, why = None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else '-'}"
    else:
        why = None if isinstance(result, dict) else "not a JSON object"
    if why:
        raise UserError(
            f"{path} (job {key}'s quadrant result) cannot be read ({why}): delete {path.parent} and resume the "
            "study (`entropyrl lab --experiment <study> --resume`, or `entropyrl sweep ... --resume`) to measure it again"
        )
    return result


def read_study_runs(
    sweep: dict,
    statuses: list,
    *,
    stare_preset: Sequence[str],
    base_preset: Sequence[str],
    is_stare: Callable[[str], bool] = lambda variant: variant == "stare",
) -> StudyRuns:
    """The sweep's finished runs and settings. ``h_tgt`` comes from the first finished run whose variant
    ``is_stare`` and whose config has one, else from ``stare_preset`` (the overrides of the study's STARE
    variant) composed with the sweep's overrides; ``pass_key`` from the first finished run's config with
    ``val.pass_k``, else from ``base_preset`` composed the same way."""
    runs, quadrants, configs = collect_lab_runs(sweep, statuses)
    every_job = list(sweep.get("train_overrides") or [])
    h_tgt = next(
        (
            float(h)
            for v, cfg in configs.items()
            if is_stare(v) and (h := (((cfg or {}).get("algo") or {}).get("stare") or {}).get("h_tgt")) is not None
        ),
        None,
    )
    if h_tgt is None:
        h_tgt = float(compose("train", [*stare_preset, *every_job]).algo.stare.h_tgt)
    pass_k = next((k for cfg in configs.values() if (k := ((cfg or {}).get("val") or {}).get("pass_k")) is not None), None)
    if pass_k is None:
        pass_k = compose("train", [*base_preset, *every_job]).val.pass_k
    return StudyRuns(
        sweep=sweep,
        statuses=statuses,
        runs=runs,
        quadrants=quadrants,
        configs=configs,
        algo_cfgs={v: (c or {}).get("algo", {}) for v, c in configs.items()},
        every_job=every_job,
        h_tgt=h_tgt,
        pass_key=f"val/pass_at_{int(pass_k)}",
    )
