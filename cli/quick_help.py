"""The two help screens a newcomer asks for first, answered without importing Typer, Rich, Hydra
or OmegaConf: ``entropyrl`` / ``entropyrl --help`` (the commands) and ``entropyrl train --help``
(the training overrides and the config groups, read from the conf folder's file names). Every other
``--help`` is Typer's (``cli/app.py``); ``tests/cli/test_cli.py`` checks that both list the same commands.
"""

from __future__ import annotations

from ..conf import config_groups, primary_defaults

DESCRIPTION = (
    "RLVR experiments around policy entropy collapse: train (GRPO, DAPO, STARE, STEER, Clip-Cov, "
    "KL-Cov, ...), evaluate on math benchmarks, sweep ablations on SLURM, everything in MLflow."
)

#: command -> one line; the Typer app registers the same names (cli/app.py)
COMMANDS = {
    "train": "Train a policy with RLVR (GRPO and the entropy methods); key=value overrides.",
    "eval": "Evaluate a model on math and code benchmarks: avg@n, pass@k, maj@n.",
    "grade": "Grade a JSON-lines file of model responses against their answers.",
    "plan": "What one training step costs, offline: parameters, FLOPs, memory, step time; fits or not per GPU.",
    "sweep": "Run an ablation: every variant x every seed, on this machine or on SLURM.",
    "report": "Rebuild a sweep's comparison report from its folder.",
    "status": "Each job of a sweep: pending, running, done or failed.",
    "lab": "GRPO against the entropy interventions on the lab task, over seeds, with a claim table.",
    "config": "Inspect configs: show the composed config, list the config groups.",
}

TRAIN = (
    "Train a policy with RLVR. With no arguments: the embedded tiny model on the built-in tasks, on "
    "CPU, in minutes (GRPO; watch its entropy collapse). Overrides are Hydra key=value arguments, "
    "e.g. entropyrl train algo=stare trainer.total_steps=40."
)


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    lines, line = [], indent
    for word in text.split():
        if len(line) + len(word) + 1 > width and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += word + " "
    if line.strip():
        lines.append(line.rstrip())
    return lines


def top_level() -> str:
    out = [
        "Usage: entropyrl [OPTIONS] COMMAND [ARGS]...",
        "",
        *_wrap(DESCRIPTION, "  "),
        "",
        "Options:",
        "  --help  Show this message and exit.",
        "",
        "Commands:",
    ]
    width = max(map(len, COMMANDS))
    out += [f"  {name.ljust(width)}  {summary}" for name, summary in COMMANDS.items()]
    out += ["", "Run 'entropyrl COMMAND --help' for a command's arguments and options."]
    return "\n".join(out) + "\n"


def train_help() -> str:
    used = primary_defaults("train")
    out = ["Usage: entropyrl train [OVERRIDES]...", "", *_wrap(TRAIN, "  "), "", "  Config groups:", ""]
    for group, options in config_groups().items():
        if group in used:
            out += _wrap(f"{group}: {', '.join(options)} (default {used[group]})", "    ")
    out += [
        "",
        "Arguments:",
        "  [OVERRIDES]...  key=value config overrides",
        "",
        "Options:",
        "  --help  Show this message and exit.",
    ]
    return "\n".join(out) + "\n"


def quick_help(args: list[str]) -> str | None:
    """The help text for ``args`` when it is one of the two quick screens, else None."""
    if args in ([], ["--help"], ["-h"]):
        return top_level()
    if args == ["train", "--help"]:
        return train_help()
    return None
