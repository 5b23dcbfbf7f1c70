"""The ``entropyrl`` entry point. The two first help screens are answered at once (``quick_help``);
everything else goes to the Typer app (``cli/app.py``), imported only then.

Every command takes Hydra overrides as trailing ``key=value`` arguments. User mistakes print one
``error: ...`` line and exit 2.
"""

from __future__ import annotations

import sys

from .quick_help import quick_help


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    text = quick_help(args)
    if text is not None:
        sys.stdout.write(text)
        return
    from .app import run  # Typer, Rich and the commands' option declarations

    run(args)


if __name__ == "__main__":
    main()
