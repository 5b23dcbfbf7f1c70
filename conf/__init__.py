"""entropyrl's Hydra configs, shipped as package data, and the one way to compose them.

Primary configs: ``train`` (``entropyrl train``), ``eval`` (``entropyrl eval``) and ``sweep``
(``entropyrl sweep``). Config groups live in sub-folders (``algo/``, ``model/``, ...); every YAML
says at its top what it is for and how to override it.

    from entropyrl.conf import compose
    cfg = compose("train", ["algo=stare", "trainer.total_steps=40"])

Entropy interventions keep their published parameters beside their module, one config per
intervention: ``conf/intervention/<name>.yaml``, or a node stored in Hydra's ``ConfigStore`` under
group ``intervention`` (a structured config such as the intervention's ``Params`` dataclass, e.g.
from a test or a plugin). ``compose`` mounts every one of them at ``algo.<name>`` (through the
``intervention_defaults`` node that ``conf/algo/grpo.yaml`` includes), so ``algo.stare.p=0.2``
works for every algo and adding an intervention edits no shared config.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import UserError
from ..core.registry import unknown_choice
from ..core.schema import defaults
from ..core.schema.eval import EvalSchema
from ..core.schema.launcher import LAUNCHER_SCHEMAS
from ..core.schema.model import MODEL_SCHEMAS
from ..core.schema.rollout import ROLLOUT_SCHEMAS
from ..core.schema.sweep import SweepSchema
from ..core.schema.tools import ToolsSchema
from ..core.schema.tracking import TrackingSchema
from ..core.schema.train import TrainSchema
from ..core.validation import SCHEMAS, renamed_problem, validate_config

if TYPE_CHECKING:
    from omegaconf import DictConfig

# Hydra and OmegaConf are imported where a config is composed or read, not with the package: the
# command line's --help and the group lists (``config_groups``, ``primary_defaults``) need neither.

CONF_DIR = Path(__file__).resolve().parent
INTERVENTION_GROUP = "intervention"  # conf/intervention/<name>.yaml, or ConfigStore group
INTERVENTION_MOUNT = "intervention_defaults"  # the ConfigStore node conf/algo/grpo.yaml includes
SCHEMA_GROUP = "schema"  # ConfigStore group of the primary configs' schema nodes (core/schema/)
#: Each primary config's run schema: the keys it owns, with their defaults, rules and docs.
RUN_SCHEMAS = {"train": TrainSchema, "eval": EvalSchema, "sweep": SweepSchema}
#: Each config group whose options' keys the run schema declares: ``{group: schema}``, stored as
#: ``schema/<group>`` and listed first by the group's declaring option (``- /schema/tools@_here_``);
#: or ``{group: {option: schema}}`` where each option has keys of its own (the rollout engines, the
#: launchers; the model presets, several sharing their shape's schema), stored as
#: ``schema/<group>/<option>`` and listed first by that option (``- /schema/rollout/hf@_here_``).
GROUP_SCHEMAS = {
    "tools": ToolsSchema,
    "tracking": TrackingSchema,
    "rollout": ROLLOUT_SCHEMAS,
    "launcher": LAUNCHER_SCHEMAS,
    "model": MODEL_SCHEMAS,
}

#: Keys a primary config lacks because another command owns them: ``{config: {key: why}}``. An
#: override of one is a one-line error that says where it belongs (rather than "unknown key").
OWNED_ELSEWHERE = {
    "train": {
        "launcher": "is for sweeps: launchers are for `entropyrl sweep` (e.g. `entropyrl sweep "
        "ablation=gate launcher=slurm`); `entropyrl train` runs in this process (call it, "
        "or `torchrun ... -m entropyrl.cli.main train`, from your own sbatch script)"
    },
}


def config_groups() -> dict[str, list[str]]:
    """Every config group (sub-folder of ``conf/``) and its options, sorted. Nested groups use ``/``."""
    groups: dict[str, list[str]] = {}
    for yaml in sorted(CONF_DIR.rglob("*.yaml")):
        rel = yaml.relative_to(CONF_DIR)
        if len(rel.parts) < 2:
            continue  # a primary config, not a group option
        groups.setdefault("/".join(rel.parts[:-1]), []).append(yaml.stem)
    return {g: sorted(opts) for g, opts in sorted(groups.items())}


def _stored_interventions() -> dict:
    """``{name: ConfigNode}`` of the interventions stored in Hydra's ConfigStore (not the files)."""
    from hydra.core.config_store import ConfigStore

    group = ConfigStore.instance().repo.get(INTERVENTION_GROUP, {})
    return {key[: -len(".yaml")]: node for key, node in group.items() if key.endswith(".yaml")}


