"""The sweep report's tables: the comparison of the variants and the job list, as ``report.md``'s
markdown (``markdown``) and as ``comparison.csv`` and ``runs.csv`` (``write_tables``), with the cells
they share (a mean ± std over seeds, the first step below the threshold, how often each intervention
acted). ``report.build_report`` gathers the numbers; this module only lays them out.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from ..core.files import atomic_path
from ..trainers.interventions import INTERVENTIONS
from ..trainers.run.regime import findings_cell
from .state import DONE, FAILED, PENDING, RUNNING

COLUMNS = [
    ("final_val_acc", "final val acc", 3),
    ("final_val_pass", "final val pass@k", 3),
    ("entropy_tail_mean", "entropy, last {tail} (mean)", 3),
    ("entropy_tail_min", "entropy, last {tail} (min)", 3),
    ("entropy_auc", "entropy AUC", 2),
]
OPTIONAL_COLUMNS = {"final_val_pass"}  # shown when some variant logged it (val.pass_k > 0)


def shown_columns(summaries) -> list[tuple[str, str, int]]:
    """The report table's ``COLUMNS``, less the optional ones no variant's ``summaries`` has a value for."""
    summaries = list(summaries)
    return [c for c in COLUMNS if c[0] not in OPTIONAL_COLUMNS or any(s.get(c[0], {}).get("n", 0) for s in summaries)]


# runs.csv: one row per job, in this order
RUNS_FIELDS = [
    "variant",
    "seed",
    "state",
    "steps",
    *[c for c, _, _ in COLUMNS],
    "first_step_below",
    "final_reward",
    "final_acc",
    "warnings",
    "flags",
    "mlflow_run_id",
    "output_dir",
    "log",
    "detail",
]


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}"


def _pm(stats: dict, digits: int) -> str:
    if not stats.get("n"):
        return "-"
    if stats["n"] == 1:
        return _fmt(stats["mean"], digits)
    return f"{_fmt(stats['mean'], digits)} ± {_fmt(stats['std'], digits)}"


def _first_below(stats: dict) -> str:
    if not stats.get("of"):
        return "-"
    if not stats.get("crossed"):
        return f"never (0/{stats['of']})"
    return f"{stats['mean']:.1f} ({stats['crossed']}/{stats['of']})"


def acted(runs: list[list[dict]]) -> dict[str, float]:
    """``{metric: mean}``: for every registered intervention whose ``acted_key`` metric appears in
    ``runs`` (each a seed's metric rows), its mean over all logged steps of all seeds: how often a
    gate was open, or the share of tokens a rule selected. ``{}`` when none acted or logged. Pure."""
    keys = sorted({k for cls in INTERVENTIONS.values() if (k := cls.acted_key()) is not None})
    out: dict[str, float] = {}
    for key in keys:
        vals = [
            float(r[key]) for rows in runs for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))
        ]
        if vals:
            out[key] = sum(vals) / len(vals)
    return out


def acted_cell(values: dict[str, float]) -> str:
    """The report's cell for ``acted``: ``"stare/gate_on 0.23"``; ``-`` when no intervention logged."""
    return "; ".join(f"{k} {v:.2f}" for k, v in values.items()) or "-"


def _write_csv(path: Path, rows: list[dict], fields: list[str]) -> None:
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def comparison_rows(order: list[str], variants: dict) -> list[dict]:
    """``comparison.csv``'s rows: per variant in ``order``, its seeds and each column's mean and std."""
    comp_rows = []
    for v in order:
        s = variants[v]["summary"]
        row = {"variant": v, "seeds_done": variants[v]["done"], "seeds_total": variants[v]["total"]}
        for f, _, _ in COLUMNS:
            row[f"{f}_mean"], row[f"{f}_std"] = s.get(f, {}).get("mean"), s.get(f, {}).get("std")
        fsb = s.get("first_step_below", {})
        row["first_step_below_mean"], row["first_step_below_crossed"] = fsb.get("mean"), fsb.get("crossed")
        row["warnings"], row["flags"] = variants[v]["warnings"], variants[v]["flags"]
        row["acted"] = acted_cell(variants[v]["acted"])
        comp_rows.append(row)
    return comp_rows


def write_tables(sweep_dir: Path, order: list[str], variants: dict, job_rows: list[dict]) -> None:
    """``runs.csv`` (one row per job) and ``comparison.csv`` (one row per variant) in ``sweep_dir``."""
    _write_csv(sweep_dir / "runs.csv", job_rows, RUNS_FIELDS)
    comp_rows = comparison_rows(order, variants)
    _write_csv(sweep_dir / "comparison.csv", comp_rows, list(comp_rows[0]) if comp_rows else ["variant"])


def markdown(sweep, sweep_dir, order, variants, statuses, job_rows, plots, threshold, tail_txt, counts) -> str:
    """``report.md``: the sweep's header, the comparison table and its legend, the curves, the jobs and
    the failed jobs with their logs."""
    abl = sweep.get("ablation", {})
    tr = sweep.get("tracking", {})
    lines = [f"# Sweep `{abl.get('name', '?')}` ({sweep.get('sweep_id', '')})", ""]
    if abl.get("description"):
        lines += [str(abl["description"]).strip(), ""]
    lines += [
        f"- folder: `{sweep_dir}`",
        f"- launcher: {sweep.get('launcher', {}).get('name', '?')}; seeds: {sweep.get('seeds')}",
        f"- jobs: {counts[DONE]} done, {counts[RUNNING]} running, {counts[PENDING]} pending, "
        f"{counts[FAILED]} failed (of {len(statuses)})",
    ]
    if tr.get("enabled", True) and tr.get("parent_run_id"):
        lines.append(f"- MLflow: parent run `{tr['parent_run_id']}` in experiment `{tr.get('experiment')}` at {tr.get('uri')}")
    if sweep.get("budget") or sweep.get("train_overrides"):
        lines.append(f"- every job: `{' '.join([*sweep.get('budget', []), *sweep.get('train_overrides', [])])}`")
    lines += ["", "## Comparison (finished seeds; mean ± std over seeds)", ""]
    columns = shown_columns(variants[v]["summary"] for v in order)
    header = (
        ["variant", "seeds"]
        + [c[1].format(tail=tail_txt) for c in columns]
        + [f"first step H < {threshold:g}", "acted", "warnings", "flags"]
    )
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in order:
        s = variants[v]["summary"]
        cells = [f"`{v}`", f"{variants[v]['done']}/{variants[v]['total']}"]
        cells += [_pm(s.get(f, {}), d) for f, _, d in columns]
        cells += [
            _first_below(s.get("first_step_below", {})),
            acted_cell(variants[v]["acted"]),
            variants[v]["warnings"],
            variants[v]["flags"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Entropy AUC: trapezoid area under the entropy curve over steps (nats x steps). "
        f"First step H < {threshold:g}: mean over the seeds whose entropy fell below it "
        f"(how many of them did). Acted: how often each intervention acted, the mean over steps and "
        f"seeds of the metric it names (`stare/gate_on`: the share of steps STARE's gate was open; a "
        f"`/frac` metric: the share of tokens a rule selected). Warnings (an intervention that cannot act in this regime) and "
        f"flags (entropy collapse < 0.2x / explosion > 3x its first tenth), from each run's "
        f"summary.json: `id@first step` per seed. Final val pass@k (with `val.pass_k`): the last "
        f"`val/pass_at_<k>` of the largest k logged.",
        "",
    ]
    if plots:
        lines += ["## Curves (mean line, min-max band over seeds)", ""]
        lines += [f"![{Path(p).stem}](plots/{Path(p).name})" for p in plots]
        lines.append("")
    lines += [
        "## Jobs",
        "",
        "| job | state | steps | final val acc | entropy AUC | warnings | flags | MLflow run | detail |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in job_rows:
        lines.append(
            f"| `{r['key']}` | {r['state']} | {r.get('steps', '-')} | {_fmt(r.get('final_val_acc'))} | "
            f"{_fmt(r.get('entropy_auc'), 2)} | {r['warnings'] or '-'} | {r['flags'] or '-'} | "
            f"{r.get('mlflow_run_id') or '-'} | {r['detail']} |"
        )
    failed = [s for s in statuses if s.state == FAILED]
    if failed:
        lines += ["", "## Failed jobs", ""]
        lines += [f"- `{s.key}`: {s.detail}. Log: `{s.log}` (also `{Path(s.output_dir) / 'train.log'}`)" for s in failed]
    lines += ["", f"Rebuild: `entropyrl report {sweep_dir}`; state: `entropyrl status {sweep_dir}`.", ""]
    return "\n".join(lines)


def findings_or_unknown(found: list[list[dict]], some_unknown: bool) -> str:
    """A variant's findings over its seeds; ``(?)`` added when a seed's findings are unknown."""
    cell = findings_cell(found)
    return f"{cell} (?)" if some_unknown else cell
