"""The lab's outputs: mean-and-band figures over seeds, ``lab.json`` and ``report.md``.

``write_lab_outputs(out, runs, claims, ...)`` takes the metric rows of every run
(``{variant: {seed: rows}}``), the claim table (``lab_claims.compute_claims``) and the quadrant
experiment, and writes everything a reader needs into ``out``. The report's sections as markdown are
``report_sections.py``'s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ...core.files import atomic_write_text  # noqa: E402
from ...trainers.run.regime import entropy_flags, findings_cell, prediction_fit, regime_warnings  # noqa: E402
from ..aggregate import seed_band  # noqa: E402
from ..jobs import read_job_state  # noqa: E402
from ..state import FAILED  # noqa: E402
from .claims import GATE_KEY, acted_share, entropy_ends, final_value  # noqa: E402
from .explain import variant_attribution  # noqa: E402
from .report_sections import claim_status, quadrant_comparison, report_md  # noqa: E402
from .study_runs import StudyRuns  # noqa: E402

__all__ = [
    "plot_band",
    "variant_table",
    "claim_status",
    "quadrant_comparison",
    "write_lab_outputs",
    "write_study_report",
    "job_times",
    "save_small",
    "finish_panels",
    "panel_grid",
    "style_panel",
]


def plot_band(
    runs: dict[str, dict[int, list[dict]]], key: str, path: Path, ylabel: str, title: str = "", variants: list[str] | None = None
) -> Path | None:
    """Mean over seeds (line) and min-max over seeds (band) of ``key`` per variant
    (``sweeps.aggregate.seed_band``: a step counts the seeds that logged it)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for name in list(runs) if variants is None else variants:
        b = seed_band((runs.get(name) or {}).values(), key)
        if b is None:
            continue
        (line,) = ax.plot(
            b["steps"], b["mean"], lw=1.6, label=f"{name} (n={b['seeds']})", marker="o" if len(b["steps"]) < 12 else None, ms=3
        )
        ax.fill_between(b["steps"], b["lo"], b["hi"], color=line.get_color(), alpha=0.18, lw=0)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title or f"{ylabel}: mean over seeds, band = min-max", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_small(fig, Path(path))
    plt.close(fig)
    return Path(path)


def panel_grid(panels: int, panel_size: tuple[float, float]):
    """``(fig, axes [rows, cols])``: a study's grid of ``panels`` panels, two to a row, each
    ``panel_size`` inches, sharing the y axis (close it with ``finish_panels``)."""
    cols = min(panels, 2)
    rows = math.ceil(panels / cols)
    width, height = panel_size
    return plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharey=True)


def style_panel(ax, title: str, xlabel: str = "step", legend_title: str | None = None) -> None:
    """One panel of a study's grid: its title, x label, grid and legend (titled ``legend_title``)."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, title=legend_title, title_fontsize=7)


def finish_panels(fig, axes, used: int, ylabel: str, title: str, path: Path) -> Path:
    """The close of a study's grid of panels: the unused panels hidden, the entropy axis labelled on
    the first column, the title, and the figure saved small (``save_small``) and closed."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_small(fig, Path(path))
    plt.close(fig)
    return Path(path)


def save_small(fig, path: Path) -> None:
    """Save ``fig`` as a 64-colour palette PNG: the docs embed these, and a full-colour PNG of
    nine translucent bands is ~4x larger for no visible difference."""
    from io import BytesIO

    from PIL import Image

    buf = BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def variant_table(runs: dict, algo_cfgs: dict, pass_key: str) -> list[dict]:
    """Per variant: entropy ends, final accuracies, prediction fit, warnings and flags over seeds, and
    for a gated method (STARE) the share of steps its gate was open per seed (``gate_open``, NaN for a
    variant that logged no gate): a claim about a gated method is read beside how often it acted."""
    out = []
    for name, by_seed in runs.items():
        rows_list = list(by_seed.values())
        warnings = findings_cell([regime_warnings(rows, algo_cfgs.get(name, {})) for rows in rows_list])
        flags = findings_cell([entropy_flags(rows, algo_cfgs.get(name, {})) for rows in rows_list])
        fits = [prediction_fit(rows) for rows in rows_list]
        out.append(
            {
                "variant": name,
                "seeds": sorted(by_seed),
                "entropy_first_tenth": [entropy_ends(r)[0] for r in rows_list],
                "entropy_last_tenth": [entropy_ends(r)[1] for r in rows_list],
                "val_acc": [final_value(r, "val/acc") for r in rows_list],
                "pass@1": [final_value(r, "val/pass_at_1") for r in rows_list],
                pass_key.split("/")[-1]: [final_value(r, pass_key) for r in rows_list],
                "pred_r_detrended": [f.get("pearson_r_detrended", float("nan")) for f in fits],
                "attribution": variant_attribution(by_seed),  # predicted_net's fit and the parts (explain.py)
                "gate_open": [acted_share(r, GATE_KEY) for r in rows_list],
                "warnings": warnings,
                "flags": flags,
            }
        )
    return out


