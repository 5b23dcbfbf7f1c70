"""Types and ranges of config values, checked before any command has side effects.

Each primary config (``train``, ``eval``, ``sweep``) has a table ``key -> Rule`` below; adding a
key is one line. ``entropyrl.conf.compose`` checks the composed config against its table, so every
command (and every job of a sweep, composed at plan time) rejects a bad value with one line naming
the key, the value and what is allowed, before a folder, a model or an MLflow run exists:

    validate_config(compose("train", ["optim.lr=-1"]), "train")
    # UserError: optim.lr=-1 is not allowed: it must be a number > 0

The keys a primary config owns itself (``trainer.*``, ``optim.*``, ``eval.*``, ``sweep_dir``, ...)
and those of the groups in ``entropyrl.conf.GROUP_SCHEMAS`` (``tools.*``, ``tracking.*``,
``rollout.*``, ``launcher.*``, ``model.*``) are declared once in the run schema, ``core/schema/``, each
with its default, rule and doc; their rules enter the tables from there (``rules(TrainSchema)``,
``rules(ToolsSchema, "tools.")``). The tables list the rest by hand, each a rule or ``owned``: the
component that reads and checks a value or a whole ``prefix.*`` section, such as a task's parameters. tests/conf/test_validation.py keeps them
one-to-one: every key a shipped YAML or the schema sets has a rule (or one in ``ALGO_KEYS`` / an
intervention's ``Params``), and every rule names a key some shipped YAML or the schema sets.

Keys a config does not have are skipped. Paths are checked for being usable folders: not a file,
not under a file, and writable where they will be created. Keys that were renamed (``RENAMED``)
are one-line errors naming the new key, wherever they are set (an override, an experiment or
ablation YAML).

The rules themselves (``Rule``, ``POS_INT``, ...) live in ``core/rules.py``. A component with its own parameters declares
and checks them once, beside its code, with the same rules: the algorithm's keys in
``trainers/algos/algorithm.py`` (``ALGO_KEYS``), each entropy intervention's in its ``Params``
(``validate``); ``trainers/preflight.py`` runs those checks before a training run creates anything.
"""

# size: one table of rules per command, a line per key, with the checks that read it
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .errors import UserError
from .files import file_problem, folder_problem  # noqa: F401  (re-exported: their old home)
from .rules import (  # noqa: F401  (re-exported: the rules' old home)
    BOOL,
    FOLDER,
    MAPPING,
    NONNEG,
    NONNEG_INT,
    OPEN_PROB,
    OPT_STR,
    POS,
    POS_INT,
    PROB,
    STR,
    STR_LIST,
    THREADS,
    Rule,
    _show,
    choice,
    integer,
    number,
    owned,
)
from .schema import rules
from .schema.eval import EvalSchema
from .schema.launcher import LAUNCHER_SCHEMAS
from .schema.model import MODEL_SCHEMAS
from .schema.rollout import ROLLOUT_SCHEMAS
from .schema.sweep import SweepSchema
from .schema.tools import ToolsSchema
from .schema.tracking import TrackingSchema
from .schema.train import TrainSchema

_ABSENT = object()

# -- the tables --------------------------------------------------------------------------------
#: ``tracking``: where a run is logged (MLflow), declared in ``core/schema/tracking.py``.
TRACKING = rules(TrackingSchema, "tracking.")


#: ``tools``: multi-turn rollouts with a code interpreter, declared in ``core/schema/tools.py``; the
#: format's name and tags and the executor's limits are checked by ``evals/code/tool_executor.check_tools``.
TOOLS = rules(ToolsSchema, "tools.")

#: ``rollout``: the engines' keys, declared in ``core/schema/rollout.py``, one schema per engine; the
#: table holds the union of their rules (the sampling keys they share are one rule each).
ROLLOUT = {k: r for schema in ROLLOUT_SCHEMAS.values() for k, r in rules(schema, "rollout.").items()}

#: ``model``: the presets' keys, declared in ``core/schema/model.py``, one schema per preset's shape
#: (embedded, GGUF, hub); the table holds the union of their rules (``chat_template`` owned by the loader).
MODEL = {k: r for schema in MODEL_SCHEMAS.values() for k, r in rules(schema, "model.").items()}

