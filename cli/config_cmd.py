"""``entropyrl config show [overrides...]``: print the composed config a command would run with."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..conf import compose, config_groups, to_yaml
from .common import groups_help


def register(app: typer.Typer) -> None:

    config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)
    app.add_typer(config_app, name="config")

    @config_app.command(
        "show",
        help="Print the composed config (YAML). [cyan]entropyrl config show algo=stare[/cyan]; "
             "[cyan]entropyrl config show --for eval[/cyan].\n\nConfig groups of train:\n\n" + groups_help("train"),
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def show(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value config overrides"),
        for_: str = typer.Option("train", "--for", help="which command's config: train, eval or sweep"),
    ) -> None:

        typer.echo(to_yaml(compose(for_, overrides or [])), nl=False)

    @config_app.command("groups", help="List every config group and its options.")
    def groups() -> None:

        for group, options in config_groups().items():
            typer.echo(f"{group}: {', '.join(options)}")
