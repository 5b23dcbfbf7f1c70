"""``entropyrl lab``: the interventions against GRPO on the lab task, over seeds, with a claim table.

    entropyrl lab                                        # every lab variant x seeds 0,1,2 + quadrant experiment
    entropyrl lab --algos grpo,stare --seeds 0,1         # a subset
    entropyrl lab --algos all                            # also the newer methods (ce_gppo, gspo, ...)
    entropyrl lab --experiment quadrants --seeds 0       # only the quadrant sign experiment
    entropyrl lab --experiment tools                     # the tool study: grpo, stare, steer with a code interpreter
    entropyrl lab --experiment staleness --jobs 1        # the staleness study: 17 variants (k, corrections, methods)
    entropyrl lab --experiment real_model --seeds 0,1,2  # the real-model study: SmolLM2-135M, 4 methods, 80 steps
    entropyrl lab trainer.total_steps=40                 # overrides apply to every run

The lab is the ablation ``conf/ablation/lab.yaml`` run by the sweep machinery, exactly like
``entropyrl sweep ablation=lab``: each (variant, seed) is a job of the local launcher (``--jobs`` at a
time, one torch thread each) in ``<out>/runs/<variant>/s<seed>/``, the quadrant sign experiment one
job per seed, ``<out>/sweep.json`` the plan (``entropyrl status <out>`` shows the jobs), one MLflow
parent run (experiment ``lab``) with the runs as its children. Re-running on the same ``--out`` (or
``--resume``) runs only what did not finish. The lab's report step (sweeps/lab/sweep_step.py) then
writes ``report.md``, ``lab.json`` (the claim table) and the figures; ``entropyrl report <out>``
rebuilds them from the files.

``--experiment <study>`` runs another of the lab's studies (sweeps/studies.py: ``tools``, the
tool study; ``staleness``, the staleness study; ``real_model``, the real-model study), each its own
ablation (``conf/ablation/<ablation>.yaml``, no quadrant experiment) with its own report step, default
``--out`` and default ``--jobs``; ``--algos`` names its variants. ``entropyrl lab --help`` lists them,
built from the studies' declarations. The real-model study needs the model's package (``make
install-smollm2``): without it the command stops with one ``error:`` line before anything is planned.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, List, Optional

import typer
from typer.core import TyperCommand

from ..conf import compose
from ..core.errors import UserError
from ..sweeps.plugins import load_installed_plugins
from ..sweeps.studies import DEFAULT_JOBS, STUDIES, Study, study_for
from .common import exit_stopped, live_line, stop_signals

QUADRANTS = "quadrants"  # the lab ablation's quadrant-experiment variant (--experiment all and quadrants run it)
DEFAULT_EXPERIMENT = "all"  # --experiment when left out: the lab's training runs and its quadrant experiment
QUADRANT_BATCHES = 20  # --quadrant-batches when left out


def experiments() -> tuple[str, ...]:
    """Every ``--experiment`` value, study by study in their registration order."""
    return tuple(e for study in STUDIES.values() for e in study.experiments)


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, e.g. 0,1,2; got '{text}'") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds needs distinct integers, e.g. 0,1,2; got '{text}'")
    return seeds


def lab_sweep_overrides(
    variants: list[str], seeds: list[int], out: Path, jobs: int, quadrant_batches: int, ablation: str = "lab"
) -> list[str]:
    """The ``entropyrl sweep`` overrides that make the lab: the study's ablation (``lab``, or another
    study's: ``lab_tools``, ``staleness``, ``real_model``), its variants and seeds, the folder, the local
    launcher at ``jobs`` in parallel with one torch thread each, MLflow experiment named as the ablation
    (and the lab's quadrant batches)."""
    return [
        f"ablation={ablation}",
        f"variants=[{','.join(variants)}]",
        f"seeds=[{','.join(map(str, seeds))}]",
        f"sweep_dir={out}",
        "launcher=local",
        f"launcher.max_parallel={jobs}",
        "launcher.threads_per_job=1",
        f"tracking.experiment={ablation}",
        *([f"ablation.quadrant_batches={quadrant_batches}"] if ablation == "lab" else []),
    ]


def _default_study() -> Study:
    """The study ``entropyrl lab`` runs when ``--experiment`` is left out (the lab)."""
    study = study_for(DEFAULT_EXPERIMENT)
    assert study is not None, f"no study runs --experiment {DEFAULT_EXPERIMENT}"
    return study


def _other_studies() -> list[Study]:
    return [s for s in STUDIES.values() if s is not _default_study()]


def lab_help() -> str:
    """The command's help: the lab's paragraph, then each other study's, from their declarations."""
    paragraphs = [_default_study().help, *(f"--experiment {s.experiments[0]}: {s.help}" for s in _other_studies())]
    return " ".join([*paragraphs, "Extra key=value overrides apply to every run."])


def _algos_help() -> str:
    named = "; ".join(
        [_default_study().variants_help, *(f"with --experiment {s.experiments[0]}: {s.variants_help}" for s in _other_studies())]
    )
    return (
        f"comma-separated lab variants ({named}), 'default' (the ablation's default_variants) or 'all' (every training variant)"
    )


def _experiment_help() -> str:
    return " | ".join(
        s.choices_help or f"{s.experiments[0]} ({s.title}: ablation={s.ablation}, default out {s.default_out})"
        for s in STUDIES.values()
    )


def _jobs_help() -> str:
    own = "".join(
        f"; {s.experiments[0]}: {s.default_jobs}, {s.jobs_help}" for s in STUDIES.values() if s.default_jobs != DEFAULT_JOBS
    )
    return f"runs in parallel (one torch thread each; default {DEFAULT_JOBS}{own})"


def _out_help() -> str:
    others = "".join(f"; {s.experiments[0]}: {s.default_out}" for s in _other_studies())
    return f"folder for the runs, the report and the figures (default {_default_study().default_out}{others})"


def _study_and_jobs(experiment: str, jobs: int | None, quadrant_batches: int | None, algos: str) -> tuple[Study, int, int]:
    """The study ``--experiment`` names, the runs in parallel (its default when ``--jobs`` is left
    out) and the quadrant experiment's batches, once ``--experiment``, ``--jobs`` and
    ``--quadrant-batches`` are known to be valid; an option the experiment does not read is refused
    (``--quadrant-batches`` beside no quadrant experiment, ``--algos`` beside quadrants alone)."""
    study = study_for(experiment)
    if study is None:
        raise UserError(f"--experiment must be one of {', '.join(experiments())}; got '{experiment}'")
    jobs = study.default_jobs if jobs is None else jobs
    if jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    if quadrant_batches is not None and experiment not in (DEFAULT_EXPERIMENT, QUADRANTS):
        raise UserError(
            f"--quadrant-batches sets the quadrant sign experiment, which --experiment {experiment} does not run: "
            f"drop it, or use --experiment {QUADRANTS}"
        )
    if experiment == QUADRANTS and algos.strip() != "default":
        raise UserError(f"--experiment {QUADRANTS} trains no variants, so --algos {algos} would do nothing: drop it")
    batches = QUADRANT_BATCHES if quadrant_batches is None else quadrant_batches
    if batches < 1:
        raise UserError(f"--quadrant-batches must be >= 1, got {batches}")
    return study, jobs, batches


def _variant_names(algos: str, experiment: str, study: Study, valid: list[str], defaults: Callable[[], list[str]]) -> list[str]:
    """The training variants ``--algos`` names (``all``: ``valid``, ``default``: what ``defaults()``
    returns, or a comma-separated list; none for ``--experiment quadrants``), each checked against
    ``valid``, the study's ablation's."""
    asked = algos.strip()
    if asked == "all":
        algos = ",".join(valid)
    elif asked == "default":
        algos = ",".join(defaults())
    names = [a.strip() for a in algos.split(",") if a.strip()] if experiment != QUADRANTS else []
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise UserError(f"unknown {study.variant_kind} '{unknown[0]}'; valid: {', '.join(valid)}")
    return names


def _command_line(algos: str, seeds: str, experiment: str, overrides: list[str]) -> str:
    """The ``entropyrl lab`` command line the plan records: the options left at their default left out."""
    asked = algos.strip()
    command = " ".join(
        [
            "entropyrl lab",
            f"--algos {asked}" if asked != "default" else "",
            f"--seeds {seeds}",
            f"--experiment {experiment}" if experiment != DEFAULT_EXPERIMENT else "",
            *overrides,
        ]
    ).strip()
    return " ".join(command.split())


def _print_outcome(console, say, result: dict, out: Path) -> None:
    """One line per claim of the report step (reproduced, not reproduced, not run or descriptive),
    where the report, the claim table and the jobs are; a ``UserError`` naming the runs that failed."""
    step = (result.get("report_data") or {}).get("step") or {}
    for c in step.get("claims", []):
        mark = {True: "[green]reproduced[/green]", False: "[red]not reproduced[/red]", None: "[dim]not run[/dim]"}[
            c["reproduced"]
        ]
        if c.get("descriptive") and c.get("measured"):
            mark = "[dim]descriptive[/dim]"
        console.print(f"  {c['id']}: {mark}  {c['measured']}")
    paths = step.get("paths", {})
    say(f"report: {paths.get('report.md')}  claims: {paths.get('lab.json')}  jobs: entropyrl status {out}")
    failed = [st.key for st in result["failed"]]
    if failed:
        raise UserError(
            f"{len(failed)} lab run(s) failed: {', '.join(failed)} (their train.log says why; "
            f"the report covers the runs that finished)"
        )


class _StudiesHelp(TyperCommand):
    """The ``lab`` command, whose help is built when it is shown, from the studies registered then:
    an installed plugin's (``sweeps/plugins.py``, entry-point group ``entropyrl.plugins``) beside the
    package's own."""

    def format_help(self, ctx, formatter) -> None:
        load_installed_plugins()
        self.help = lab_help()
        option_help = {"algos": _algos_help(), "experiment": _experiment_help(), "jobs": _jobs_help(), "out": _out_help()}
        for param in self.params:
            if param.name in option_help:
                param.help = option_help[param.name]
        super().format_help(ctx, formatter)


def register(app: typer.Typer) -> None:
    @app.command(
        "lab",
        cls=_StudiesHelp,
        help=lab_help(),
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def lab(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides for every run"),
        algos: str = typer.Option("default", help=_algos_help()),
        seeds: str = typer.Option("0,1,2", help="comma-separated training seeds"),
        experiment: str = typer.Option(DEFAULT_EXPERIMENT, help=_experiment_help()),
        quadrant_batches: Optional[int] = typer.Option(
            None, help=f"batches of the quadrant sign experiment (per seed; default {QUADRANT_BATCHES})"
        ),
        jobs: Optional[int] = typer.Option(None, help=_jobs_help()),
        out: Optional[Path] = typer.Option(None, help=_out_help()),
        fresh: bool = typer.Option(False, help="retrain runs that already finished in --out"),
        resume: bool = typer.Option(
            False, "--resume", help="continue the lab in --out (it must hold one): run only what did not finish"
        ),
    ) -> None:
        from rich.console import Console

        from ..models.gguf import gguf_path
        from ..models.loading import load_policy  # torch and matplotlib load when it runs
        from ..sweeps import following, planning
        from ..sweeps.ablation import default_variants, training_variants
        from ..sweeps.planning import split_overrides
        from ..sweeps.plugins import load_plugins
        from ..sweeps.state import sweep_file

        console = Console(stderr=True, highlight=False)
        say = lambda msg: console.print(f"[bold]lab[/bold]: {msg}")  # noqa: E731
        load_plugins()  # the studies a plugin declares, beside the lab's own
        study, jobs, quadrant_batches = _study_and_jobs(experiment, jobs, quadrant_batches, algos)
        names = _variant_names(
            algos, experiment, study, training_variants(study.ablation), lambda: default_variants(study.ablation)
        )
        seed_list = _parse_seeds(seeds)
        out = (out or Path(study.default_out)).resolve()
        if resume and not sweep_file(out).exists():
            raise UserError(f"--resume: {out} holds no lab (no sweep.json); drop --resume to start one there")
        variants = ([QUADRANTS] if experiment in (DEFAULT_EXPERIMENT, QUADRANTS) else []) + names
        sweep_ov, train_ov = split_overrides(list(overrides or []))
        base = compose("train", [study.base_preset, *train_ov])
        gguf_path(base.model)  # a model from a package that is not installed: one error line before anything is planned
        cfg = compose(
            "sweep", [*lab_sweep_overrides(variants, seed_list, out, jobs, quadrant_batches, study.ablation), *sweep_ov]
        )
        plan = planning.plan(cfg, train_ov, explicit_dir=True, resume=resume)  # every run checked before any starts
        plan.command = _command_line(algos, seeds, experiment, list(overrides or []))
        if fresh:
            for job in plan.jobs:
                shutil.rmtree(job.output_dir, ignore_errors=True)
        say("building / loading the model once (cached)")
        load_policy(base.model, base.data, log=lambda m: say(m))  # one builder, not one per job
        with stop_signals() as stopped_by:  # Ctrl-C, SIGTERM: the jobs stop at a step, the records close
            try:
                with live_line(console) as progress:  # job counts and each running job's step
                    log = lambda m: console.print(m, markup=False, soft_wrap=True)  # noqa: E731
                    result = following.run(plan, wait=True, log=log, progress=progress)
            except KeyboardInterrupt:
                exit_stopped(console, stopped_by, f"to continue: {plan.command} --out {out} --resume")
        _print_outcome(console, say, result, out)
