"""``entropyrl config show [overrides...]``: print the composed config a command would run with."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..conf import compose, config_groups, to_yaml, used_settings
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
    ) -> None:
        from omegaconf import OmegaConf

        cfg = compose(for_, overrides or [])
        if all_:
            typer.echo(to_yaml(cfg), nl=False)
            return
        plain, hidden = used_settings(cfg)
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
