"""A training run's MLflow name: what sets it apart from the default run, at a glance.

``grpo-s0`` is the embedded model on the default task, trained in turn; a run on a real model, on
the user's own data or with an asynchronous rollout worker carries each of these in its name
(``grpo-smollm2-135m-my_problems-async2-s0``), so three runs of one algorithm and seed in one
experiment are not three ``grpo-s0``. ``tracking.run_name`` set by the user (or a sweep's
``<variant>-s<seed>``) is used as given.
"""

from __future__ import annotations

from pathlib import PurePath

from ...core.schema import bind
from ...core.schema.train import Trainer

DEFAULT_MODEL = "tiny"  # conf/train.yaml's defaults: the parts a default run leaves out of its name
DEFAULT_DATA = "countdown"


def default_run_name(cfg) -> str:
    """``<algo>[-<model>][-<data>][-async<k>]-s<seed>`` of a composed ``train`` config (see the module doc)."""
    model, data, trainer = cfg.model, cfg.data, cfg.trainer
    parts = [str(cfg.algo.name)]
    model_path = model.get("path")  # a data or model preset may have no path: the preset's own
    model_name = PurePath(str(model_path).rstrip("/")).name if model_path else str(model.name)
    if model_name != DEFAULT_MODEL or model_path:
        parts.append(model_name)
    data_path = data.get("path")
    data_name = PurePath(str(data_path)).stem if data_path else str(data.name)
    if data_name != DEFAULT_DATA or data_path:
        parts.append(data_name)
    staleness = bind(Trainer, trainer).staleness  # a config from before the key: the schema's default, synchronous
    if staleness >= 1:
        parts.append(f"async{staleness}")
    return "-".join(parts + [f"s{trainer.seed}"])
