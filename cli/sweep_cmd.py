"""``entropyrl sweep|report|status``: ablation sweeps on this machine or SLURM, their reports and
their jobs' states."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.console import Console

from ..conf import compose
from ..core.errors import UserError
from .common import groups_help, live_line, stop_signals

__all__ = ["register"]


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *[fmt(r) for r in rows]])


def _sweep_help() -> str:
    """``entropyrl sweep``'s help, its config groups listed from the shipped configs."""
    return (
        "Run an ablation: every variant x every seed as one training job, on this machine or "
        "SLURM, each an MLflow child run of one parent run; then a comparison report.\n\n"
        "[cyan]entropyrl sweep ablation=gate --dry-run[/cyan]\n\n"
        "[cyan]entropyrl sweep ablation=gate seeds=[0,1] launcher=slurm launcher.partition=gpu "
        "train.trainer.total_steps=200[/cyan]\n\n"
        "Overrides configure the sweep (ablation, launcher, tracking, seeds, variants, budget, "
        "sweep_dir, report.*); training keys ([bold]trainer.total_steps=20[/bold], or "
        "[bold]train.trainer.total_steps=20[/bold]) go to every job's training config. Re-running with the same sweep_dir (or --resume: the latest sweep of that "
        "ablation) runs only what did not finish. Exit status 1 if a job failed.\n\n"
        "Config groups:\n\n" + groups_help("sweep")
    )


def _print_dry_run(cfg, plan) -> None:
    """``--dry-run``: the sweep's size and folder, then its job table, on stdout."""
    rows = plan.rows()
    typer.echo(
        f"ablation {cfg.ablation.name}: {len(rows)} jobs "
        f"({len({r['variant'] for r in rows})} variants x {len({r['seed'] for r in rows})} seeds) "
        f"-> {plan.sweep_dir}"
    )
    typer.echo(
        _table(
            [[r["variant"], r["seed"], r["state"], " ".join(r["overrides"]), r["output_dir"]] for r in rows],
            ["variant", "seed", "state", "overrides", "output_dir"],
        )
    )


def _run_until_stopped(run: Callable[..., dict], plan, cfg, console: Console, wait: bool) -> dict:
    """``run`` (``sweeps.following.run``, passed in by the command, which imports it when it runs)
    the plan's jobs with SIGINT and SIGTERM set to stop them; a stopped sweep prints how to continue
    it and exits 128 + the signal's number. The previous handlers are restored either way."""
    with stop_signals() as stopped_by:  # a repeat arriving while the jobs are being stopped is ignored
        try:
            with live_line(console) as progress:
                return run(plan, wait=wait, log=lambda m: console.print(m, markup=False, soft_wrap=True), progress=progress)
        except KeyboardInterrupt:
            sig = stopped_by[0] if stopped_by else signal.SIGINT
            console.print(
                f"stopped by {signal.Signals(sig).name}; to continue: entropyrl sweep "
                f"ablation={cfg.ablation.name} --resume sweep_dir={plan.sweep_dir}",
                soft_wrap=True,
                markup=False,
            )
            raise SystemExit(128 + int(sig)) from None


def _print_outcome(console: Console, result: dict, wait: bool) -> None:
    """The sweep's counts, each failed job with its log, then the report (or, ``--no-wait``, how to
    follow the jobs and build it); exit status 1 when a job failed."""
    c = result["counts"]
    console.print(
        f"[bold]sweep {result['sweep_id']}[/bold]: {c['done']} done, {c['failed']} failed, "
        f"{c['running'] + c['pending']} not finished; folder {result['sweep_dir']}",
        soft_wrap=True,
    )
    for st in result["failed"]:
        console.print(f"[red]failed[/red] {st.key}: {st.detail}\n  log: {st.log}", soft_wrap=True)
    if result["report"]:
        console.print(f"report: {result['report']}", soft_wrap=True)
    elif not wait:
        console.print(
            f"submitted; follow with `entropyrl status {result['sweep_dir']}` and build the report "
            f"with `entropyrl report {result['sweep_dir']}` once the jobs end",
            soft_wrap=True,
        )
    if c["failed"]:
        raise typer.Exit(1)


def _print_report(rep: dict) -> None:
    """Where the rebuilt report is, with the jobs' counts and its number of plots."""
    c = rep["counts"]
    typer.echo(
        f"report: {rep['report']} ({c['done']} done, {c['failed']} failed, "
        f"{c['running'] + c['pending']} not finished; {len(rep['plots'])} plots)"
    )


