"""The entropy story of a run, first on MLflow's run page.

MLflow's run view ("Model metrics") draws one section per metric-name prefix (the part before the
last ``/``), sections sorted by name, and the names without a ``/`` (the headline ``entropy``) in a
last section of their own. The story a reader opens a run for (the token entropy, how often the
intervention acted, the accuracy) would sit under dozens of diagnostic sections. So each step's
record also carries those few curves under the prefix ``0_overview/``, which sorts before every
other section; within it the charts sort by name: ``entropy``, ``method_<acted metric>``,
``train_acc``, ``val_acc``. They are copies under a second name, written to ``metrics.jsonl`` and
MLflow alike, so a name found in one is found in the other; every report reads the original names.
"""

from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["OVERVIEW_PREFIX", "overview_metrics"]

OVERVIEW_PREFIX = "0_overview"


def overview_metrics(metrics: Mapping[str, float], acted_keys: Iterable[str]) -> dict[str, float]:
    """The ``0_overview/*`` copies of a step's ``metrics``: ``entropy``; for each of ``acted_keys``
    (the run's interventions' "acted" metrics, ``Intervention.acted_key``, e.g. ``stare/gate_on``)
    ``method_<key with / as _>``; ``train_acc`` (``acc/mean``); ``val_acc`` (``val/acc``, on the
    steps that validated). A source missing from ``metrics`` gives no copy. Pure."""
    sources = [("entropy", "entropy")]
    sources += [(key, "method_" + key.replace("/", "_")) for key in acted_keys]
    sources += [("acc/mean", "train_acc"), ("val/acc", "val_acc")]
    return {f"{OVERVIEW_PREFIX}/{name}": float(metrics[key]) for key, name in sources if key in metrics}