#: ``launcher``: where a sweep's jobs run, declared in ``core/schema/launcher.py``, one schema per
#: launcher; the table holds the union of their rules (``threads_per_job`` and
#: ``additional_parameters.*`` owned by the component that reads them).
LAUNCHER = {k: r for schema in LAUNCHER_SCHEMAS.values() for k, r in rules(schema, "launcher.").items()}

#: Keys that moved: ``{old key: new key}``. Setting an old one is an error naming the new one.
RENAMED = {"trainer.lr": "optim.lr", "trainer.weight_decay": "optim.weight_decay", "trainer.betas": "optim.betas"}

TRAIN = {
    **rules(TrainSchema),  # the keys conf/train.yaml owns: core/schema/train.py
    "data.*": owned("the task (tasks/, trainers/data/): each data= option declares its own keys"),
    **ROLLOUT,
    **MODEL,
    **TRACKING,
    **TOOLS,
}

EVAL = {
    **rules(EvalSchema),  # the keys conf/eval.yaml owns: core/schema/eval.py
    **MODEL,
    **TRACKING,
    **TOOLS,
}

SWEEP = {
    **rules(SweepSchema),  # the keys conf/sweep.yaml owns: core/schema/sweep.py
    **LAUNCHER,
    "ablation.*": owned("sweeps/planning.py (name, description, base, variants, report)"),
    **TRACKING,
}

SCHEMAS: dict[str, dict[str, Rule]] = {"train": TRAIN, "eval": EVAL, "sweep": SWEEP}


def rule_for(config_name: str, key: str) -> Rule | None:
    """The rule of ``key`` in ``config_name``'s table: its own entry, else the nearest ``prefix.*``
    section that holds it; None when the table does not know the key."""
    table = SCHEMAS.get(config_name, {})
    if key in table:
        return table[key]
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        section = ".".join(parts[:n]) + ".*"
        if section in table:
            return table[section]
    return None


def _divisible(cfg) -> str | None:
    p, m = _get(cfg, "trainer.prompts_per_step"), _get(cfg, "trainer.mini_batch_prompts")
    if isinstance(p, int) and isinstance(m, int) and p % m:
        return (
            f"trainer.prompts_per_step={p} must be a multiple of trainer.mini_batch_prompts={m} "
            f"(prompts_per_step / mini_batch_prompts optimizer steps per epoch)"
        )
    return None


#: Checks that involve several keys: each returns a problem (one line) or None. (``_divisible`` is
#: also enforced by the trainer at start; tests/sweeps/test_sweeps.py uses it as a job that fails at run
#: time, so it is not in this list yet.)
CROSS_CHECKS: dict[str, list[Callable[[Any], str | None]]] = {}


# -- checking ----------------------------------------------------------------------------------
def _get(cfg, key: str) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        return value
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def renamed_problem(key: str, value: Any = _ABSENT) -> str | None:
    """The error line for setting renamed key ``key`` (to ``value``, when known), or None."""
    new = RENAMED.get(key)
    if new is None:
        return None
    shown = "..." if value is _ABSENT else _show(value)
    return f"{key} was renamed {new}; use {new}={shown}"


def check_value(key: str, value: Any, rule: Rule) -> None:
    """Raise ``UserError`` when ``value`` breaks ``rule`` (the message names key, value, allowed)."""
    if rule.ok(value):
        return
    if rule.kind == "path" and isinstance(value, (str, Path)) and str(value).strip():
        raise UserError(f"{key}={value}: {folder_problem(value)}; choose another {key}=...")
    raise UserError(f"{key}={_show(value)} is not allowed: it must be {rule.allowed()}")


def validate_config(cfg, config_name: str) -> None:
    """Check every value of a composed ``config_name`` config against its table (see module doc)."""
    if config_name == "train":
        for old in RENAMED:
            value = _get(cfg, old)
            if value is not _ABSENT:
                raise UserError(renamed_problem(old, value))
    for key, rule in SCHEMAS.get(config_name, {}).items():
        if key.endswith(".*"):
            continue  # a section its component checks
        value = _get(cfg, key)
        if value is not _ABSENT:
            check_value(key, value, rule)
    for check in CROSS_CHECKS.get(config_name, []):
        problem = check(cfg)
        if problem:
            raise UserError(problem)


# -- paths -------------------------------------------------------------------------------------
def check_output_file(path: str | Path, option: str) -> None:
    """Raise ``UserError`` unless a file can be written at ``path`` (``option`` names the flag)."""
    problem = file_problem(path)
    if problem:
        raise UserError(f"{option} {path}: {problem}; choose another {option}")
