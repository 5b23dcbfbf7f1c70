"""The lab as a sweep plugin: it registers its job kind (``quadrant_probe``, the quadrant sign
experiment) and the report step of every study ``sweeps/studies.py`` declares (``lab``: the claim
table, ``lab.json``, ``report.md`` and the figures; ``lab_tools``: the tool study's; ``lab_staleness``:
the staleness study's; ``real_model``: the real-model study's) through the sweep's seams;
``conf/ablation/lab.yaml``, ``conf/ablation/lab_tools.yaml``, ``conf/ablation/staleness.yaml`` and
``conf/ablation/real_model.yaml`` name them. The claim helpers every study builds its table with are
``kit.py``'s."""

from __future__ import annotations

from ...core.registry import Registry
from ..job_kinds import register_job_kind
from ..report import register_report_step
from ..studies import STUDIES
from .quadrant_probe import QuadrantJob

register_job_kind("quadrant_probe", QuadrantJob)
_STEPS = Registry("report_step", {s.report_step: s.report_step_at for s in STUDIES.values()})  # name -> "module:function"
for _name in _STEPS:
    register_report_step(_name, _STEPS.lookup(_name))  # the step's module imported now
