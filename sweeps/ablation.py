"""Ablation expansion: a named grid of variants times seeds, into one training job each.

An ablation (``conf/ablation/<name>.yaml``) is::

    name: quantile
    base: [algo=stare]                      # training overrides every variant shares
    variants:                               # named variants, each a list of training overrides
      - {name: gated, overrides: [algo=stare]}
    grid:                                   # and/or a cartesian grid over any config keys
      algo.stare.p: [0.05, 0.1, 0.2]        #   -> variants p0.05, p0.1, p0.2

A named variant may be another job kind than a training run (``kind: quadrant_probe``, the lab's
quadrant sign experiment, with its ``params``; sweeps/job_kinds.py); it is planned, submitted,
followed and resumed like the training jobs, and left out of the comparison.

``variants`` and ``grid`` combine as a product (variant x grid point). Each variant runs once per
seed; a job's training overrides are, in order (a later value for the same key wins):
``sweep.budget`` < ``ablation.base`` < the variant's overrides < the command line's ``train.*``
overrides < the job's own ``trainer.seed``/``output_dir``/``trainer.resume=auto``/``trainer.progress=false``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, ListConfig, OmegaConf

from ..conf import compose
from ..core.errors import UserError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
# Keys the sweep sets itself for every job (the user cannot move them per variant).
JOB_OWNED_KEYS = ("output_dir", "trainer.seed", "trainer.resume", "trainer.progress")


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]
    kind: str = "train"  # the job kind (sweeps/job_kinds.py) that runs it
    params: dict[str, Any] = field(default_factory=dict)  # that kind's own settings (e.g. batches)


@dataclass
class JobSpec:
    """One training run of a sweep: a variant at a seed, with its own output folder."""

    key: str  # "<variant>/s<seed>", unique in a sweep
    variant: str
    seed: int
    overrides: list[str]  # complete training overrides (entropyrl train ...)
    output_dir: str  # absolute
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def override_key(override: str) -> str:
    """``"+tracking.tags.a=1"`` -> ``"tracking.tags.a"``; the key an override string sets."""
    key = override.split("=", 1)[0].strip()
    return key.lstrip("+~")


def merge_overrides(*lists: Iterable[str]) -> list[str]:
    """Concatenate override lists; when a key appears more than once the last value wins (and keeps
    the position of its last occurrence)."""
    last: dict[str, str] = {}
    for lst in lists:
        for o in lst or []:
            o = str(o)
            if "=" not in o and not o.startswith("~"):
                raise UserError(
                    f"cannot parse override '{o}': write overrides as key=value (e.g. algo=stare trainer.total_steps=40)"
                )
            k = override_key(o)
            last.pop(k, None)
            last[k] = o
    return list(last.values())


def _as_list(node: Any) -> list:
    if node is None:
        return []
    if isinstance(node, (ListConfig, DictConfig)):
        node = OmegaConf.to_container(node, resolve=True)
    if isinstance(node, (str, int, float)):  # one value: seeds=3, base=algo=stare
        return [node]
    return list(node)


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt_value(x) for x in v) + "]"
    return str(v)


def _grid_name(key: str, value: Any) -> str:
    short = key.split(".")[-1]
    text = _fmt_value(value)
    if key == "algo":  # algo=steer -> steer
        return text
    return f"{short}{text}".replace("[", "").replace("]", "").replace(",", "_")


def ablation_name(abl: DictConfig) -> str:
    """The ablation's ``name`` (its sweep folder's and MLflow parent run's); ``UserError`` without one."""
    name = abl.get("name")
    if name is None or not str(name).strip():
        raise UserError("the ablation has no name: give it one (`name: my_ablation` at the top of its YAML)")
    return str(name)


def variants_of(ablation: DictConfig | dict) -> list[Variant]:
    """The ablation's variants: the ``variants`` list times the ``grid`` product."""
    abl = OmegaConf.create(ablation) if isinstance(ablation, dict) else ablation
    name = ablation_name(abl)
    listed: list[Variant] = []
    for i, item in enumerate(_as_list(abl.get("variants"))):
        if isinstance(item, str):  # a bare variant "algo=steer" names itself "steer"
            listed.append(Variant(_grid_name(override_key(item), item.split("=", 1)[1]), (item,)))
            continue
        if not isinstance(item, dict) or "name" not in item:
            raise UserError(
                f"ablation {name}: variant #{i + 1} needs a name and overrides, e.g. {{name: gated, overrides: [algo=stare]}}"
            )
        listed.append(
            Variant(
                str(item["name"]),
                tuple(str(o) for o in _as_list(item.get("overrides"))),
                kind=str(item.get("kind") or "train"),
                params=dict(item.get("params") or {}),
            )
        )
    grid = abl.get("grid")
    points: list[Variant] = []
    if grid:
        grid = OmegaConf.to_container(grid, resolve=True) if isinstance(grid, DictConfig) else dict(grid)
        keys = list(grid)
        values = [_as_list(grid[k]) for k in keys]
        for k, vals in zip(keys, values):
            if not vals:
                raise UserError(f"ablation {name}: grid key {k} has no values")
        for combo in itertools.product(*values):
            points.append(
                Variant(
                    ",".join(_grid_name(k, v) for k, v in zip(keys, combo)),
                    tuple(f"{k}={_fmt_value(v)}" for k, v in zip(keys, combo)),
                )
            )
    if listed and points:
        out = [Variant(f"{a.name},{b.name}", a.overrides + b.overrides, a.kind, a.params) for a in listed for b in points]
    else:
        out = listed or points
    if not out:
        raise UserError(f"ablation {name} has no variants: give it a `variants` list or a `grid`")
    seen: set[str] = set()
    for v in out:
        if not _SAFE_NAME.match(v.name.replace(",", "+")):
            raise UserError(
                f"ablation {name}: variant name '{v.name}' must be letters, digits, '.', '_', '-', '+' "
                f"(it names a folder and MLflow runs)"
            )
        if v.name in seen:
            raise UserError(f"ablation {name}: two variants are named '{v.name}'; names must be unique")
        seen.add(v.name)
    return out