def intervention_names() -> list[str]:
    """Every intervention that has published parameters: ``conf/intervention/*.yaml`` plus the
    ``intervention`` nodes of Hydra's ConfigStore, sorted."""
    files = {p.stem for p in (CONF_DIR / INTERVENTION_GROUP).glob("*.yaml")}
    return sorted(files | set(_stored_interventions()))


def intervention_defaults(name: str) -> dict | None:
    """The published parameters of intervention ``name`` as a plain dict (its YAML, or its
    ConfigStore node), or None when it has none (then its ``Params`` dataclass must say them)."""
    from omegaconf import OmegaConf

    path = CONF_DIR / INTERVENTION_GROUP / f"{name}.yaml"
    if path.is_file():
        node = OmegaConf.load(path)
    else:
        stored = _stored_interventions().get(name)
        if stored is None:
            return None
        node = stored.node
    plain = OmegaConf.to_container(node, resolve=True)
    plain.pop("defaults", None)
    return plain


def store_schemas() -> None:
    """Store each primary config's schema node (``schema/<config>``: the defaults of the keys it owns,
    from ``core/schema/``) and each group's (``schema/<group>``, or ``schema/<group>/<option>`` per
    option) in Hydra's ConfigStore; each primary YAML, and each group's declaring option, lists its
    node first."""
    from hydra.core.config_store import ConfigStore

    for name, schema in {**RUN_SCHEMAS, **GROUP_SCHEMAS}.items():
        if isinstance(schema, dict):  # one schema per option of the group
            for option, option_schema in schema.items():
                ConfigStore.instance().store(group=f"{SCHEMA_GROUP}/{name}", name=option, node=defaults(option_schema))
        else:
            ConfigStore.instance().store(group=SCHEMA_GROUP, name=name, node=defaults(schema))


def mount_interventions() -> None:
    """(Re)store the ``intervention_defaults`` node: a defaults list that mounts every intervention
    config at ``<package>.<name>`` (``algo.<name>`` where ``conf/algo/grpo.yaml`` includes it); and
    the schema nodes (``store_schemas``): the two kinds of node composition needs from the store."""
    from hydra.core.config_store import ConfigStore

    store_schemas()
    ConfigStore.instance().store(
        name=INTERVENTION_MOUNT, node={"defaults": [{f"/{INTERVENTION_GROUP}@{name}": name} for name in intervention_names()]}
    )


def primary_configs() -> list[str]:
    return sorted(p.stem for p in CONF_DIR.glob("*.yaml"))


