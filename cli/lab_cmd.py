"""``entropyrl lab``: the interventions against GRPO on the lab task, over seeds, with a claim table.

    entropyrl lab                                        # every lab variant x seeds 0,1,2 + quadrant experiment
    entropyrl lab --algos grpo,stare --seeds 0,1         # a subset
    entropyrl lab --experiment quadrants --seeds 0       # only the quadrant sign experiment
    entropyrl lab trainer.total_steps=40                 # overrides apply to every run

Each (variant, seed) is ``entropyrl train experiment=lab_<variant> trainer.seed=<seed>`` in its own
process, ``--jobs`` at a time (one torch thread each). The output folder gets ``report.md``,
``lab.json`` (the claim table) and the figures; everything is also logged to MLflow under the
experiment ``lab`` (a parent run with the report, the training runs as its children).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from ..conf import compose, to_plain
from ..core.errors import UserError
from ..core.tracking import RunTracker, read_metrics
from ..sweeps.lab.claims import compute_claims

VARIANTS = ("grpo", "stare", "steer", "clip_cov", "kl_cov", "sample_reweight", "high_entropy_mask",
            "grpo_extreme", "steer_extreme")
EXPERIMENTS = ("all", "claims", "quadrants")


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, e.g. 0,1,2; got '{text}'") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds needs distinct integers, e.g. 0,1,2; got '{text}'")
    return seeds


def _run_pool(jobs: list[tuple[str, list[str], Path]], parallel: int, say) -> list[str]:
    """Run ``(name, argv, log)`` jobs, ``parallel`` at a time; returns the names that failed."""
    pending, running, failed = list(jobs), [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    while pending or running:
        while pending and len(running) < parallel:
            name, argv, log = pending.pop(0)
            log.parent.mkdir(parents=True, exist_ok=True)
            handle = log.open("w")
            running.append((name, subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env), handle, log))
            say(f"started {name}")
        time.sleep(1.0)
        for item in list(running):
            name, proc, handle, log = item
            if proc.poll() is not None:
                handle.close()
                running.remove(item)
                if proc.returncode != 0:
                    failed.append(name)
                    tail = log.read_text().strip().splitlines()[-1:] or [""]
                    say(f"[red]{name} failed[/red] (exit {proc.returncode}): {tail[0]}  (log: {log})")
                else:
                    say(f"finished {name}")
    return failed


def finished_run(cfg) -> bool:
    """True when ``cfg.output_dir`` holds a finished run of exactly this configuration (tracking aside),
    so a repeated or extended ``entropyrl lab`` reuses it instead of training it again."""
    from omegaconf import OmegaConf


    out = Path(cfg.output_dir)
    try:
        summary = json.loads((out / "summary.json").read_text())
        saved = to_plain(OmegaConf.load(out / "config.yaml"))
    except Exception:  # noqa: BLE001 - anything unreadable is simply not reusable
        return False
    strip = lambda c: {k: v for k, v in c.items() if k != "tracking"}  # noqa: E731
    return summary.get("status") == "FINISHED" and strip(saved) == strip(to_plain(cfg))


def register(app: typer.Typer) -> None:
    @app.command(
        "lab",
        help="Train GRPO and the entropy interventions on the lab task (data=countdown) over several seeds, run the "
             "quadrant sign experiment, and write report.md, lab.json (the claim table) and mean+band figures. "
             "Extra key=value overrides apply to every run.",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def lab(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides for every run"),
        algos: str = typer.Option(",".join(VARIANTS), help="comma-separated lab variants (experiment=lab_<name>)"),
        seeds: str = typer.Option("0,1,2", help="comma-separated training seeds"),
        experiment: str = typer.Option("all", help="all | claims (training runs) | quadrants (sign experiment only)"),
        quadrant_batches: int = typer.Option(20, help="batches of the quadrant sign experiment (per seed)"),
        jobs: int = typer.Option(2, help="runs in parallel (one torch thread each)"),
        out: Path = typer.Option(Path("outputs/lab"), help="folder for the runs, the report and the figures"),
        fresh: bool = typer.Option(False, help="retrain runs that already finished in --out with the same config"),
    ) -> None:
        from rich.console import Console

        from ..models.loading import load_policy  # torch and matplotlib load when it runs
        from ..sweeps.lab.report import write_lab_outputs

        console = Console(stderr=True)
        say = lambda msg: console.print(f"[bold]lab[/bold]: {msg}")  # noqa: E731
        if experiment not in EXPERIMENTS:
            raise UserError(f"--experiment must be one of {', '.join(EXPERIMENTS)}; got '{experiment}'")
        if jobs < 1:
            raise UserError(f"--jobs must be >= 1, got {jobs}")
        names = [a.strip() for a in algos.split(",") if a.strip()] if experiment != "quadrants" else []
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            raise UserError(f"unknown lab variant '{unknown[0]}'; valid: {', '.join(VARIANTS)}")
        seed_list = _parse_seeds(seeds)
        extra = list(overrides or [])
        out = out.resolve()
        cfgs = {(n, s): compose("train", [f"experiment=lab_{n}", f"trainer.seed={s}", f"output_dir={out / n / f's{s}'}",
                                          "tracking.experiment=lab", "trainer.resume=overwrite", *extra])
                for n in names for s in seed_list}                       # validate every run before starting any
        base = compose("train", ["experiment=lab_grpo", "tracking.experiment=lab", *extra])
        started = time.perf_counter()
        say("building / loading the warm-started lab model once (cached)")
        load_policy(base.model, base.data, log=lambda m: say(m))        # one builder, not one per process
        parent = RunTracker(base.tracking, out)
        parent.start({"lab": {"algos": names, "seeds": seed_list, "experiment": experiment}}, "lab", resume_step=None)
        cli = [sys.executable, "-m", "entropyrl.cli.main"]
        jobs_list = []
        if experiment in ("all", "quadrants"):     # first: short, and its claim needs every seed
            for s in seed_list:
                qout = out / "quadrants" / f"s{s}.json"
                if qout.exists() and not fresh:
                    say(f"reusing the quadrant experiment {qout}")
                    continue
                jobs_list.append((f"quadrants/s{s}", [sys.executable, "-m", "entropyrl.sweeps.lab.quadrant_probe", str(qout),
                                                      str(quadrant_batches), "experiment=lab_grpo", f"trainer.seed={s}",
                                                      "tracking.enabled=false", f"output_dir={out / 'quadrants' / f's{s}'}",
                                                      *extra], out / "quadrants" / f"s{s}.log"))
        for (n, s), cfg in cfgs.items():
            if not fresh and finished_run(cfg):
                say(f"reusing the finished run {n}/s{s} in {cfg.output_dir}")
                continue
            args = [f"experiment=lab_{n}", f"trainer.seed={s}", f"output_dir={cfg.output_dir}", "tracking.experiment=lab",
                    f"tracking.run_name=lab-{n}-s{s}", "trainer.resume=overwrite", *extra]
            if parent.run_id:
                args.append(f"tracking.parent_run_id={parent.run_id}")       # children of the lab's run
            jobs_list.append((f"{n}/s{s}", [*cli, "train", *args], Path(cfg.output_dir) / "log.txt"))
        failed = _run_pool(jobs_list, jobs, say)
        runs: dict[str, dict[int, list[dict]]] = {}
        for (n, s), cfg in cfgs.items():
            rows = read_metrics(Path(cfg.output_dir))
            if rows:
                runs.setdefault(n, {})[s] = rows
        quadrants = {}
        for s in seed_list:
            qpath = out / "quadrants" / f"s{s}.json"
            if qpath.exists():
                quadrants[s] = json.loads(qpath.read_text())
        algo_cfgs = {n: to_plain(cfgs[(n, seed_list[0])].algo) for n in names}
        h_tgt = float(cfgs[("stare", seed_list[0])].algo.stare.h_tgt) if ("stare", seed_list[0]) in cfgs \
            else float(compose("train", ["experiment=lab_stare", *extra]).algo.stare.h_tgt)
        pass_key = f"val/pass@{int(base.val.pass_k)}"
        claims = compute_claims(runs, h_tgt=h_tgt, algo_cfgs=algo_cfgs, quadrants=quadrants or None, pass_key=pass_key)
        command = "entropyrl lab " + " ".join([f"--algos {algos}" if algos != ",".join(VARIANTS) else "",
                                               f"--seeds {seeds}", f"--experiment {experiment}" if experiment != "all" else "",
                                               *extra]).strip()
        paths = write_lab_outputs(out, runs, claims, algo_cfgs=algo_cfgs, quadrants=quadrants, pass_key=pass_key,
                                  command=" ".join(command.split()), wall_seconds=time.perf_counter() - started,
                                  failed=failed)
        for p in paths.values():
            parent.log_artifact(p)
        if parent.run_id:
            import mlflow

            mlflow.log_metrics({f"claims/{c['id']}": float(c["reproduced"]) for c in claims if c["reproduced"] is not None})
        parent.finish("FAILED" if failed else "FINISHED")
        for c in claims:
            mark = {True: "[green]reproduced[/green]", False: "[red]not reproduced[/red]", None: "[dim]not run[/dim]"}[c["reproduced"]]
            console.print(f"  {c['id']}: {mark}  {c['measured']}")
        say(f"report: {paths['report.md']}  claims: {paths['lab.json']}")
        if failed:
            raise UserError(f"{len(failed)} lab run(s) failed: {', '.join(failed)} (their log.txt says why; "
                            f"the report covers the runs that finished)")
