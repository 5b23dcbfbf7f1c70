"""The lab as a sweep plugin: it registers its job kind (``quadrant_probe``, the quadrant sign
experiment) and its report step (``lab``: the claim table, ``lab.json``, ``report.md`` and the
figures; ``lab_tools``: the tool study's; ``lab_staleness``: the staleness study's; ``real_model``: the
real-model study's) through the sweep's seams; ``conf/ablation/lab.yaml``, ``conf/ablation/lab_tools.yaml``,
``conf/ablation/staleness.yaml`` and ``conf/ablation/real_model.yaml`` name them."""

from __future__ import annotations

from ..job_kinds import register_job_kind
from ..report import register_report_step
from .quadrant_probe import QuadrantJob
from .real_model_step import real_model_report_step
from .staleness_step import lab_staleness_report_step
from .sweep_step import lab_report_step
from .tool_step import lab_tools_report_step

register_job_kind("quadrant_probe", QuadrantJob)
register_report_step("lab", lab_report_step)
register_report_step("lab_tools", lab_tools_report_step)
register_report_step("lab_staleness", lab_staleness_report_step)
register_report_step("real_model", real_model_report_step)
