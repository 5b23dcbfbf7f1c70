"""``entropyrl eval BENCH... [key=value...]``: sample, grade and score math benchmarks."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..conf import compose
from .common import exit_stopped, groups_help, quiet_transformers, stop_signals


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """Benchmark names / data files on one side, ``key=value`` (and ``~key``) overrides on the other."""
    names = [a for a in args if "=" not in a and not a.startswith("~")]
    overrides = [a for a in args if a not in names]
    return names, overrides


def register(app: typer.Typer) -> None:
    @app.command(
        "eval",
        help="Evaluate a model on math benchmarks: avg@n, pass@k (k=1,2,4,..<=n) and maj@n per benchmark "
        "and on average; samples.jsonl + summary.json in output_dir; an MLflow run.\n\n"
        "Benchmarks: aime24 aime25 amc23 math500 minerva olympiadbench gsm8k, [bold]all[/bold], code "
        "benchmarks humaneval mbpp livecodebench (run in the code sandbox; pass@1,5,10), or a "
        ".jsonl/.json/.parquet file (verl layout too). Each has its reference sample count (avg@32 "
        "for AIME/AMC, avg@4 otherwise) and decoding (temperature 1.0, top-p 1.0).\n\n"
        "[cyan]entropyrl eval aime24 math500 model.path=Qwen/Qwen2.5-Math-7B eval.backend=vllm[/cyan]\n\n"
        "[cyan]entropyrl eval aime24 eval.n_samples=4 eval.limit=10[/cyan]\n\n"
        "Data: the benchmark files packaged with entropyrl; eval.data_root=DIR or $ENTROPYRL_DATA "
        "reads them from DIR instead, eval.data_root=hub from the Hugging Face hub.\n\n"
        "Config groups:\n\n" + groups_help("eval"),
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def eval_(
        args: Optional[List[str]] = typer.Argument(None, help="benchmark names or data files, then key=value config overrides"),
    ) -> None:
        from omegaconf import open_dict
        from rich.console import Console

        from ..evals.runner import reflection_lines, render_table, run_eval  # torch and transformers load when it runs

        quiet_transformers()
        names, overrides = split_args(list(args or []))
        cfg = compose("eval", overrides)
        if names:
            with open_dict(cfg):
                cfg.benchmarks = list(cfg.get("benchmarks") or []) + names
        err = Console(stderr=True, soft_wrap=True)
        with stop_signals() as stopped_by:  # SIGINT and SIGTERM end an eval alike: its folder cleaned, one line
            try:
                summary = run_eval(cfg, console=err)
            except KeyboardInterrupt:
                exit_stopped(err, stopped_by)
        Console().print(render_table(summary["benchmarks"], title=f"entropyrl eval: {summary['model']}"))
        for line in reflection_lines(summary["benchmarks"]):  # eval.reflection_words; [] = none
            Console(soft_wrap=True).print(f"reflection {line}", highlight=False)
        err.print(
            f"[green]done[/green] in {summary['seconds']:.1f} s: samples and summary in "
            f"{summary['output_dir']}"
            + (f" (MLflow run {summary['mlflow_run_id']} at {summary['tracking_uri']})" if summary.get("mlflow_run_id") else "")
        )
