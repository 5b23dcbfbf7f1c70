"""``entropyrl config show [overrides...]``: print the composed config a command would run with;
``--doc``: one line per key with its value, what is allowed and its doc."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, List, Optional

import typer

from ..conf import compose, config_groups, to_yaml, used_settings
from ..conf.key_docs import composition_choices, doc_for, key_docs
from ..core.validation import rule_for
from .common import groups_help


def register(app: typer.Typer) -> None:
    config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)
    app.add_typer(config_app, name="config")

    @config_app.command(
        "show",
        help="Print the composed config (YAML): the settings this run uses (interventions it does not apply are "
        "left out; --all prints them too). [cyan]entropyrl config show algo=stare[/cyan]; "
        "[cyan]entropyrl config show --for eval[/cyan].\n\nConfig groups of train:\n\n" + groups_help("train"),
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def show(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value config overrides"),
        for_: str = typer.Option("train", "--for", help="which command's config: train, eval or sweep"),
        all_: bool = typer.Option(False, "--all", help="also the settings of interventions the run does not apply"),
        doc: bool = typer.Option(
            False,
            "--doc",
            help="one line per key: its value, what is allowed and its doc (the YAML comment where it is declared)",
        ),
    ) -> None:
        from omegaconf import OmegaConf

        overrides, job_overrides = list(overrides or []), []
        if for_ == "sweep":  # the sweep's own command line: training keys go to every job, as `entropyrl sweep` reads them
            from ..sweeps.planning import split_overrides

            overrides, job_overrides = split_overrides(overrides)
            if job_overrides:
                compose("train", job_overrides)  # a bad training key is refused here as the sweep refuses it
        cfg = compose(for_, overrides)
        if job_overrides:
            typer.echo(f"# every job's training overrides (after its variant's): {' '.join(job_overrides)}")
        if all_ and not doc:
            typer.echo(to_yaml(cfg), nl=False)
            return
        plain, hidden = used_settings(cfg)
        if all_:
            plain, hidden = OmegaConf.to_container(cfg, resolve=True), []
        if doc:
            algo_tables = None
            if for_ == "train":  # the algorithm's and interventions' own rules (these import torch)
                from ..trainers.algos.algo_config import ALGO_KEYS
                from ..trainers.algos.core_algos import ADVANTAGE_ESTIMATORS
                from ..trainers.algos.loss_agg import LOSS_AGGREGATIONS
                from ..trainers.algos.objectives import POLICY_OBJECTIVES
                from ..trainers.interventions import INTERVENTIONS

                named = {"advantage": ADVANTAGE_ESTIMATORS, "loss_agg": LOSS_AGGREGATIONS, "objective": POLICY_OBJECTIVES}
                algo_tables = AlgoTables(keys=ALGO_KEYS, named=named, interventions=INTERVENTIONS)
            docs = key_docs(for_, composition_choices(for_, overrides or []))
            for line in doc_lines(for_, plain, docs, algo_tables):
                typer.echo(line)
        else:
            typer.echo(OmegaConf.to_yaml(OmegaConf.create(plain)), nl=False)
        if hidden:
            typer.echo(
                f"# {len(hidden)} interventions this run does not apply are not shown "
                f"({', '.join(hidden)}): --all shows their settings"
            )

    @config_app.command("groups", help="List every config group and its options.")
    def groups() -> None:
        for group, options in config_groups().items():
            typer.echo(f"{group}: {', '.join(options)}")


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(dotted key, value)]`` of every leaf of a plain config (a list or an empty mapping is a leaf)."""
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [(prefix[:-1], node)]


def _shown(value: Any) -> str:
    """A value as it is written in an override: strings bare, the rest as JSON (null, true, [1, 2])."""
    if isinstance(value, str):
        return value if value.strip() else repr(value)
    return json.dumps(value)


_TYPE_NOUNS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


@dataclasses.dataclass(frozen=True)
class AlgoTables:
    """What ``algo.*`` keys may be, declared beside the algorithm: ``keys`` its own rules
    (``ALGO_KEYS``), ``named`` the registries a name key is looked up in, ``interventions`` the
    intervention classes (their ``Params``)."""

    keys: dict
    named: dict
    interventions: dict


def _algo_allowed(rest: str, tables: AlgoTables) -> str:
    """What ``algo.<rest>`` may be: its ``ALGO_KEYS`` rule, the registry its name is looked up in, or
    its intervention's ``Params`` field type and the module whose ``Params.validate`` checks its range."""
    if rest in tables.keys:
        return tables.keys[rest].allowed()
    if rest in tables.named:
        return "one of " + ", ".join(sorted(tables.named[rest]))
    if rest == "interventions":
        return "a list of interventions, applied in order: " + ", ".join(sorted(tables.interventions))
    if rest == "objective_args" or rest.startswith("objective_args."):
        return "what the objective accepts (trainers/algos/objectives.py)"
    if rest == "name":
        return "a non-empty string"
    head, _, field = rest.partition(".")
    if head not in tables.interventions or not field:
        return ""
    intervention = tables.interventions[head]
    try:
        hints = typing.get_type_hints(intervention.Params)
    except Exception:  # an annotation that does not resolve (a plugin's): no type to name
        hints = {}
    noun = _TYPE_NOUNS.get(hints.get(field.split(".")[0]), "a value")
    where = intervention.__module__.split(".", 1)[-1].replace(".", "/") + ".py"
    return f"{noun}, range checked in {where}"


def doc_lines(config_name: str, plain: dict, docs: dict[str, str], algo_tables: AlgoTables | None = None) -> list[str]:
    """``key: value  [allowed]  # doc``, one line per leaf of ``plain`` (a composed ``config_name``
    config as a plain dict): the allowed values from the key's rule (``core/validation.py``, or the
    algorithm's and interventions' own for ``algo.*``, from ``algo_tables``), the doc from ``docs``
    (``conf/key_docs.key_docs``; a key inside a free-form mapping takes its parent's)."""
    lines = []
    for key, value in _leaves(plain):
        rule = rule_for(config_name, key)
        if rule is not None:
            allowed = rule.allowed()
        elif algo_tables is not None and key.startswith("algo."):
            allowed = _algo_allowed(key[len("algo.") :], algo_tables)
        else:
            allowed = ""
        text = doc_for(key, docs) or ("(no comment where declared)" if key in docs else "(declared in no shipped YAML)")
        lines.append(f"{key}: {_shown(value)}  [{allowed or 'no rule'}]  # {text}")
    return lines
