"""The lab's report step over a sweep of the ``lab`` ablation (``ablation.report_step: lab``).

After the sweep's own report, it reads the folder's finished jobs (``study_runs.read_study_runs``): the training runs'
``metrics.jsonl`` rows and saved ``config.yaml`` (``runs/<variant>/s<seed>/``) and the quadrant
experiment's ``quadrants.json`` (``runs/quadrants/s<seed>/``), computes the claim table
(``claims.compute_claims``) and writes ``lab.json``, ``report.md`` and the figures
(``report.write_lab_outputs``) into the sweep folder. ``entropyrl report DIR`` runs it again from
the files alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .claims import compute_claims
from .explain import explain_claims
from .method_claims import method_claims
from .null_controls import declare_nulls
from .report import write_study_report
from .study_runs import read_study_runs

__all__ = ["lab_report_step"]


def lab_report_step(sweep_dir: Path, sweep: dict, statuses: list, log: Callable[[str], None] = print) -> dict:
    """The lab's claims, ``lab.json``, ``report.md`` and figures in ``sweep_dir``; returns
    ``{"paths": {name: path}, "metrics": {"claims/<id>": 1.0 | 0.0}}``."""
    study = read_study_runs(sweep, statuses, stare_preset=["experiment=lab_stare"], base_preset=["experiment=lab_grpo"])
    runs, algo_cfgs = study.runs, study.algo_cfgs
    claims = compute_claims(
        runs, h_tgt=study.h_tgt, algo_cfgs=algo_cfgs, quadrants=study.quadrants or None, pass_key=study.pass_key
    )
    claims += method_claims(runs, algo_cfgs)  # the newer methods, where their runs are present
    claims = explain_claims(claims, runs)  # why entropy moved, from the runs' attribution
    claims = declare_nulls(claims)  # each claim's null control, in words (null_controls.py)
    return write_study_report(Path(sweep_dir), study, claims, name="lab", quadrants=study.quadrants, log=log)