def _print_status(sweep: dict, statuses: list, ended: list, counts: dict) -> None:
    """The MLflow runs of lost jobs just ended, the sweep's counts by state, then its job table."""
    launcher = sweep.get("launcher", {}).get("name", "?")
    for run_id in ended:
        typer.echo(f"ended MLflow run {run_id} FAILED: its job's process died without reporting")
    typer.echo(
        f"sweep {sweep.get('sweep_id')} ({sweep.get('ablation', {}).get('name')}, launcher {launcher}): "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
    )
    typer.echo(
        _table(
            [[s.key, s.state, s.detail, s.scheduler_job_id or "-", s.log] for s in statuses],
            ["job", "state", "detail", "job id", "log"],
        )
    )


REPORT_HELP = (
    "Rebuild a sweep's comparison report (report.md, CSVs, plots/*.png) from its "
    "jobs' metrics and log it to the sweep's MLflow parent run. "
    "[cyan]entropyrl report outputs/sweeps/gate-20260101-120000[/cyan]"
)
STATUS_HELP = (
    "Each job of a sweep: pending/running/done/failed (from the sweep folder and "
    "SLURM's queue), progress and log path. "
    "[cyan]entropyrl status outputs/sweeps/gate-20260101-120000[/cyan]"
)
EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}  # key=value overrides after the options


def register(app: typer.Typer) -> None:
    @app.command("sweep", help=_sweep_help(), context_settings=EXTRA_ARGS)
    def sweep(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value sweep overrides; train.KEY=VALUE for jobs"),
        dry_run: bool = typer.Option(False, "--dry-run", help="print the job table and exit; runs nothing"),
        resume: bool = typer.Option(
            False, "--resume", help="continue the latest sweep of this ablation (or sweep_dir=...): run only unfinished jobs"
        ),
        wait: bool = typer.Option(
            True, "--wait/--no-wait", help="follow the jobs and build the report (--no-wait: submit to SLURM and return)"
        ),
    ) -> None:
        from ..sweeps import following, planning  # the sweep machinery (and torch) load when it runs
        from ..sweeps.planning import split_overrides

        console = Console(stderr=True, highlight=False)
        sweep_ov, train_ov = split_overrides(list(overrides or []))
        cfg = compose("sweep", sweep_ov)
        explicit_dir = any(o.lstrip("+").startswith("sweep_dir=") for o in sweep_ov)
        if resume:  # --resume alone: the sweep's own saved overrides, seeds and budget
            sweep_ov, train_ov = planning.resume_overrides(
                cfg, sweep_ov, train_ov, explicit_dir=explicit_dir, log=lambda m: console.print(m, markup=False, soft_wrap=True)
            )
            cfg = compose("sweep", sweep_ov)
        plan = planning.plan(cfg, train_ov, explicit_dir=explicit_dir, resume=resume)
        if dry_run:
            _print_dry_run(cfg, plan)
            return
        if not wait and not plan.launcher.detached:
            raise UserError(
                f"--no-wait needs a launcher whose jobs outlive this process, e.g. launcher=slurm "
                f"(launcher={cfg.launcher.name} jobs run under this process)"
            )
        result = _run_until_stopped(following.run, plan, cfg, console, wait)
        _print_outcome(console, result, wait)

    @app.command("report", help=REPORT_HELP)
    def report(
        sweep_dir: Path = typer.Argument(..., help="the sweep folder (holds sweep.json)"),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="also log the report to the parent run"),
        docs: Optional[Path] = typer.Option(
            None,
            "--docs",
            help="also write the report into this docs page, between "
            "its <!-- report:begin --> and <!-- report:end --> "
            "lines (e.g. docs/lab.md), figures beside it",
        ),
        step: Optional[str] = typer.Option(
            None,
            "--step",
            help="run this report step (e.g. lab_staleness) instead of the one the sweep's ablation names: "
            "for a sweep started before its ablation named one",
        ),
    ) -> None:
        from ..sweeps.report import build_report, publish_report

        _print_report(build_report(sweep_dir, log_mlflow=mlflow, log=lambda m: typer.echo(m, err=True), report_step=step))
        if docs is not None:
            typer.echo(f"docs: {publish_report(sweep_dir, docs)}")

    @app.command("status", help=STATUS_HELP)
    def status(
        sweep_dir: Path = typer.Argument(..., help="the sweep folder (holds sweep.json)"),
        as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    ) -> None:
        from ..sweeps.state import close_lost_runs, count_states, sweep_status

        sweep, statuses = sweep_status(sweep_dir)
        ended = close_lost_runs(statuses)  # a lost job's MLflow run: FAILED, not RUNNING forever
        if as_json:
            typer.echo(json.dumps([dataclasses.asdict(s) for s in statuses], indent=2))
            return
        _print_status(sweep, statuses, ended, count_states(statuses))