def write_lab_outputs(
    out: Path,
    runs: dict,
    claims: list[dict],
    *,
    algo_cfgs: dict,
    quadrants: dict | None,
    pass_key: str,
    command: str,
    wall_seconds: float,
    failed: list[str],
    job_seconds: float | None = None,
    title: str = "entropyrl lab report",
    sections: list[str] | None = None,
    extra: dict | None = None,
) -> dict[str, Path]:
    """Figures, ``lab.json`` and ``report.md`` in ``out``; returns their paths by name. ``sections``:
    markdown lines placed after the entropy figure (the tool study's token kinds); ``extra``: more
    keys of ``lab.json``; ``quadrants=None``: the report has no quadrant section (an ablation
    without the experiment). ``wall_seconds``: first job's start to last job's end (a resumed sweep
    includes the pause between sessions); ``job_seconds``: the jobs' own times summed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = _lab_figures(out, runs, pass_key)
    table = variant_table(runs, algo_cfgs, pass_key)
    claims = [{**c, "status": claim_status(c)} for c in claims]
    doc = {
        "claims": claims,
        "variants": table,
        "quadrants": quadrants or {},
        "quadrant_comparison": quadrant_comparison(quadrants) if quadrants else {},
        "command": command,
        "wall_seconds": wall_seconds,
        "job_seconds": job_seconds,
        "failed_runs": failed,
        **(extra or {}),
    }
    atomic_write_text(out / "lab.json", json.dumps(doc, indent=2, default=float))
    paths["lab.json"] = out / "lab.json"
    md = report_md(
        title,
        command,
        runs,
        claims,
        table,
        set(paths),
        pass_key=pass_key,
        wall_seconds=wall_seconds,
        job_seconds=job_seconds,
        failed=failed,
        sections=sections,
        quadrants=quadrants,
    )
    atomic_write_text(out / "report.md", md)
    paths["report.md"] = out / "report.md"
    return paths


def _lab_figures(out: Path, runs: dict, pass_key: str) -> dict[str, Path]:
    """The lab's mean-and-band figures in ``out`` (entropy, pass@1, pass@k; the stress test's entropy),
    by name, the ones some run logged."""
    main = [v for v in runs if not v.endswith("_extreme")]
    paths = {}
    for name, key, label, variants in (
        ("entropy", "entropy", "policy entropy (nats/token)", main),
        ("pass1", "val/pass_at_1", "validation pass@1", main),
        ("passk", pass_key, f"validation {pass_key.split('/')[-1]}", main),
        (
            "extreme",
            "entropy",
            "entropy, stress test (clip 0.99/5, many updates per step)",
            [v for v in runs if v.endswith("_extreme")],
        ),
    ):
        p = plot_band(runs, key, out / f"lab-{name}.png", label, variants=variants)
        if p is not None:
            paths[name] = p
    return paths


def job_times(statuses: list) -> tuple[float, float]:
    """``(wall, job)`` seconds from the jobs' ``job.json``: wall from the first job's start to the last
    one's end (a sweep resumed later includes the time between its sessions), job the finished jobs'
    own start-to-end times summed (the work itself; jobs that ran side by side overlap)."""
    states = [read_job_state(Path(st.output_dir)) for st in statuses]
    starts = [s["started"] for s in states if s.get("started")]
    ends = [s["ended"] for s in states if s.get("ended")]
    wall = max(ends) - min(starts) if starts and ends else 0.0
    job = float(sum(s["ended"] - s["started"] for s in states if s.get("started") and s.get("ended")))
    return wall, job


def write_study_report(
    out: Path,
    study: StudyRuns,
    claims: list[dict],
    *,
    name: str,
    quadrants: dict | None = None,
    title: str = "entropyrl lab report",
    sections: list[str] | None = None,
    extra: dict | None = None,
    figures: dict[str, Path | None] | None = None,
    log=print,
) -> dict:
    """The part every study's report step shares: the sweep's command, its failed jobs and times,
    ``write_lab_outputs`` with the study's own ``sections`` and ``extra``, the study's ``figures``
    (name -> path, None when not drawn) among the paths, and one line saying where; returns the
    report step's answer ``{"paths", "claims", "metrics": {"claims/<id>": 1.0 | 0.0}}``.
    ``quadrants``: the lab's sign experiment (``study.quadrants``), None for a study without one."""
    sweep, statuses = study.sweep, study.statuses
    ablation = (sweep.get("ablation") or {}).get("name")
    command = sweep.get("command") or " ".join(["entropyrl sweep", f"ablation={ablation}", *study.every_job])
    wall_seconds, job_seconds = job_times(statuses)
    paths = write_lab_outputs(
        Path(out),
        study.runs,
        claims,
        algo_cfgs=study.algo_cfgs,
        quadrants=quadrants,
        pass_key=study.pass_key,
        command=command,
        wall_seconds=wall_seconds,
        job_seconds=job_seconds,
        failed=[st.key for st in statuses if st.state == FAILED],
        title=title,
        sections=sections,
        extra=extra,
    )
    paths.update({k: v for k, v in (figures or {}).items() if v is not None})
    log(
        f"{name} report: {paths['report.md']} ({sum(c['reproduced'] is True for c in claims)} of "
        f"{sum(c['reproduced'] is not None for c in claims)} claims run reproduced)"
    )
    return {
        "paths": paths,
        "claims": claims,
        "metrics": {f"claims/{c['id']}": float(c["reproduced"]) for c in claims if c["reproduced"] is not None},
    }
