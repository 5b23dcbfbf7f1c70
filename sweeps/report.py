"""The sweep report: a comparison table, per-variant curves and ``report.md``, written to the sweep
folder and logged to the sweep's MLflow parent run.

Files (in ``<sweep_dir>``): ``report.md`` (the tables, the curves, failed jobs with their logs),
``report.json`` (the same numbers, machine-readable), ``comparison.csv`` (one row per variant:
mean and std over seeds), ``runs.csv`` (one row per job), ``plots/{entropy,reward,accuracy,
val_accuracy}.png`` (mean line and min-max band over seeds, per variant). Only finished jobs count.
Each variant also shows its runs' regime warnings and entropy flags (``summary.json`` ``warnings`` and
``flags``, trainers/run/regime.py), formatted as in the lab report; a run whose summary is missing or not
whole has them recomputed from its metrics and saved config, or shown as ``?`` when that config cannot be
read either, and the report says which run in a ``warning:`` line (``report.json``: ``record_problems``). The bands come from
``aggregate.seed_band`` (a step counts the seeds that logged it), as the lab's figures do. The
entropy plot draws ``report.entropy_threshold`` as the line named ``h_tgt`` (STARE's set point, which it
defaults to). Each variant says how often its interventions acted (``acted``): per intervention whose
``acted_key`` metric the runs logged (STARE's ``stare/gate_on``, a selection rule's token share), its
mean over steps and seeds, read from the metrics alone, so any intervention is covered.

An ablation may name a ``report_step`` (``REPORT_STEPS``; the lab's: ``lab``) that runs after this
report over the same folder; its own ``report.md`` then takes that name and this report is kept as
``sweep-report.md``.

This module gathers the numbers, draws the curves and logs to MLflow; ``report_tables.py`` lays out the
tables (``report.md``'s markdown, ``comparison.csv``, ``runs.csv``).
"""

from __future__ import annotations

import importlib
import json
import re
import time
from pathlib import Path
from typing import Callable

from ..core.errors import UserError
from ..core.files import atomic_write_text
from ..core.registry import Registry, unknown_choice
from ..core.schema import defaults
from ..core.schema.sweep import PUBLISHED_H_TGT, SweepReport
from ..core.tracking import TrackingStore, check_reachable
from ..trainers.run.plots import mean_by_step, plot_attribution, save_figure
from ..trainers.run.regime import findings_cell
from . import aggregate as agg
from .jobs import TRAIN_KIND, job_kind, read_job_state
from .plugins import load_plugins
from .report_tables import COLUMNS as COLUMNS  # with acted_cell, shown_columns: importable from here as before
from .report_tables import acted, findings_or_unknown, markdown, write_tables
from .report_tables import acted_cell as acted_cell
from .report_tables import shown_columns as shown_columns
from .run_records import read_tracking_run, run_findings
from .state import DONE, FAILED, PENDING, RUNNING, JobStatus, sweep_status
from .studies import STUDIES

PLOTS = [
    ("entropy", "entropy", "policy entropy (nats/token)"),
    ("reward", "reward/mean", "reward (train)"),
    ("accuracy", "acc/mean", "accuracy (train)"),
    ("val_accuracy", "val/acc", "validation accuracy"),
]


# What an ablation's ``report_step`` names: ``step(sweep_dir, sweep, statuses, log)`` runs after the
# sweep's own report over the same folder and returns ``{"paths": {name: path}, "metrics": {...}}``
# (its files are logged to the parent run with the report, its metrics on the parent run).
ReportStep = Callable[[Path, dict, list, Callable[[str], None]], dict]
REPORT_STEPS: Registry = Registry("report_step")  # the lab plugin registers "lab"

#: the report section of a sweep.json saved without one: the schema's defaults (core/schema/sweep.py),
#: the entropy threshold as an ablation that names none gets it
SAVED_REPORT_DEFAULTS = {**defaults(SweepReport), "entropy_threshold": PUBLISHED_H_TGT}


def register_report_step(name: str, step: ReportStep) -> None:
    """Make ``ablation.report_step: <name>`` run ``step`` after the sweep's report."""
    REPORT_STEPS[name] = step


def metric_key(text: str) -> str:
    """A string MLflow accepts as a metric name."""
    return re.sub(r"[^\w./\- ]", "_", text)


def _plot(curves: dict[str, list], key: str, label: str, path: Path, title: str, threshold: float | None = None) -> Path | None:
    return _plot_panels(curves, [(key, label)], path, title, threshold)


QUADRANT_PANELS = [(f"quadrant/{q}/share", f"{q} share of tokens") for q in ("q1", "q2", "q3", "q4")]