def select_variants(variants: list[Variant], only: Iterable[str] | None, ablation: str) -> list[Variant]:
    if not only:
        return variants
    only = [str(o) for o in only]
    names = [v.name for v in variants]
    unknown = [o for o in only if o not in names]
    if unknown:
        raise UserError(f"ablation {ablation} has no variant '{unknown[0]}'; its variants: {', '.join(names)}")
    return [v for v in variants if v.name in only]


def job_dir(sweep_dir: Path, variant: str, seed: int) -> Path:
    return Path(sweep_dir) / "runs" / variant.replace(",", "+") / f"s{seed}"


def expand(
    ablation: DictConfig | dict,
    *,
    seeds: Iterable[int],
    sweep_dir: Path,
    budget: Iterable[str] = (),
    train_overrides: Iterable[str] = (),
    only: Iterable[str] | None = None,
    extra_overrides: Iterable[str] = (),
) -> list[JobSpec]:
    """Every (variant, seed) job of an ablation, in variant-major order.

    ``extra_overrides`` (e.g. the launcher's ``trainer.threads``) apply before the command line's
    ``train_overrides``, so the user can still override them.
    """
    abl = OmegaConf.create(ablation) if isinstance(ablation, dict) else ablation
    name = ablation_name(abl)
    seeds = [int(s) for s in _as_list(seeds)]
    if not seeds:
        raise UserError("seeds is empty: give at least one, e.g. seeds=[0]")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"seeds has duplicates: {seeds}")
    for o in list(train_overrides):
        if override_key(o) in JOB_OWNED_KEYS:
            raise UserError(f"'{o}' is set by the sweep for every job (use seeds=[...] / sweep_dir=...)")
    sweep_dir = Path(sweep_dir).resolve()
    jobs: list[JobSpec] = []
    chosen = select_variants(variants_of(abl), only, name)
    refuse_overrides_that_erase_variants(chosen, _as_list(train_overrides), name)
    for v in chosen:
        for seed in seeds:
            out = job_dir(sweep_dir, v.name, seed)
            overrides = merge_overrides(
                _as_list(budget),
                _as_list(abl.get("base")),
                v.overrides,
                _as_list(extra_overrides),
                _as_list(train_overrides),
                [f"trainer.seed={seed}", f"output_dir={out}", "trainer.resume=auto", "trainer.progress=false"],
            )
            extra = {} if v.kind == "train" else {"kind": v.kind, "params": dict(v.params)}
            jobs.append(
                JobSpec(key=f"{v.name}/s{seed}", variant=v.name, seed=seed, overrides=overrides, output_dir=str(out), extra=extra)
            )
    return jobs


def refuse_overrides_that_erase_variants(variants: list, train_overrides: list, ablation: str) -> None:
    """A command-line training override applies to every job after its variant's own overrides, so
    one that sets a key the variants set differently would make them train alike under their
    different names: a ``UserError`` naming the key and each variant's value. A key they all set
    the same way, or none sets, is the user's to change."""
    if len(variants) < 2:
        return
    for given in train_overrides:
        key = override_key(str(given))
        values = {v.name: next((o for o in reversed(v.overrides) if override_key(o) == key), None) for v in variants}
        if any(values.values()) and len(set(values.values())) > 1:
            shown = ", ".join(f"{name} {value or 'leaves it unset'}" for name, value in values.items())
            raise UserError(
                f"'{given}' would replace the setting that ablation={ablation}'s variants differ in ({shown}): "
                f"every job would train with it and the variants would no longer differ; drop it, or choose "
                f"the variants to run with variants=[...]"
            )


def training_variants(ablation_name: str) -> list[str]:
    """The names of ``conf/ablation/<ablation_name>.yaml``'s training variants (``kind: train``)."""
    return [v.name for v in variants_of(compose("sweep", [f"ablation={ablation_name}"]).ablation) if v.kind == "train"]


def default_variants(ablation_name: str) -> list[str]:
    """The ablation's ``default_variants`` (what a command runs unless told otherwise), else all its
    training variants."""
    listed = compose("sweep", [f"ablation={ablation_name}"]).ablation.get("default_variants")
    return [str(v) for v in listed] if listed else training_variants(ablation_name)
