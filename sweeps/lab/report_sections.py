"""The sections of the lab's ``report.md``, as markdown lines: the claim table, the variants' table,
why entropy moved (the attribution) and the quadrant sign experiment, with the header and the figures'
links (``report_md``). ``report.write_lab_outputs`` draws the figures and writes the files.
"""

from __future__ import annotations

import math

import numpy as np

from .claims import THEORY


def _ms(vals: list[float]) -> str:
    vals = [v for v in vals if math.isfinite(v)]
    if not vals:
        return "-"
    return f"{np.mean(vals):.3f} ± {np.std(vals):.3f}" if len(vals) > 1 else f"{vals[0]:.3f}"


def _gate_cell(shares: list[float]) -> str:
    """The gate's open share per seed (``stare/gate_on``, share of steps), ``-`` for a variant without a gate."""
    shares = [x for x in shares if math.isfinite(x)]
    return "/".join(f"{x:.0%}" for x in shares) if shares else "-"


def claim_status(claim: dict) -> str:
    """``yes`` | ``no`` (reproduced or not) | ``no claim`` (the method states none the lab can
    measure, a ``LabClaim`` of kind ``none``) | ``descriptive`` (a measured row that claims no direction,
    ``tool_claims.tool_entropy_by_kind``) | ``not run`` (the runs it needs are missing)."""
    if claim.get("no_claim"):
        return "no claim"
    if claim.get("descriptive"):
        return "descriptive" if claim.get("measured") else "not run"
    return {True: "yes", False: "no", None: "not run"}[claim["reproduced"]]


def _claims_md(claims: list[dict]) -> list[str]:
    lines = [
        "| claim | measured | reproduced | why not (measured) | why entropy moved (attribution, first seed) |",
        "|---|---|---|---|---|",
    ]
    for c in claims:
        rep = claim_status(c)
        null = f" Null control: {c['null_control']}." if c.get("null_control") else ""
        lines.append(
            f"| `{c['id']}`: {c['claim']}{null} | {c['measured'] or '-'} | {rep} | {c.get('reason', '')} | "
            f"{c.get('attribution_text', '')} |"
        )
    return lines


def _attribution_md(table: list[dict]) -> list[str]:
    """Per variant: how well predicted_net tracks the realised probe change, and the parts' shares."""
    rows = [t for t in table if t.get("attribution")]
    if not rows:
        return ["(no run measured the attribution: diagnostics.attribution=false)"]
    lines = [
        "| variant | predicted_net vs realised: r detrended | slope | "
        "first order (predicted_net_1st): r detrended | slope | "
        "parts' share of the effect after step 1 (mean over seeds) |",
        "|---|---|---|---|---|---|",
    ]
    for t in rows:
        a = t["attribution"]
        share = {p: float(np.mean(v)) for p, v in (a.get("share_after_first") or a["share"]).items()}
        top = sorted(share, key=lambda p: -abs(share[p]))[:5]
        lines.append(
            f"| {t['variant']} | {_ms(a['r_detrended'])} | {_ms(a['slope'])} | "
            f"{_ms(a.get('r_detrended_1st', []))} | {_ms(a.get('slope_1st', []))} | "
            + ", ".join(f"{p} {share[p]:+.0%}" for p in top)
            + " |"
        )
    return lines


def quadrant_comparison(quadrants: dict) -> dict:
    """Per quadrant over seeds and batches: the realised change, the network's first-order prediction
    (``predicted``) and the tabular-softmax formula's (``tabular``): means, each one's share of the
    four quadrants' absolute sum, and how often the prediction's sign is the realised one."""
    out = {}
    for q in THEORY:
        real = np.concatenate([np.asarray(quadrants[s].get(q, []), dtype=float) for s in quadrants] or [np.zeros(0)])
        row = {"realised": float(real.mean()) if real.size else float("nan"), "n": int(real.size)}
        for kind in ("predicted", "tabular"):
            vals = [np.asarray((quadrants[s].get(kind) or {}).get(q, []), dtype=float) for s in quadrants]
            v = np.concatenate(vals) if vals else np.zeros(0)
            row[kind] = float(v.mean()) if v.size else float("nan")
            row[f"{kind}_sign_agreement"] = (
                float(np.mean(np.sign(v) == np.sign(real))) if v.size == real.size and v.size else float("nan")
            )
        out[q] = row
    for kind in ("realised", "predicted", "tabular"):
        total = sum(abs(out[q][kind]) for q in THEORY if math.isfinite(out[q][kind]))
        for q in THEORY:
            out[q][f"{kind}_share"] = abs(out[q][kind]) / total if total > 0 and math.isfinite(out[q][kind]) else float("nan")
    return out


