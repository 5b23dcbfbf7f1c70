"""The real-model study's report step (``ablation.report_step: real_model``, ``entropyrl lab --experiment
real_model``), after the sweep's report over a sweep of ``conf/ablation/real_model.yaml``.

It reads the finished training runs as every study's step does (``study_runs.read_study_runs``), computes the
real-model claims (``real_model_claims.real_model_claims``), explains them with the runs' attribution
(``explain.explain_claims``), declares each one's null control and writes into the sweep folder
``report.md``, ``lab.json`` (the claims, the lab's variant table, the runs' table with the wall time of
each, the accuracy and text tables), the lab's mean + band figures and its own figure: one panel per
variant with each seed's entropy over steps, h_tgt as a dashed line, the steps STARE's gate was open
shaded and each collapse flag marked. ``report.md`` ends with what did not reproduce and why (each
claim's measured reason, and the claims whose runs are missing). ``entropyrl report DIR`` runs it again
from the files, and ``entropyrl report DIR --docs docs/real-model.md`` puts the report into the docs page.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402

from ...conf import compose  # noqa: E402
from ...trainers.run.regime import entropy_flags  # noqa: E402
from ..ablation import variants_of  # noqa: E402
from ..jobs import read_job_state  # noqa: E402
from ..state import DONE  # noqa: E402
from .claims import GATE_KEY, acted_share, entropy_ends, final_value, finite_values  # noqa: E402
from .explain import explain_claims  # noqa: E402
from .null_controls import declare_nulls  # noqa: E402
from .real_model_claims import CLAIM_VARIANTS, accuracy_table, real_model_claims, text_table  # noqa: E402
from .report import finish_panels, panel_grid, style_panel, write_study_report  # noqa: E402
from .study_runs import read_study_runs  # noqa: E402

__all__ = ["real_model_report_step", "plot_runs", "run_table", "gate_spans", "CURVES_FIGURE", "ABLATION"]

CURVES_FIGURE = "real-model-entropy-runs.png"
ABLATION = "real_model"
BASE_PRESET = "experiment=smollm2_word_problems"  # the study's base, for h_tgt and pass_k when no run saved a config


def gate_spans(rows: list[dict], key: str = GATE_KEY) -> list[tuple[float, float]]:
    """The step ranges ``(start - 0.5, end + 0.5)`` over which ``key`` was open (> 0.5) on consecutive
    logged steps; ``[]`` for a run that logged no gate."""
    spans: list[list[float]] = []
    last = None
    for r in rows:
        g, step = r.get(key), r.get("step")
        if not isinstance(g, (int, float)) or step is None:
            continue
        if g > 0.5:
            if spans and last is not None and int(step) == last + 1 and spans[-1][1] == last + 0.5:
                spans[-1][1] = int(step) + 0.5
            else:
                spans.append([int(step) - 0.5, int(step) + 0.5])
        last = int(step)
    return [(a, b) for a, b in spans]


def plot_runs(
    runs: dict[str, dict[int, list[dict]]], path: Path, h_tgt: float | None, algo_cfgs: dict | None = None
) -> Path | None:
    """One panel per variant: each seed's entropy over steps (a line per seed), ``h_tgt`` dashed, the
    steps each seed's gate was open shaded in that seed's colour, and each collapse flag's step marked
    with an x; None when no run logged entropy."""
    algo_cfgs = algo_cfgs or {}
    panels = [(v, by_seed) for v, by_seed in runs.items() if any(finite_values(rows, "entropy") for rows in by_seed.values())]
    if not panels:
        return None
    fig, axes = panel_grid(len(panels), (5.4, 3.3))
    for ax, (variant, by_seed) in zip(axes.flat, panels):
        gated = False
        for i, (seed, rows) in enumerate(sorted(by_seed.items())):
            pts = [(int(r["step"]), float(r["entropy"])) for r in rows if isinstance(r.get("entropy"), (int, float))]
            if not pts:
                continue
            color = f"C{i}"
            ax.plot([s for s, _ in pts], [h for _, h in pts], lw=1.3, color=color, label=f"seed {seed}")
            for a, b in gate_spans(rows):
                ax.axvspan(a, b, color=color, alpha=0.12 / max(1, len(by_seed)) * 2, lw=0)
                gated = True
            for f in entropy_flags(rows, algo_cfgs.get(variant, {})):
                if f["id"] == "collapse":
                    ev = f.get("evidence") or {}
                    ax.plot([ev.get("step", f["first_step"])], [ev.get("value", np.nan)], "x", color=color, ms=7, mew=2)
        if h_tgt is not None:
            ax.axhline(h_tgt, color="0.35", ls="--", lw=1, label=f"h_tgt {h_tgt:g}")
        style_panel(ax, f"{variant}" + (" (shaded: gate open)" if gated else ""))
    return finish_panels(
        fig,
        axes,
        len(panels),
        "entropy (nats/token)",
        "entropy per run: one line per seed, x = collapse flag, shaded = STARE's gate open",
        path,
    )


def run_table(runs: dict, statuses: list, algo_cfgs: dict, pass_key: str) -> list[dict]:
    """One row per finished training run: its steps, wall time (``job.json``: start to end) and seconds
    per step, entropy first and last tenth and lowest, the step of its collapse flag, the share of steps
    its gate was open, and its final validation accuracy and pass@k."""
    out = []
    for st in statuses:
        rows = (runs.get(st.variant) or {}).get(st.seed)
        if st.state != DONE or not rows:
            continue
        job = read_job_state(Path(st.output_dir))
        wall = float(job["ended"] - job["started"]) if job.get("started") and job.get("ended") else float("nan")
        ent = finite_values(rows, "entropy")
        first, last = entropy_ends(rows)
        flag = next((f for f in entropy_flags(rows, algo_cfgs.get(st.variant, {})) if f["id"] == "collapse"), None)
        out.append(
            {
                "variant": st.variant,
                "seed": st.seed,
                "steps": len(ent),
                "wall_seconds": wall,
                "seconds_per_step": wall / len(ent) if ent and math.isfinite(wall) else float("nan"),
                "entropy_first_tenth": first,
                "entropy_last_tenth": last,
                "entropy_min": min(ent) if ent else float("nan"),
                "collapse_step": flag["first_step"] if flag else None,
                "gate_open": acted_share(rows, GATE_KEY),
                "val_acc": final_value(rows, "val/acc"),
                "pass_at_k": final_value(rows, pass_key),
            }
        )
    return out


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.0%}"


def _ms(vals: list[float], digits: int = 3) -> str:
    vals = [v for v in vals if math.isfinite(v)]
    if not vals:
        return "-"
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals):.{digits}f}" if len(vals) > 1 else f"{vals[0]:.{digits}f}"


def _sections(
    claims: list[dict], table: list[dict], acc: list[dict], text: list[dict], h_tgt: float, pass_key: str, figure: bool
):
    k = pass_key.split("/")[-1].replace("pass_at_", "pass@")
    lines = ["## Entropy per run, h_tgt and STARE's gate", ""]
    lines += (
        [
            f"![entropy per run]({CURVES_FIGURE})",
            "",
            f"One panel per method, one line per seed; the dashed line is STARE's h_tgt ({h_tgt:g}); shaded: the steps "
            "STARE's gate was open (`stare/gate_on`), in the seed's colour; x: the step a run's collapse flag fired.",
            "",
        ]
        if figure
        else ["(no run logged entropy)", ""]
    )
    lines += [
        "## Runs: wall time and entropy",
        "",
        "Wall time: the job's start to its end (`job.json`: model load, every step, validations, attribution and checkpoints).",
        "",
        f"| variant | seed | steps | wall time (min) | s/step | entropy first tenth | last tenth | lowest | collapse flag "
        f"at step | gate open | final val acc | final {k} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        wall = t["wall_seconds"]
        lines.append(
            f"| {t['variant']} | {t['seed']} | {t['steps']} | {_f(wall / 60 if math.isfinite(wall) else wall, 1)} | "
            f"{_f(t['seconds_per_step'], 1)} | {_f(t['entropy_first_tenth'])} | {_f(t['entropy_last_tenth'])} | "
            f"{_f(t['entropy_min'])} | {t['collapse_step'] if t['collapse_step'] is not None else 'none'} | "
            f"{_pct(t['gate_open'])} | {_f(t['val_acc'])} | "
            f"{_f(t['pass_at_k'])} |"
        )
    lines += [
        "",
        "## Accuracy side by side (final validation, mean ± std over seeds)",
        "",
        f"| variant | seeds | val acc | pass@1 | {k} | val acc minus GRPO's (mean) | costs accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in acc:
        diff = _ms(a["acc_minus_grpo"]) if a["variant"] != "grpo" else "-"
        costs = "yes: below GRPO on every seed" if a["costs_accuracy"] else ("-" if a["variant"] == "grpo" else "no")
        lines.append(
            f"| {a['variant']} | {','.join(map(str, a['seeds']))} | {_ms(a['val_acc'])} | {_ms(a['pass_at_1'])} | "
            f"{_ms(a['pass_at_k'])} | {diff} | {costs} |"
        )
    lines += ["", "## The model's text: reflection and repetition (first tenth -> last tenth, mean over seeds)", ""]
    if text:
        lines += ["| variant | metric | first tenth | last tenth |", "|---|---|---|---|"]
        lines += [f"| {t['variant']} | `{t['key']}` | {_f(t['first_mean'])} | {_f(t['last_mean'])} |" for t in text]
    else:
        lines.append("(no run logged the text metrics: diagnostics.reflection off)")
    lines += ["", "## What does not reproduce, and why", ""]
    failed = [c for c in claims if c["reproduced"] is False]
    missing = [c for c in claims if c["reproduced"] is None and not c.get("descriptive")]
    if not failed and not missing:
        lines.append("Every claim was reproduced.")
    for c in failed:
        lines.append(f"- `{c['id']}`: not reproduced. {c.get('reason') or c['measured']}")
    for c in missing:
        lines.append(f"- `{c['id']}`: {c.get('reason') or 'not run'}")
    return [*lines, ""]


def _stare_preset() -> list[str]:
    """The overrides of the ablation's STARE variant over its base (``h_tgt`` when no STARE run finished)."""
    abl = compose("sweep", [f"ablation={ABLATION}"]).ablation
    return [*abl.base, *next((list(v.overrides) for v in variants_of(abl) if v.name == "stare"), [])]


