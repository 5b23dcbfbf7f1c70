"""The kinds of job a sweep can run, by name: a variant of an ablation says ``kind: <name>``
(default ``train``). Each kind is a ``jobs.TrainJob`` subclass overriding ``run(cfg)``; the
sweep plans, submits, follows, resumes and tracks every kind alike (``job.json``, ``train.log``).

- ``train``: ``entropyrl train <overrides>`` (``jobs.TrainJob``);
- ``quadrant_probe``: the lab's quadrant sign experiment (``lab/quadrant_probe.QuadrantJob``),
  registered by the lab plugin (``plugins.py``).
"""

from __future__ import annotations

from ..core.registry import Registry
from .jobs import TRAIN_KIND, TrainJob
from .plugins import load_plugins

JOB_KINDS: Registry = Registry("kind", {TRAIN_KIND: TrainJob})


def register_job_kind(name: str, job_class: type[TrainJob]) -> None:
    """Let ablation variants say ``kind: <name>``."""
    JOB_KINDS[name] = job_class


def job_class(kind: str) -> type[TrainJob]:
    if kind not in JOB_KINDS:
        load_plugins()
    return JOB_KINDS.lookup(kind, "kind (of an ablation variant)")