def _plot_panels(
    curves: dict[str, list], panels: list[tuple[str, str]], path: Path, title: str, threshold: float | None = None
) -> Path | None:
    """One panel per ``(key, label)``, a line per variant: the mean over seeds with the min-max band;
    ``threshold`` (STARE's h_tgt) a dashed line on the entropy panel. None when no run logged any key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    bands = [[(v, b) for v, seed_rows in curves.items() if (b := agg.seed_band(seed_rows, key)) is not None] for key, _ in panels]
    if not any(bands):
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 if len(panels) == 1 else 3.6 * len(panels), 3.8), squeeze=False)
    for ax, (key, label), drawn in zip(axes[0], panels, bands):
        for variant, b in drawn:
            (line,) = ax.plot(
                b["steps"],
                b["mean"],
                lw=1.6,
                marker="o" if len(b["steps"]) < 12 else None,
                ms=3,
                label=f"{variant} (n={b['seeds']})",
            )
            if b["seeds"] > 1:
                ax.fill_between(b["steps"], b["lo"], b["hi"], color=line.get_color(), alpha=0.18, lw=0)
        if threshold is not None and key == "entropy":
            ax.axhline(threshold, color="grey", ls="--", lw=1, label=f"h_tgt = {threshold:g}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if len(panels) == 1:
        axes[0][0].set_title(title, fontsize=10)
    else:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def build_report(
    sweep_dir: Path, *, log_mlflow: bool = True, log: Callable[[str], None] = print, report_step: str | None = None
) -> dict:
    """(Re)build the report of ``sweep_dir`` from its jobs' files; log it to the parent run.
    ``report_step``: the report step to run instead of the one ``sweep.json``'s ablation names (a
    sweep started before its ablation named one).

    Returns ``{"report": path, "plots": [...], "variants": {...}, "jobs": [...], "counts": {...}}``.
    """
    sweep_dir = Path(sweep_dir).resolve()
    sweep, statuses = sweep_status(sweep_dir)
    # a sweep.json saved before sweeps recorded their report section reads as the schema's defaults
    rep_cfg = {**SAVED_REPORT_DEFAULTS, **sweep.get("report", {})}
    threshold, tail_frac = float(rep_cfg["entropy_threshold"]), float(rep_cfg["tail_frac"])
    tail_txt = f"{tail_frac:.0%}" if tail_frac != 0.1 else "tenth"
    ablation = sweep.get("ablation", {}).get("name", "sweep")
    # the comparison covers training jobs; other job kinds (the lab's quadrant experiment) are
    # listed in the job table and read by the ablation's report step
    order = list(dict.fromkeys(r["variant"] for r in sweep.get("jobs", []) if job_kind(r) == TRAIN_KIND))

    train_keys = {r["key"] for r in sweep.get("jobs", []) if job_kind(r) == TRAIN_KIND}
    problems: list[str] = []
    job_rows, curves, variants = _read_jobs(statuses, order, threshold, tail_frac, train_keys, problems)
    for line in problems:  # a finished run's record that could not be read (said, not read as empty)
        log(f"warning: {line}")
    counts = {s: sum(1 for st in statuses if st.state == s) for s in (DONE, RUNNING, PENDING, FAILED)}
    plots = _draw_plots(sweep_dir, curves, order, ablation, threshold)
    write_tables(sweep_dir, order, variants, job_rows)
    step = _report_step(sweep, ablation, report_step)
    md = markdown(sweep, sweep_dir, order, variants, statuses, job_rows, plots, threshold, tail_txt, counts)
    # an ablation with a report step (the lab) keeps the sweep's own report beside the step's report.md
    md_name = "sweep-report.md" if step is not None else "report.md"
    report_path = sweep_dir / md_name
    atomic_write_text(report_path, md)
    result = {
        "report": str(report_path),
        "plots": [str(p) for p in plots],
        "variants": variants,
        "jobs": job_rows,
        "counts": counts,
        "threshold": threshold,
        "tail_frac": tail_frac,
        "sweep_id": sweep.get("sweep_id"),
        "built": time.time(),
        "files": [md_name, "report.json", "comparison.csv", "runs.csv"],
        "record_problems": problems,
    }
    atomic_write_text(sweep_dir / "report.json", json.dumps(result, indent=2, default=_json_default))
    if step is not None:
        _run_step(step, sweep_dir, sweep, statuses, log, result)
    if log_mlflow:
        _log_to_parent(sweep, sweep_dir, result, log)
    return result


def _read_jobs(
    statuses: list[JobStatus], order: list[str], threshold: float, tail_frac: float, train_keys: set, problems: list[str]
) -> tuple[list, dict, dict]:
    """``(job_rows, curves, variants)``: one row per job (its metrics, regime findings and MLflow run),
    each variant's finished runs' metric rows, and per variant the summary over its finished seeds. A
    finished training run's record (``train_keys``) that cannot be read is one line in ``problems``
    (``run_records.run_findings``), and its findings unknown there are shown as ``?``."""
    job_rows, curves, per_variant = [], {v: [] for v in order}, {v: [] for v in order}
    findings: dict[str, dict[str, list[list[dict]]]] = {v: {"warnings": [], "flags": []} for v in order}
    unknown: set[str] = set()
    for st in statuses:
        rows = agg.load_rows(Path(st.output_dir)) if st.state == DONE else []
        m = agg.run_metrics(rows, threshold, tail_frac) if rows else {}
        js = _job_json(st)
        regime = (
            run_findings(st.output_dir, rows, problems)
            if st.state == DONE and st.key in train_keys
            else {"warnings": [], "flags": []}
        )
        if regime.get("unknown"):
            unknown.add(st.variant)
        cell = (lambda found: "?") if regime.get("unknown") else (lambda found: findings_cell([found]))
        job_rows.append(
            {
                "key": st.key,
                "variant": st.variant,
                "seed": st.seed,
                "state": st.state,
                "detail": st.detail,
                "mlflow_run_id": js.get("mlflow_run_id") or read_tracking_run(st.output_dir),
                "output_dir": st.output_dir,
                "log": st.log,
                **m,
                "warnings": cell(regime["warnings"]) if st.state == DONE else "",
                "flags": cell(regime["flags"]) if st.state == DONE else "",
            }
        )
        if rows and st.variant in curves:
            curves[st.variant].append(rows)
            per_variant[st.variant].append(m)
            for kind in ("warnings", "flags"):
                findings[st.variant][kind].append(regime[kind])
    variants = {
        v: {
            "summary": agg.variant_summary(runs) if runs else {},
            "done": len(runs),
            "total": sum(1 for s in statuses if s.variant == v),
            "warnings": findings_or_unknown(findings[v]["warnings"], v in unknown) if runs else "-",
            "flags": findings_or_unknown(findings[v]["flags"], v in unknown) if runs else "-",
            "acted": acted(curves[v]),
        }
        for v, runs in per_variant.items()
    }
    return job_rows, curves, variants


def _draw_plots(sweep_dir: Path, curves: dict[str, list], order: list[str], ablation: str, threshold: float) -> list[Path]:
    """``plots/``: each of ``PLOTS``, the four quadrants' shares and each variant's "why entropy moved",
    the ones some run logged."""
    plots = []
    for fname, key, label in PLOTS:
        p = _plot(
            curves,
            key,
            label,
            sweep_dir / "plots" / f"{fname}.png",
            f"{ablation}: {label} (mean, min-max band over seeds)",
            threshold if key == "entropy" else None,
        )
        if p is not None:
            plots.append(p)
    p = _plot_panels(  # diagnostics.quadrants: where the tokens sit (sign of advantage x surprisal)
        curves,
        QUADRANT_PANELS,
        sweep_dir / "plots" / "quadrants.png",
        f"{ablation}: four quadrants (mean, min-max band over seeds)",
    )
    if p is not None:
        plots.append(p)
    for v in order:  # diagnostics.attribution runs: "why entropy moved", the seed mean per variant
        p = plot_attribution(
            mean_by_step(curves[v]),
            sweep_dir / "plots" / f"why_entropy_moved_{re.sub(r'[^A-Za-z0-9._-]', '_', v)}.png",
            title=f"{ablation}: why entropy moved, {v} (mean over seeds)",
        )
        if p is not None:
            plots.append(p)
    return plots


def _register_declared_step(name: str) -> None:
    """Register the report step a registered study declares as ``report_step_at`` ("module:function")
    under ``name``, its module imported now: the steps of studies registered after the lab plugin
    was imported (a plugin of your own) are found as the lab's are."""
    study = next((s for s in STUDIES.values() if s.report_step == name and s.report_step_at), None)
    if study is not None:
        module, _, function = study.report_step_at.partition(":")
        register_report_step(name, getattr(importlib.import_module(module), function))