def real_model_report_step(sweep_dir: Path, sweep: dict, statuses: list, log: Callable[[str], None] = print) -> dict:
    """The real-model claims, ``lab.json``, ``report.md`` and the figures in ``sweep_dir``; returns
    ``{"paths", "claims", "metrics": {"claims/<id>": 1.0 | 0.0}}``."""
    stare = _stare_preset()
    study = read_study_runs(sweep, statuses, stare_preset=stare, base_preset=stare)
    runs, algo_cfgs, h_tgt, pass_key = study.runs, study.algo_cfgs, study.h_tgt, study.pass_key
    claims = real_model_claims(runs, h_tgt=h_tgt, algo_cfgs=algo_cfgs, pass_key=pass_key)
    claims = explain_claims(claims, runs, claim_variants=CLAIM_VARIANTS)  # why entropy moved, from the attribution
    claims = declare_nulls(claims)  # each claim's null control, in words (null_controls.py)
    table = run_table(runs, statuses, algo_cfgs, pass_key)
    acc, text = accuracy_table(runs, pass_key), text_table(runs)
    out = Path(sweep_dir)
    out.mkdir(parents=True, exist_ok=True)
    figure = plot_runs(runs, out / CURVES_FIGURE, h_tgt, algo_cfgs)
    return write_study_report(
        out,
        study,
        claims,
        name="real-model",
        title="entropyrl lab report: the real model (SmolLM2-135M-Instruct)",
        sections=_sections(claims, table, acc, text, h_tgt, pass_key, figure is not None),
        extra={"runs": table, "accuracy": acc, "text": text, "h_tgt": h_tgt},
        figures={"entropy_runs": figure},
        log=log,
    )