def _quadrants_md(quadrants: dict) -> list[str]:
    if not quadrants:
        return ["(quadrant experiment not run)"]
    lines = [
        "| quadrant | theory | " + " | ".join(f"seed {s}: mean ± std (n, sign held)" for s in sorted(quadrants)) + " |",
        "|---|---|" + "---|" * len(quadrants),
    ]
    names = {
        "q1": "Q1 exploitation (A>0, low surprisal)",
        "q2": "Q2 exploration (A>0, high surprisal)",
        "q3": "Q3 suppression (A<0, high surprisal)",
        "q4": "Q4 error-correction (A<0, low surprisal)",
    }
    for q, sign in THEORY.items():
        cells = []
        for s in sorted(quadrants):
            v = np.asarray(quadrants[s].get(q, []), dtype=float)
            cells.append(f"{v.mean():+.2e} ± {v.std():.1e} ({v.size}, {np.mean(np.sign(v) == sign):.0%})" if v.size else "-")
        lines.append(f"| {names[q]} | {'raises' if sign > 0 else 'lowers'} | " + " | ".join(cells) + " |")
    comp = quadrant_comparison(quadrants)
    if any(math.isfinite(comp[q]["predicted"]) for q in THEORY):
        lines += [
            "",
            "Predicted beside realised (all seeds and batches): the network's first-order prediction "
            "(g_H . dtheta) and the tabular-softmax formula (each position its own logit table; its values are at the "
            "trained tokens' positions, so only its signs and shares compare).",
            "",
            "| quadrant | realised mean | network prediction (sign agrees) | share: realised / network / tabular |",
            "|---|---|---|---|",
        ]
        for q in THEORY:
            c = comp[q]
            lines.append(
                f"| {q} | {c['realised']:+.2e} | {c['predicted']:+.2e} ({c['predicted_sign_agreement']:.0%}) | "
                f"{c['realised_share']:.0%} / {c['predicted_share']:.0%} / {c['tabular_share']:.0%} |"
            )
    return lines


def _header_md(
    title: str, command: str, n_variants: int, wall_seconds: float, job_seconds: float | None, failed: list[str]
) -> list[str]:
    """The title, the command with its times, and the failed runs."""
    took = f"{wall_seconds / 60:.1f} min from the first job's start to the last one's end"
    if job_seconds is not None:
        took += f", {job_seconds / 60:.1f} min of job time summed over the jobs (they may overlap; a resumed sweep's wall includes its pause)"
    lines = [f"# {title}", "", f"`{command}`: {n_variants} variants, {took}.", ""]
    if failed:
        lines += [f"**Failed runs** (see their log.txt): {', '.join(failed)}", ""]
    return lines


def _variants_md(table: list[dict], k: str) -> list[str]:
    """The variants' table: entropy ends, accuracies, prediction fit, gate, warnings and flags."""
    k_label = "pass@k" if k == "pass_at_0" else k.replace("pass_at_", "pass@")  # val.pass_k=0: none sampled
    lines = [
        "## Variants (mean ± std over seeds)",
        "",
        f"| variant | entropy first tenth | entropy last tenth | val acc | pass@1 | {k_label} | pred/realised r (detrended) | "
        "gate open (share of steps, per seed) | warnings | flags |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        lines.append(
            f"| {t['variant']} | {_ms(t['entropy_first_tenth'])} | {_ms(t['entropy_last_tenth'])} | {_ms(t['val_acc'])} | "
            f"{_ms(t['pass@1'])} | {_ms(t[k])} | {_ms(t['pred_r_detrended'])} | {_gate_cell(t['gate_open'])} | "
            f"{t['warnings']} | {t['flags']} |"
        )
    return lines


def _why_entropy_moved_md(table: list[dict]) -> list[str]:
    return [
        "",
        "## Why entropy moved (attribution, every 10 steps)",
        "",
        "`entropy_change/predicted_net` = sum over the step's optimizer steps of the mean of dH_probe/dtheta "
        "at the optimizer step's start and end . its parameter change (the trapezoid), and `predicted_net_1st` "
        "with the gradient at the start only (first order), each split into parts that add up to it "
        "(`attribution/<part>`, `attribution_1st/<part>`; docs/algorithms.md §6); each run's "
        "figure is `runs/<variant>/s<seed>/why_entropy_moved.png`.",
        "",
        *_attribution_md(table),
    ]


def report_md(
    title: str,
    command: str,
    runs: dict,
    claims: list[dict],
    table: list[dict],
    figures: set[str],
    *,
    pass_key: str,
    wall_seconds: float,
    job_seconds: float | None,
    failed: list[str],
    sections: list[str] | None,
    quadrants: dict | None,
) -> str:
    """The text of ``report.md``: ``claims`` with their status, ``table`` (``variant_table``), the figures
    drawn (``figures``: their names), the study's own ``sections`` after the entropy figure, and the
    quadrant experiment unless ``quadrants`` is None."""
    k = pass_key.split("/")[-1]
    lines = _header_md(title, command, len(runs), wall_seconds, job_seconds, failed)
    lines += ["## Claims", "", *_claims_md(claims), "", "## Entropy", "", "![entropy](lab-entropy.png)", ""]
    if "pass1" in figures:
        lines += [f"![pass@1](lab-pass1.png) ![{k}](lab-passk.png)", ""]
    if "extreme" in figures:
        lines += ["![stress test](lab-extreme.png)", ""]
    lines += list(sections or [])
    lines += _variants_md(table, k)
    lines += _why_entropy_moved_md(table)
    if quadrants is not None:
        lines += [
            "",
            "## Quadrant sign experiment",
            "",
            "One plain-SGD step restricted to one quadrant's tokens, from the starting policy; realised entropy "
            "change on the fixed probe batch (nats/token).",
            "",
            *_quadrants_md(quadrants),
        ]
    lines.append("")
    return "\n".join(lines)