def _report_step(sweep: dict, ablation: str, report_step: str | None) -> ReportStep | None:
    """The report step to run after this report: ``report_step``, else the one the ablation names;
    None when neither names one. An unknown name is refused."""
    step_name = report_step or sweep.get("ablation", {}).get("report_step")
    step = None
    if step_name:
        if str(step_name) not in REPORT_STEPS:
            load_plugins()
        if str(step_name) not in REPORT_STEPS:
            _register_declared_step(str(step_name))
        step = REPORT_STEPS.get(str(step_name))
        if step is None:
            raise UserError(f"ablation {ablation}: " + unknown_choice("report_step", step_name, REPORT_STEPS))
    return step


def _run_step(step: ReportStep, sweep_dir: Path, sweep: dict, statuses: list, log: Callable[[str], None], result: dict) -> None:
    """Run the report step and add its files and metrics to ``result``; its ``report.md`` becomes the report."""
    out = step(sweep_dir, sweep, statuses, log)
    result["files"] += [str(Path(p).relative_to(sweep_dir)) for p in out.get("paths", {}).values()]
    result["step_metrics"] = dict(out.get("metrics") or {})
    result["step"] = out
    if "report.md" in out.get("paths", {}):
        result["report"] = str(out["paths"]["report.md"])


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    return str(o)


