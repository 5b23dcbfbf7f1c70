"""Pieces every command shares: the config-groups paragraph of the ``--help`` texts, and quiet
library logging for the commands that load a model.

Commands import from here, never from ``cli/main.py`` (which imports the commands), so the
command modules and the entry point do not import each other.
"""

from __future__ import annotations

from ..conf import config_groups, primary_defaults


def quiet_transformers() -> None:
    """transformers' progress bars and warnings off; called in the bodies of the commands that
    load a model, so that ``--help`` never imports transformers (and torch)."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def groups_help(config_name: str) -> str:
    """The config groups of a primary config and their options, for --help texts."""
    used = primary_defaults(config_name)
    lines = [f"  [bold]{g}[/bold]: {', '.join(opts)} (default {used[g]})" for g, opts in config_groups().items() if g in used]
    return "\n\n".join(lines)
