"""A training run's MLflow name: what sets it apart from the default run, at a glance.

``grpo-s0`` is the embedded model on the default task, trained in turn; a run on a real model, on
the user's own data or with an asynchronous rollout worker carries each of these in its name
(``grpo-smollm2-135m-my_problems-async2-s0``), so three runs of one algorithm and seed in one
experiment are not three ``grpo-s0``. ``tracking.run_name`` set by the user (or a sweep's
``<variant>-s<seed>``) is used as given.
"""

from __future__ import annotations

from pathlib import PurePath

from ...conf import cfg_get

DEFAULT_MODEL = "tiny"  # conf/train.yaml's defaults: the parts a default run leaves out of its name
DEFAULT_DATA = "countdown"


def default_run_name(cfg) -> str:
    """``<algo>[-<model>][-<data>][-async<k>]-s<seed>`` of a composed ``train`` config (see the module doc)."""
    model, data, trainer = cfg_get(cfg, "model", {}), cfg_get(cfg, "data", {}), cfg_get(cfg, "trainer", {})
    parts = [str(cfg_get(cfg_get(cfg, "algo", {}), "name", "run"))]
    model_path = cfg_get(model, "path", None)
    model_name = PurePath(str(model_path).rstrip("/")).name if model_path else str(cfg_get(model, "name", DEFAULT_MODEL))
    if model_name != DEFAULT_MODEL or model_path:
        parts.append(model_name)
    data_path = cfg_get(data, "path", None)
    data_name = PurePath(str(data_path)).stem if data_path else str(cfg_get(data, "name", DEFAULT_DATA))
    if data_name != DEFAULT_DATA or data_path:
        parts.append(data_name)
    staleness = int(cfg_get(trainer, "staleness", 0) or 0)
    if staleness >= 1:
        parts.append(f"async{staleness}")
    return "-".join(parts + [f"s{cfg_get(trainer, 'seed', 0)}"])
