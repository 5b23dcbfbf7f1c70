"""``entropyrl lab``: grpo vs interventions on the default task, one seed, one entropy figure.

    entropyrl lab                                   # grpo, stare, steer; 200 steps each
    entropyrl lab --algos grpo,stare,steer,clip_cov trainer.total_steps=100
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        "lab",
        help="Train several algorithms on the embedded default (same seed, same prompts) and draw their "
             "entropy and accuracy curves in one PNG. Extra key=value overrides apply to every run.",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def lab(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides for every run"),
        algos: str = typer.Option("grpo,stare,steer", help="comma-separated algo= options"),
        out: Path = typer.Option(Path("outputs/lab"), help="folder for the runs and the figure"),
    ) -> None:
        from entropyrl.conf import compose
        from entropyrl.trainers.plots import plot_compare
        from entropyrl.trainers.tracking import read_metrics
        from entropyrl.trainers.trainer import train
        from rich.console import Console
        from rich.table import Table

        console = Console(stderr=True)
        names = [a.strip() for a in algos.split(",") if a.strip()]
        cfgs = {name: compose("train", [f"algo={name}", f"output_dir={out / name}", "tracking.experiment=lab",
                                        *(overrides or [])]) for name in names}  # validate all first
        curves, table = {}, Table(title="entropyrl lab")
        for col in ("algo", "entropy first 10%", "entropy last 10%", "min entropy", "final val acc"):
            table.add_column(col)
        results = {}
        for name, cfg in cfgs.items():
            console.print(f"[bold]lab[/bold]: training algo={name}")
            summary = train(cfg, log=lambda msg: console.print(f"[dim]{msg}[/dim]"))
            curves[name] = read_metrics(Path(cfg.output_dir))
            results[name] = summary
            table.add_row(name, *(f"{summary.get(k, float('nan')):.3f}" for k in
                                  ("entropy/first_tenth", "entropy/last_tenth", "entropy/min", "final/val/acc")))
        out.mkdir(parents=True, exist_ok=True)
        plot_compare(curves, "entropy", out / "lab-entropy.png", ylabel="policy entropy (nats/token)",
                     title=f"entropy on {cfgs[names[0]].data.name}, seed {cfgs[names[0]].trainer.seed}")
        plot_compare(curves, "val/acc", out / "lab-val-acc.png", ylabel="validation accuracy")
        (out / "lab-summary.json").write_text(json.dumps(results, indent=2))
        console.print(table)
        console.print(f"figures: {out / 'lab-entropy.png'}, {out / 'lab-val-acc.png'}")
