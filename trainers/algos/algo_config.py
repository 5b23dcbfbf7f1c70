"""The ``algo`` config as the algorithm reads it: the algorithm's own keys with their rule
(``ALGO_KEYS``), checked where they are read (``read_key``), their defaults declared once, in
``conf/algo/grpo.yaml`` (the base of every algo option; ``algo_defaults``), and the resolved config
as MLflow params (``tracked_config``)."""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ...conf import CONF_DIR, intervention_names
from ...core.errors import UserError
from ...core.registry import unknown_choice
from ...core.validation import BOOL, NONNEG, POS_INT, Rule, check_value, choice, integer, number
from ..interventions import INTERVENTIONS

__all__ = [
    "ALGO_KEYS",
    "CONTROLLER_ENTROPY",
    "algo_defaults",
    "default",
    "read_key",
    "registered_name",
    "objective_args",
    "to_dict",
    "tracked_config",
]

#: ``algo.controller_entropy``: the trainer's policy at the start of the step, or the behaviour policy
#: that generated the batch (the rollout worker's, ``trainer.staleness >= 1``).
CONTROLLER_ENTROPY = ("current", "behaviour")

#: The algorithm's own keys under ``algo.``: ``key -> rule``, checked once (``from_config``); their
#: defaults are the values of ``conf/algo/grpo.yaml``. ``advantage`` and ``loss_agg`` are checked
#: against their registries.
ALGO_KEYS: dict[str, Rule] = {
    # [0, 1]: the ratio's lower bound 1 - low stays >= 0; 1 turns the low clip off (Clip-Cov's preset)
    "clip.low": number(0, 1),
    "clip.high": NONNEG,
    "clip.dual_c": number(1, open_low=True, nullable=True),
    "loss_agg_norm": number(0, open_low=True, nullable=True),
    "kl_coef": NONNEG,
    "dynamic_sampling.enabled": BOOL,
    "dynamic_sampling.max_num_gen_batches": POS_INT,
    "overlong.enabled": BOOL,
    "overlong.buffer": integer(0),
    "overlong.filter": BOOL,
    # the policy whose batch entropy the step controllers read (Algorithm.controller_reading; docs/async.md)
    "controller_entropy": choice(*CONTROLLER_ENTROPY),
}


@functools.cache
def algo_defaults() -> dict:
    """``conf/algo/grpo.yaml`` as a plain dict (its Hydra defaults list dropped): where the
    algorithm's defaults are declared, for a config that leaves a key out (a dict built in code)."""
    import yaml

    raw = yaml.safe_load((CONF_DIR / "algo" / "grpo.yaml").read_text()) or {}
    raw.pop("defaults", None)
    return raw


def default(key: str) -> Any:
    """The default of ``algo.<key>`` (dotted), from ``algo_defaults``."""
    node: Any = algo_defaults()
    for part in key.split("."):
        node = node[part]
    return node


def to_dict(cfg: Any) -> dict:
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return dict(cfg)
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    raise TypeError(f"algo config must be a dict or DictConfig, got {type(cfg).__name__}")


def read_key(cfg: dict, key: str) -> Any:
    """``algo.<key>`` checked against ``ALGO_KEYS`` (its default when absent; null stays null)."""
    rule = ALGO_KEYS[key]
    *sections, last = key.split(".")
    node: Any = cfg
    for part in sections:
        node = node.get(part) if isinstance(node, dict) else None
    value = node.get(last, default(key)) if isinstance(node, dict) else default(key)
    check_value(f"algo.{key}", value, rule)
    return value


def registered_name(cfg: dict, key: str, registry) -> str:
    """``algo.<key>``: the name of a registered function (advantage estimator, loss aggregation)."""
    value = cfg.get(key, default(key))
    if not isinstance(value, str) or value not in registry:
        raise UserError(unknown_choice(f"algo.{key}", value, registry))
    return value


def objective_args(v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise UserError(f"algo.objective_args must be a mapping, e.g. {{tau_pos: 1.0}}; got {v!r}")
    return dict(v)


def tracked_config(cfg) -> dict:
    """The resolved config as a plain dict for MLflow params, without the parameter sections of
    interventions the run does not use (``algo.<name>`` for every intervention that is registered
    or has a config in ``conf/intervention/`` but is not listed in ``algo.interventions``): a run's
    params say what it ran, not every published default."""

    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    algo = plain.get("algo")
    if isinstance(algo, dict):
        active = set(algo.get("interventions") or [])
        for name in set(INTERVENTIONS) | set(intervention_names()):
            if name not in active:
                algo.pop(name, None)
    return plain
