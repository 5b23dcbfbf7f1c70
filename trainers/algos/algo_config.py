"""The ``algo`` config as the algorithm reads it: the algorithm's own keys, declared once with
their rule and default (``ALGO_KEYS``) and checked where they are read (``read_key``), and the
resolved config as MLflow params (``tracked_config``)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from ...conf import intervention_names
from ...core.errors import UserError
from ...core.registry import unknown_choice
from ...core.validation import BOOL, NONNEG, POS_INT, Rule, check_value, integer, number
from ..interventions import INTERVENTIONS

__all__ = ["ALGO_KEYS", "read_key", "registered_name", "objective_args", "to_dict", "tracked_config"]

#: The algorithm's own keys under ``algo.``: ``key -> (rule, default)``, declared once and checked
#: once (``from_config``). ``advantage`` and ``loss_agg`` are checked against their registries.
ALGO_KEYS: dict[str, tuple[Rule, Any]] = {
    # [0, 1]: the ratio's lower bound 1 - low stays >= 0; 1 turns the low clip off (Clip-Cov's preset)
    "clip.low": (number(0, 1), 0.2),
    "clip.high": (NONNEG, 0.2),
    "clip.dual_c": (number(1, open_low=True, nullable=True), 3.0),
    "loss_agg_norm": (number(0, open_low=True, nullable=True), None),
    "kl_coef": (NONNEG, 0.0),
    "dynamic_sampling.enabled": (BOOL, False),
    "dynamic_sampling.max_num_gen_batches": (POS_INT, 10),
    "overlong.enabled": (BOOL, False),
    "overlong.buffer": (integer(0), 0),
}


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
    rule, default = ALGO_KEYS[key]
    *sections, last = key.split(".")
    node: Any = cfg
    for part in sections:
        node = node.get(part) if isinstance(node, dict) else None
    value = node.get(last, default) if isinstance(node, dict) else default
    check_value(f"algo.{key}", value, rule)
    return value


def registered_name(cfg: dict, key: str, registry, default: str) -> str:
    """``algo.<key>``: the name of a registered function (advantage estimator, loss aggregation)."""
    value = cfg.get(key, default)
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
