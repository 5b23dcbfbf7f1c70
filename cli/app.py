"""The ``entropyrl`` Typer app: thin commands over the library (``cli/main.py`` is the entry point).

Every command takes Hydra overrides as trailing ``key=value`` arguments, composed with the
configs shipped in ``entropyrl/conf``. User mistakes print one ``error: ...`` line and exit 2.
"""

from __future__ import annotations

import os

import typer

from ..core.errors import UserError
from . import config_cmd, eval_cmd, grade_cmd, lab_cmd, plan_cmd, sweep_cmd, train_cmd
from .quick_help import DESCRIPTION

app = typer.Typer(
    name="entropyrl",
    help=DESCRIPTION,
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _quiet_libraries() -> None:
    """Environment and loggers only: importing transformers here would make ``--help`` wait for
    torch (the commands that load a model call ``common.quiet_transformers``)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging

    for name in ("mlflow", "alembic", "httpx", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _register_commands() -> None:
    for module in (train_cmd, eval_cmd, grade_cmd, sweep_cmd, lab_cmd, config_cmd, plan_cmd):
        module.register(app)


_register_commands()


def run(args: list[str]) -> None:
    """Run the command line ``args`` (without the program name)."""
    _quiet_libraries()
    try:
        app(args=args, standalone_mode=True)
    except UserError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise SystemExit(2) from None
