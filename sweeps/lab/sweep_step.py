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
from ..jobs import TRAIN_KIND, job_kind
from ..state import DONE
from .claims import compute_claims
from .explain import explain_claims
from .method_claims import method_claims
from .null_controls import declare_nulls
from .quadrant_probe import RESULT_FILE
from .report import write_study_report

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
    return write_study_report(
        Path(sweep_dir),
        runs,
        claims,
        name="lab",
        sweep=sweep,
        statuses=statuses,
        ablation=str(sweep.get("ablation", {}).get("name")),
        algo_cfgs=algo_cfgs,
        pass_key=pass_key,
        quadrants=quadrants,
        log=log,
    )