def _flat_keys(node, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [k for key, v in node.items() for k in ([f"{prefix}{key}"] + _flat_keys(v, f"{prefix}{key}."))]
    return []


def _near_key(name: str, known: list[str]) -> str:
    """`` (did you mean `trainer.total_steps`?)`` for the closest existing key, or nothing: a key of the
    same section whose name the given one begins (``rollout.temp`` -> ``rollout.temperature``) when
    exactly one does, else the closest spelling."""
    section, _, last = name.rpartition(".")
    started = [k for k in known if k.rpartition(".")[0] == section and k.rpartition(".")[2].startswith(last)]
    near = started if len(last) >= 3 and len(started) == 1 else difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    return f" (did you mean `{near[0]}`?)" if near else ""


def _known_keys(config_name: str, overrides: list[str]) -> list[str]:
    """Every dotted key of ``config_name`` composed with the overrides that only pick group options."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    picks = [o for o in overrides if "=" in o and "." not in o.split("=", 1)[0] and not o.startswith(("+", "~"))]
    for attempt in (picks, []):
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="entropyrl"):
                cfg = hydra_compose(config_name=config_name, overrides=attempt)
            return _flat_keys(OmegaConf.to_container(cfg, resolve=False))
        except (HydraException, OmegaConfBaseException):
            continue
        finally:
            GlobalHydra.instance().clear()
    return []


def _mapping_of(config_name: str, name: str) -> str | None:
    """The key whose value is a mapping the user fills (``tracking.tags``, an owned section of a
    section such as ``rollout.engine_kwargs``) that ``name`` is or is an entry of, else None: Hydra adds
    its entries only with a +. A whole config group its option declares (``data.*``) is not one: a key
    its option lacks is unknown, not an entry to add."""
    table, parts = SCHEMAS.get(config_name, {}), name.split(".")
    for n in range(2, len(parts) + 1):
        prefix = ".".join(parts[:n])
        rule = table.get(prefix) or table.get(prefix + ".*")  # declared for this very key, not a section above it
        if rule is not None and rule.kind in ("mapping", "owned"):
            return prefix
    return None


def _check_added_keys(cfg: DictConfig, overrides: list[str], known: list[str], config_name: str = "train") -> None:
    """``+trainer.total_step=5`` adds a key nothing reads: refuse it when it is a near miss of a real one
    (an entry added to a mapping key, ``+tracking.tags.team=rl``, is what the mapping is for)."""
    for o in overrides:
        if o.startswith("+") and not o.startswith("++") and "=" in o:
            name = o[1:].split("=", 1)[0]
            hint = _near_key(name, [k for k in known if k != name])
            if name not in known and hint and _mapping_of(config_name, name) is None:
                raise UserError(f"+{name} adds a key that nothing reads{hint}; drop the + and fix the name")


def _check_intervention_params(cfg: DictConfig, overrides: list[str]) -> None:
    """``algo.stare.p=0.2`` with ``algo=grpo``: a parameter of an intervention the run does not apply."""
    algo = cfg.get("algo") if hasattr(cfg, "get") else None
    if algo is None or "interventions" not in algo:
        return
    used = {str(x) for x in (algo.get("interventions") or [])} | {"tis"}  # tis: rollout.tis.enabled
    names = set(intervention_names())
    for name in sorted(used - names):  # what `train` would refuse, refused at compose time
        raise UserError(unknown_choice("algo.interventions entry", name, names))
    for o in overrides:
        parts = o.lstrip("+~").split("=", 1)[0].split(".")
        if len(parts) >= 3 and parts[0] == "algo" and parts[1] in names and parts[1] not in used:
            active = ", ".join(sorted(used - {"tis"})) or "none"
            raise UserError(
                f"{o.lstrip('+~')} sets a parameter of the {parts[1]} intervention, which algo={algo.name} "
                f"does not apply (its interventions: {active}); use algo={parts[1]} or add it with "
                f"algo.interventions=[{parts[1]}]"
            )


def _explain(exc: Exception, overrides: list[str], known: list[str] | None = None, config_name: str = "train") -> str:
    """Turn Hydra's multi-line composition errors into one actionable line."""
    known = known or []
    msg = str(exc)
    append = re.search(r"Could not override '([^']+)'.*?To append to your config use (\+\S+)", msg, re.S)
    mapping = _mapping_of(config_name, append.group(1)) if append else None
    if mapping is not None:  # a mapping's entries: Hydra adds them only with +
        return f"{mapping} is a mapping: its entries are added with a +: write {append.group(2)}"
    missing = re.search(r"Could not find '([^']+)/([^']+)'", msg)
    if missing:
        group, option = missing.groups()
        choices = config_groups().get(group, [])
        if choices:
            return unknown_choice(group, option, choices)
        return f"unknown config group '{group}'; valid groups: {', '.join(config_groups())}"
    key = re.search(r"Could not override '([^']+)'", msg) or re.search(r"Key '([^']+)' is not in struct", msg)
    if key:
        name = key.group(1)
        if name == "data.path":
            return (
                f"unknown config key '{name}': the chosen data= option is a built-in task that reads no file; "
                f"your own jsonl/json/parquet: data=dapo_math_17k data.path=FILE (math, graded against its answer "
                f"column; reward.functions for any other reward) or data=humaneval_code data.path=FILE (code)"
            )
        return f"unknown config key '{name}'{_near_key(name, known)}; `entropyrl config show` lists the valid keys"
    if msg.startswith("Error merging override") and exc.__cause__ is not None:
        cause = next((line.strip() for line in str(exc.__cause__).splitlines() if line.strip()), "")
        return f"bad value in {msg[len('Error merging override') :].strip()}: {cause}"
    if "LexerNoViableAlt" in msg or "token recognition error" in msg:
        odd = next((o for o in overrides if any(not c.isascii() or c in " ()[]{}'\"" for c in o.partition("=")[2])), None)
        if odd is not None:
            key, _, value = odd.partition("=")
            return (
                f"cannot parse override {odd!r}: its value has characters an override must quote "
                f"(non-ASCII, spaces, brackets): write {key}='{value}' (in a shell: \"{key}='{value}'\")"
            )
    if "mismatched input" in msg or "no viable alternative" in msg or "extraneous input" in msg:
        return f"cannot parse overrides {overrides}: write them as key=value (e.g. trainer.total_steps=40)"
    first = next((line.strip() for line in msg.splitlines() if line.strip()), msg)
    return f"bad config override: {first}"


def compose(config_name: str, overrides: list[str] | None = None, *, validate: bool = True) -> DictConfig:
    """Compose primary config ``config_name`` with Hydra override strings (``key=value``).

    Raises ``UserError`` with a one-line message for an unknown group option, key or syntax, and
    (``validate``) for a value of the wrong type or range (``entropyrl.core.validation``), so every
    command rejects bad values before it creates anything.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    bad = [o for o in overrides if "=" not in o and not o.startswith("~")]
    if bad:
        raise UserError(
            f"cannot parse override '{bad[0]}': write overrides as key=value (e.g. algo=stare trainer.total_steps=40)"
        )
    if config_name not in primary_configs():
        raise UserError(f"unknown config '{config_name}'; valid: {', '.join(primary_configs())}")
    for o in overrides:
        body = o.lstrip("+~")
        key, _, value = body.partition("=")
        renamed = None
        if config_name == "train":  # trainer.lr=... -> "trainer.lr was renamed optim.lr; use optim.lr=..."
            renamed = renamed_problem(key, value) if value else renamed_problem(key)
        if renamed:
            raise UserError(renamed)
        why = OWNED_ELSEWHERE.get(config_name, {}).get(re.split(r"[.=@]", body, maxsplit=1)[0])
        if why:
            raise UserError(f"{body} {why}")
    GlobalHydra.instance().clear()
    mount_interventions()  # picks up interventions a test or plugin stored since the last call
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="entropyrl"):
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        GlobalHydra.instance().clear()
        known = _known_keys(config_name, overrides) if "override" in str(exc) or "struct" in str(exc) else []
        raise UserError(_explain(exc, overrides, known, config_name)) from None
    finally:
        GlobalHydra.instance().clear()
    if any(o.startswith("+") for o in overrides):
        _check_added_keys(cfg, overrides, _known_keys(config_name, overrides), config_name)
    if validate:
        validate_config(cfg, config_name)
    if config_name == "train":
        _check_intervention_params(cfg, overrides)
    return cfg


def to_yaml(cfg: DictConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(cfg, resolve=True)


def used_settings(cfg: DictConfig) -> tuple[dict, list[str]]:
    """``(config as a plain dict, hidden)``: the composed config without the parameter sections of
    interventions the run does not apply (``algo.<name>`` for a name outside ``algo.interventions``;
    ``tis`` counts as applied with ``rollout.tis.enabled``), and the names of those left out. A
    model that is not the embedded one loses ``model.warm_start`` too (a task may set the embedded
    model's warm start, conf/data/countdown.yaml; no other model has one). What ``config show``
    prints by default: only what the run uses."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True)
    model = plain.get("model") if isinstance(plain, dict) else None
    if isinstance(model, dict) and not model.get("embedded") and "warm_start" in model:
        del model["warm_start"]
    algo = plain.get("algo") if isinstance(plain, dict) else None
    if not isinstance(algo, dict) or "interventions" not in algo:
        return plain, []
    names = algo.get("interventions") or []
    used = {str(n) for n in ([names] if isinstance(names, str) else names)}
    rollout = plain.get("rollout") or {}
    if isinstance(rollout.get("tis"), dict) and rollout["tis"].get("enabled"):
        used.add("tis")
    hidden = [n for n in intervention_names() if n in algo and n not in used]
    for n in hidden:
        del algo[n]
    return plain, hidden


def primary_defaults(config_name: str) -> dict[str, str]:
    """``{group: default option}`` from a primary config's defaults list (plain YAML: no Hydra)."""
    import yaml

    raw = yaml.safe_load((CONF_DIR / f"{config_name}.yaml").read_text()) or {}
    out: dict[str, str] = {}
    for item in raw.get("defaults", []):
        if isinstance(item, dict):
            for k, v in item.items():
                out[str(k).split("@")[0].lstrip("/")] = str(v)
    return out


def cfg_get(cfg, key: str, default=None):
    """``cfg[key]`` from a DictConfig, dict or attribute object, with ``default`` for missing or null."""
    if cfg is None:
        return default
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def to_plain(value):
    """OmegaConf containers -> plain dicts/lists (resolved); anything else unchanged."""
    omegaconf = sys.modules.get("omegaconf")  # not imported: nothing can be one of its containers
    if omegaconf is not None and isinstance(value, (omegaconf.DictConfig, omegaconf.ListConfig)):
        return omegaconf.OmegaConf.to_container(value, resolve=True)
    return value
