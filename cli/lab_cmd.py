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

``--experiment tools`` is the tool study, the ablation ``conf/ablation/lab_tools.yaml`` (variants
``experiment=lab_tool_<name>`` on ``data=tool_countdown tools=code_interpreter``, no quadrant
experiment) with its own report step (sweeps/lab/tool_step.py: the tool claims and the figure of
entropy by token kind and turn); ``--algos`` names its variants.

``--experiment staleness`` is the staleness study, the ablation ``conf/ablation/staleness.yaml``
(``<method>_k<k>[_<correction>]``: GRPO at k = 0, 1, 2, 4 and with each correction at k = 2, STARE,
Clip-Cov and STEER synchronous and stale, STARE's gate on the behaviour policy's entropy; no quadrant
experiment) with its own report step (sweeps/lab/staleness_step.py: the staleness claims, entropy per
method and k, the clipped share by entropy quarter against k). A job at k >= 1 runs a rollout worker
process beside its trainer, so ``--jobs 1`` is two processes.

``--experiment real_model`` is the real-model study, the ablation ``conf/ablation/real_model.yaml``
(SmolLM2-135M-Instruct on word problems, ``experiment=smollm2_word_problems``: GRPO, STARE with fixed
W/M, Clip-Cov and KL-Cov by default, ``stare_published`` and ``steer`` with ``--algos``; no quadrant
experiment) with its own report step (sweeps/lab/real_model_step.py: the real-model claims, the runs'
entropy with h_tgt and the gate shaded, wall time per run, what does not reproduce and why). It needs
the model's package (``make install-smollm2``): without it the command stops with one ``error:`` line
before anything is planned. Its runs go one at a time unless ``--jobs`` says otherwise (a run that
measures the attribution holds several copies of the model's parameters).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, List, Optional

import typer

from ..conf import compose
from ..core.errors import UserError

EXPERIMENTS = ("all", "claims", "quadrants", "tools", "staleness", "real_model")
QUADRANTS = "quadrants"  # the lab ablation's quadrant-experiment variant
TOOLS = "tools"  # --experiment tools: the tool study, its own ablation
STALENESS = "staleness"  # --experiment staleness: the staleness study, its own ablation
REAL_MODEL = "real_model"  # --experiment real_model: the real-model study, its own ablation
ABLATIONS = {TOOLS: "lab_tools", STALENESS: "staleness", REAL_MODEL: "real_model"}  # --experiment -> its ablation (others: lab)
BASE_PRESETS = {  # builds the warm-started model (the real model: converts its GGUF file once)
    "lab": "experiment=lab_grpo",
    "lab_tools": "experiment=lab_tool_grpo",
    "staleness": "experiment=lab_grpo",
    "real_model": "experiment=smollm2_word_problems",
}
DEFAULT_OUT = {
    "lab": "outputs/lab",
    "lab_tools": "outputs/lab_tools",
    "staleness": "outputs/lab_staleness",
    "real_model": "outputs/lab_real_model",
}
VARIANT_KIND = {
    "lab": "lab variant",
    "lab_tools": "tool-study variant",
    "staleness": "staleness-study variant",
    "real_model": "real-model-study variant",
}
DEFAULT_JOBS = {"real_model": 1}  # runs in parallel unless --jobs says (others: 2): a real-model run's attribution is large


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
    """The ``entropyrl sweep`` overrides that make the lab: the lab ablation (or the tool study's,
    ``lab_tools``, or the staleness study's, ``staleness``), its variants and seeds, the folder, the
    local launcher at ``jobs`` in parallel with one torch thread each, MLflow experiment named as
    the ablation."""
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


LAB_HELP = (
    "Train GRPO and the entropy interventions on the lab task (data=countdown) over several seeds, run the "
    "quadrant sign experiment, and write report.md, lab.json (the claim table) and mean+band figures. "
    "Runs through the sweep machinery (ablation=lab): `entropyrl status OUT` shows the jobs. "
    "--experiment tools: the tool study instead (ablation=lab_tools: grpo, stare, steer on data=tool_countdown "
    "tools=code_interpreter; claims: GRPO collapses under tool use, STARE holds its band, entropy of text, code "
    "and post-tool tokens; figure lab-tools-entropy-kind.png). "
    "--experiment staleness: the staleness study (ablation=staleness: GRPO at k=0,1,2,4 and with the tis "
    "corrections at k=2, STARE at k=0,2,4 with the decoupled correction and the gate on the behaviour policy, "
    "Clip-Cov and STEER at k=0,2; claims: stale GRPO collapses, high-entropy tokens clipped first, the largest k "
    "where STARE holds its band, corrections lower the clipped share, Clip-Cov and STEER against GRPO; figures "
    "lab-staleness-entropy.png and lab-staleness-clip-quarters.png; --jobs 1 on a small machine: each stale "
    "job is two processes). "
    "--experiment real_model: the real-model study (ablation=real_model: GRPO, STARE with fixed W/M, Clip-Cov and "
    "KL-Cov on SmolLM2-135M-Instruct, data=word_problems, 80 steps; needs `make install-smollm2`; claims: GRPO's "
    "collapse flag fires, STARE holds its band with its gate open, each method ends above GRPO's entropy, the "
    "attribution tracks the realised change; accuracy, pass@k and the text metrics side by side; figure "
    "real-model-entropy-runs.png; one run at a time by default). "
    "Extra key=value overrides apply to every run."
)


def _ablation_and_jobs(experiment: str, jobs: int | None, quadrant_batches: int) -> tuple[str, int]:
    """The ablation ``--experiment`` names and the runs in parallel (its default when ``--jobs`` is
    left out), once ``--experiment``, ``--jobs`` and ``--quadrant-batches`` are known to be valid."""
    if experiment not in EXPERIMENTS:
        raise UserError(f"--experiment must be one of {', '.join(EXPERIMENTS)}; got '{experiment}'")
    ablation = ABLATIONS.get(experiment, "lab")
    jobs = DEFAULT_JOBS.get(ablation, 2) if jobs is None else jobs
    if jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    if quadrant_batches < 1:
        raise UserError(f"--quadrant-batches must be >= 1, got {quadrant_batches}")
    return ablation, jobs


def _variant_names(algos: str, experiment: str, ablation: str, valid: list[str], defaults: Callable[[], list[str]]) -> list[str]:
    """The training variants ``--algos`` names (``all``: ``valid``, ``default``: what ``defaults()``
    returns, or a comma-separated list; none for ``--experiment quadrants``), each checked against
    ``valid``, the ablation's."""
    asked = algos.strip()
    if asked == "all":
        algos = ",".join(valid)
    elif asked == "default":
        algos = ",".join(defaults())
    names = [a.strip() for a in algos.split(",") if a.strip()] if experiment != "quadrants" else []
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise UserError(f"unknown {VARIANT_KIND[ablation]} '{unknown[0]}'; valid: {', '.join(valid)}")
    return names


def _command_line(algos: str, seeds: str, experiment: str, overrides: list[str]) -> str:
    """The ``entropyrl lab`` command line the plan records: the options left at their default left out."""
    asked = algos.strip()
    command = " ".join(
        [
            "entropyrl lab",
            f"--algos {asked}" if asked != "default" else "",
            f"--seeds {seeds}",
            f"--experiment {experiment}" if experiment != "all" else "",
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


def register(app: typer.Typer) -> None:
    @app.command("lab", help=LAB_HELP, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def lab(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides for every run"),
        algos: str = typer.Option(
            "default",
            help="comma-separated lab variants (experiment=lab_<name>; with --experiment tools: "
            "experiment=lab_tool_<name>; with --experiment staleness: <method>_k<k>[_<correction>], e.g. "
            "grpo_k0,grpo_k2,grpo_k2_m2po; with --experiment real_model: grpo, stare, clip_cov, kl_cov, stare_published, "
            "steer), 'default' (the ablation's default_variants) or 'all' (every training variant)",
        ),
        seeds: str = typer.Option("0,1,2", help="comma-separated training seeds"),
        experiment: str = typer.Option(
            "all",
            help="all | claims (training runs) | quadrants (sign experiment only) | tools (the tool study: "
            "ablation=lab_tools, default out outputs/lab_tools) | staleness (the staleness study: ablation=staleness, "
            "default out outputs/lab_staleness) | real_model (the real-model study: ablation=real_model, default out "
            "outputs/lab_real_model)",
        ),
        quadrant_batches: int = typer.Option(20, help="batches of the quadrant sign experiment (per seed)"),
        jobs: Optional[int] = typer.Option(
            None,
            help="runs in parallel (one torch thread each; default 2; real_model: 1, a run measuring the attribution "
            "holds several copies of the model's parameters)",
        ),
        out: Optional[Path] = typer.Option(
            None,
            help="folder for the runs, the report and the figures (default outputs/lab; tools: outputs/lab_tools; "
            "staleness: outputs/lab_staleness; real_model: outputs/lab_real_model)",
        ),
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
        from ..sweeps.state import sweep_file

        console = Console(stderr=True, highlight=False)
        say = lambda msg: console.print(f"[bold]lab[/bold]: {msg}")  # noqa: E731
        ablation, jobs = _ablation_and_jobs(experiment, jobs, quadrant_batches)
        names = _variant_names(algos, experiment, ablation, training_variants(ablation), lambda: default_variants(ablation))
        seed_list = _parse_seeds(seeds)
        out = (out or Path(DEFAULT_OUT[ablation])).resolve()
        if resume and not sweep_file(out).exists():
            raise UserError(f"--resume: {out} holds no lab (no sweep.json); drop --resume to start one there")
        variants = ([QUADRANTS] if experiment in ("all", "quadrants") else []) + names
        sweep_ov, train_ov = split_overrides(list(overrides or []))
        base = compose("train", [BASE_PRESETS[ablation], *train_ov])
        gguf_path(base.model)  # a model from a package that is not installed: one error line before anything is planned
        cfg = compose("sweep", [*lab_sweep_overrides(variants, seed_list, out, jobs, quadrant_batches, ablation), *sweep_ov])
        plan = planning.plan(cfg, train_ov, explicit_dir=True, resume=resume)  # every run checked before any starts
        plan.command = _command_line(algos, seeds, experiment, list(overrides or []))
        if fresh:
            for job in plan.jobs:
                shutil.rmtree(job.output_dir, ignore_errors=True)
        say("building / loading the model once (cached)")
        load_policy(base.model, base.data, log=lambda m: say(m))  # one builder, not one per job
        result = following.run(plan, wait=True, log=lambda m: console.print(m, markup=False, soft_wrap=True))
        _print_outcome(console, say, result, out)