def _job_json(st: JobStatus) -> dict:
    return read_job_state(Path(st.output_dir))


def _log_to_parent(sweep: dict, sweep_dir: Path, result: dict, log: Callable[[str], None]) -> None:
    tr = sweep.get("tracking", {})
    run_id = tr.get("parent_run_id")
    if not tr.get("enabled", True) or not run_id:
        return
    try:
        check_reachable(tr["uri"])
        store = TrackingStore(tr["uri"])
        for name in result["files"]:
            store.log_artifact(run_id, sweep_dir / name, artifact_path="report")
        for p in result["plots"]:
            store.log_artifact(run_id, p, artifact_path="report/plots")
        metrics = {}
        for v, info in result["variants"].items():
            for field, stats in info["summary"].items():
                if stats.get("n"):
                    metrics[metric_key(f"{v}/{field}")] = stats["mean"]
            for key, value in info.get("acted", {}).items():
                metrics[metric_key(f"{v}/acted/{key}")] = value
        metrics.update(result.get("step_metrics") or {})
        store.log_metrics(run_id, metrics)
        counts = result["counts"]
        if counts[RUNNING] == 0 and counts[PENDING] == 0:
            status = "FAILED" if counts[FAILED] else "FINISHED"
            store.finish(run_id, status=status)
            log(f"report logged to MLflow parent run {run_id} ({status}) at {tr['uri']}")
            log(
                f"compare the variants in MLflow: experiment {tr.get('experiment')}, chart view, "
                f"'Group by' -> tag 'variant' (one curve per variant, the seeds averaged)"
            )
        # else: jobs still to run; the run's status is its follower's (a stopped sweep's stays KILLED)
    except Exception as exc:  # noqa: BLE001 - the files are written; MLflow is best effort here
        log(f"warning: report written but not logged to MLflow run {run_id}: {str(exc).splitlines()[0]}")


DOCS_BEGIN, DOCS_END = "<!-- report:begin -->", "<!-- report:end -->"


def publish_report(sweep_dir: Path, page: Path) -> Path:
    """Put a sweep's ``report.md`` (the lab's, for a lab) into a docs page, between the page's
    ``<!-- report:begin -->`` and ``<!-- report:end -->`` lines: headings one level down, figures
    copied beside the page (``<page stem>/``) and linked from there. The prose around the markers is
    the page's own; a page without the markers is refused. Returns the page."""
    import shutil

    sweep_dir, page = Path(sweep_dir), Path(page)
    source = sweep_dir / "report.md"
    if not source.is_file():
        raise UserError(f"{sweep_dir} holds no report.md: build it first with `entropyrl report {sweep_dir}`")
    text = page.read_text() if page.is_file() else ""
    if text.count(DOCS_BEGIN) != 1 or text.count(DOCS_END) != 1:
        raise UserError(f"{page} needs one {DOCS_BEGIN} line and one {DOCS_END} line around the generated section")
    figures = page.parent / page.stem
    body = []
    for line in source.read_text().splitlines():
        if line.startswith("#"):
            line = "#" + line
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", line):
            found = sweep_dir / target
            if found.is_file():
                figures.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(found, figures / found.name)
                line = line.replace(f"]({target})", f"]({page.stem}/{found.name})")
        body.append(line)
    head, rest = text.split(DOCS_BEGIN)
    _, tail = rest.split(DOCS_END)
    atomic_write_text(
        page,
        f"{head}{DOCS_BEGIN}\n<!-- generated by `entropyrl report {sweep_dir.name} --docs "
        f"{page.name}`: edit the prose outside the markers -->\n" + "\n".join(body).strip() + f"\n{DOCS_END}{tail}",
    )
    return page
