"""Entropy interventions, one module each, registered by name (see ``base.py``).

Importing this package imports every module in it, so each built-in intervention registers itself
(a new module needs no edit here); ``INTERVENTIONS`` maps the config name
(``algo.interventions: [stare, ...]``) to its class. Each one's published parameters are in
``conf/intervention/<name>.yaml``.
"""

import importlib
import pkgutil

from .base import (
    INTERVENTIONS,
    SCOPES,
    Intervention,
    LossContext,
    TokenBatch,
    build_intervention,
    intervention_params,
    register_intervention,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "INTERVENTIONS",
    "SCOPES",
    "Intervention",
    "LossContext",
    "TokenBatch",
    "build_intervention",
    "intervention_params",
    "register_intervention",
]
