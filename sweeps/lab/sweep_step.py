"""The lab's report step over a sweep of the ``lab`` ablation (``ablation.report_step: lab``).

After the sweep's own report, it reads the folder's finished jobs: the training runs'
``metrics.jsonl`` rows and saved ``config.yaml`` (``runs/<variant>/s<seed>/``) and the quadrant
experiment's ``quadrants.json`` (``runs/quadrants/s<seed>/``), computes the claim table
(``claims.compute_claims``) and writes ``lab.json``, ``report.md`` and the figures
(``report.write_lab_outputs``) into the sweep folder. ``entropyrl report DIR`` runs it again from
the files alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from ...conf import compose, to_plain
from ..aggregate import load_rows
from ..jobs import TRAIN_KIND, job_kind, read_job_state
from ..state import DONE, FAILED
from .claims import compute_claims
from .explain import explain_claims
from .method_claims import method_claims
from .null_controls import declare_nulls
from .quadrant_probe import RESULT_FILE
from .report import write_lab_outputs

__all__ = ["lab_report_step", "collect_lab_runs"]


def _saved_config(output_dir: Path) -> dict:
    try:
        return to_plain(OmegaConf.load(Path(output_dir) / "config.yaml"))
    except Exception:  # noqa: BLE001 - a run without a readable config gives no settings
        return {}


def collect_lab_runs(sweep: dict, statuses: list) -> tuple[dict, dict, dict]:
    """``(runs, quadrants, configs)`` of the sweep's finished jobs: ``{variant: {seed: rows}}``,
    ``{seed: {"q1": [...], ...}}`` and ``{variant: saved training config of its first seed}``."""
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
                configs.setdefault(st.variant, _saved_config(out))
        elif (out / RESULT_FILE).exists():
            quadrants[st.seed] = json.loads((out / RESULT_FILE).read_text())
    return runs, quadrants, configs


def _job_times(statuses: list) -> tuple[float, float]:
    """``(wall, job)`` seconds from the jobs' ``job.json``: wall from the first job's start to the last
    one's end (a sweep resumed later includes the time between its sessions), job the finished jobs'
    own start-to-end times summed (the work itself; jobs that ran side by side overlap)."""
    states = [read_job_state(Path(st.output_dir)) for st in statuses]
    starts = [s["started"] for s in states if s.get("started")]
    ends = [s["ended"] for s in states if s.get("ended")]
    wall = max(ends) - min(starts) if starts and ends else 0.0
    job = float(sum(s["ended"] - s["started"] for s in states if s.get("started") and s.get("ended")))
    return wall, job


def lab_report_step(sweep_dir: Path, sweep: dict, statuses: list, log: Callable[[str], None] = print) -> dict:
    """The lab's claims, ``lab.json``, ``report.md`` and figures in ``sweep_dir``; returns
    ``{"paths": {name: path}, "metrics": {"claims/<id>": 1.0 | 0.0}}``."""
    runs, quadrants, configs = collect_lab_runs(sweep, statuses)
    every_job = list(sweep.get("train_overrides") or [])
    algo_cfgs = {v: c.get("algo", {}) for v, c in configs.items()}
    stare = configs.get("stare") or to_plain(compose("train", ["experiment=lab_stare", *every_job]))
    h_tgt = float(stare["algo"]["stare"]["h_tgt"])
    any_cfg = next(iter(configs.values()), None) or to_plain(compose("train", ["experiment=lab_grpo", *every_job]))
    pass_key = f"val/pass_at_{int(any_cfg['val']['pass_k'])}"  # metrics.jsonl's name (core/tracking.py)
    claims = compute_claims(runs, h_tgt=h_tgt, algo_cfgs=algo_cfgs, quadrants=quadrants or None, pass_key=pass_key)
    claims += method_claims(runs, algo_cfgs)  # the newer methods, where their runs are present
    claims = explain_claims(claims, runs)  # why entropy moved, from the runs' attribution
    claims = declare_nulls(claims)  # each claim's null control, in words (null_controls.py)
    failed = [st.key for st in statuses if st.state == FAILED]
    command = sweep.get("command") or " ".join(
        ["entropyrl sweep", f"ablation={sweep.get('ablation', {}).get('name')}", *every_job]
    )
    wall_seconds, job_seconds = _job_times(statuses)
    paths = write_lab_outputs(
        Path(sweep_dir),
        runs,
        claims,
        algo_cfgs=algo_cfgs,
        quadrants=quadrants,
        pass_key=pass_key,
        command=command,
        wall_seconds=wall_seconds,
        job_seconds=job_seconds,
        failed=failed,
    )
    log(
        f"lab report: {paths['report.md']} ({sum(c['reproduced'] is True for c in claims)} of "
        f"{sum(c['reproduced'] is not None for c in claims)} claims run reproduced)"
    )
    return {
        "paths": paths,
        "claims": claims,
        "metrics": {f"claims/{c['id']}": float(c["reproduced"]) for c in claims if c["reproduced"] is not None},
    }
