"""Sweep plugins: packages that extend the sweep through its seams (``job_kinds.register_job_kind``,
``report.register_report_step``) when they are imported. The generic sweep imports none of them;
a lookup of a job kind or report step it does not know imports the plugins once, then looks again.

``PLUGINS`` lists the ones shipped (the lab: its quadrant sign experiment and its report step); a
package of your own can be appended (``entropyrl.sweeps.plugins.PLUGINS.append("mypkg.sweeps")``)
or simply imported before the sweep runs.
"""

from __future__ import annotations

import importlib

PLUGINS: list[str] = ["entropyrl.sweeps.lab"]
_loaded: set[str] = set()


def load_plugins() -> None:
    """Import every plugin package not imported yet (each registers itself when imported)."""
    for name in list(PLUGINS):
        if name not in _loaded:
            importlib.import_module(name)
            _loaded.add(name)
