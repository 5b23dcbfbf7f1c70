"""Sweep plugins: packages that extend the sweep through its seams (``studies.register_study``,
``job_kinds.register_job_kind``, ``report.register_report_step``) when they are imported. The generic
sweep imports none of them; a lookup of a job kind or report step it does not know imports the plugins
once, then looks again, and ``entropyrl lab`` imports them before it lists or looks up a study.

The plugins are ``PLUGINS``, the ones shipped (the lab: its studies' report steps and its quadrant sign
experiment), then every module an installed distribution names in the entry-point group
``entropyrl.plugins`` (``pyproject.toml``: ``[project.entry-points."entropyrl.plugins"]`` with
``mystudy = "mypkg.sweeps"``), so the ``entropyrl`` command finds a plugin without a script of
your own; a package may also be appended to ``PLUGINS`` (``entropyrl.sweeps.plugins.PLUGINS.append``).
``entropyrl lab --help`` imports them to list their studies: a plugin's module declares, and leaves
torch and its report step's heavy imports to ``Study.report_step_at`` (imported when the report runs),
as the package's own ``sweeps/studies.py`` does.
"""

from __future__ import annotations

import importlib
from importlib import metadata

ENTRY_POINT_GROUP = "entropyrl.plugins"  # installed distributions name their plugin modules here
PLUGINS: list[str] = ["entropyrl.sweeps.lab"]
_loaded: set[str] = set()


def installed_plugins() -> list[str]:
    """The modules installed distributions name in ``ENTRY_POINT_GROUP``, sorted by entry-point name."""
    return [ep.value.split(":", 1)[0] for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)]


def load_plugins() -> None:
    """Import every plugin (``PLUGINS``, then the installed ones) not imported yet; each registers
    itself when imported."""
    _import([*PLUGINS, *installed_plugins()])


def load_installed_plugins() -> None:
    """Import the installed plugins only (not the shipped lab, whose studies ``sweeps/studies.py``
    declares without it): what ``entropyrl lab --help`` needs to list every study."""
    _import(installed_plugins())


def _import(names: list[str]) -> None:
    for name in names:
        if name not in _loaded:
            importlib.import_module(name)
            _loaded.add(name)
