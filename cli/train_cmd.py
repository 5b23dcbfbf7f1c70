"""``entropyrl train [overrides...]``: one training run."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..conf import compose
from .common import groups_help, quiet_transformers


def register(app: typer.Typer) -> None:
    @app.command(
        "train",
        help="Train a policy with RLVR. With no arguments: the embedded tiny model on the built-in "
        "tasks, on CPU, in minutes (GRPO; watch its entropy collapse).\n\n"
        "Overrides are Hydra [bold]key=value[/bold] arguments, e.g. "
        "[cyan]entropyrl train algo=stare trainer.total_steps=40[/cyan].\n\n"
        "Config groups:\n\n" + groups_help("train"),
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def train(overrides: Optional[List[str]] = typer.Argument(None, help="key=value config overrides")) -> None:
        from rich.console import Console

        from ..core.gc_pause import paused_gc

        with paused_gc():  # start-up: thousands of modules imported, nothing for the cycle collector to free
            # the implementation (torch, transformers, MLflow) loads when the command runs, not for --help
            from ..trainers.parallel.distributed import launcher_env
            from ..trainers.preflight import check_training
            from ..trainers.run.run_dir import run_lock
            from ..trainers.run.run_report import validation_text
            from ..trainers.run.stop_signals import RunInterrupted, setup_stopped_message
            from ..trainers.trainer import train as run_training

            quiet_transformers()
            main_rank = launcher_env()["rank"] == 0  # under torchrun/srun only rank 0 talks
            console = Console(stderr=True, quiet=not main_rank)
            cfg = compose("train", overrides or [])  # launcher=... is an error here (conf.OWNED_ELSEWHERE)

            lock = run_lock(cfg)
            if hasattr(lock, "check_free"):
                lock.check_free()  # another process writes there: say who, before anything
            # algorithm, interventions, optimizer names and the output folder, once, before anything is printed
            checked = check_training(cfg)

        console.print(
            f"[bold]entropyrl train[/bold] algo={cfg.algo.name} model={cfg.model.name} "
            f"data={cfg.data.name} steps={cfg.trainer.total_steps} -> {cfg.output_dir}"
        )
        try:
            summary = run_training(
                cfg,
                checked=checked,
                log=lambda msg: console.print(msg, style="dim", markup=False, highlight=False, soft_wrap=True),
            )
        except RunInterrupted as stopped:  # the trainer said where it stopped and how to resume
            if getattr(stopped, "during_setup", False):  # before the first step: this says it
                console.print(setup_stopped_message(stopped, cfg.output_dir), markup=False, highlight=False, soft_wrap=True)
            raise SystemExit(stopped.exit_code) from None
        console.print(
            f"[green]done[/green]: {summary.get('steps')} steps, "
            f"entropy {summary.get('entropy/first_tenth', float('nan')):.3f} -> "
            f"{summary.get('entropy/last_tenth', float('nan')):.3f}, "
            f"{validation_text(summary)}; "
            f"results in {summary['output_dir']}"
            + (f" (MLflow run {summary['mlflow_run_id']} at {summary['tracking_uri']})" if summary.get("mlflow_run_id") else "")
        )
