"""A finished run's own records as a report reads them back: its ``summary.json`` and its saved
``config.yaml``, each with the reason it cannot be believed when it cannot (missing, not whole, not
a mapping), so that a report says which record of which run it did without instead of reading a
damaged file as an empty one."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from ..conf import to_plain
from ..trainers.run.regime import entropy_flags, regime_warnings

__all__ = ["read_summary", "read_saved_config", "read_tracking_run", "run_findings"]


def _why(exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError):
        return "missing"
    text = str(exc).strip().splitlines()
    return f"not whole ({type(exc).__name__}: {text[0] if text else '-'})"


def read_summary(output_dir: Path) -> tuple[dict | None, str | None]:
    """``(summary, None)`` from the run's ``summary.json``, or ``(None, why)`` when it is missing,
    not whole JSON or not an object."""
    try:
        summary = json.loads((Path(output_dir) / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"summary.json is {_why(exc)}"
    return (summary, None) if isinstance(summary, dict) else (None, "summary.json is not a JSON object")


def read_tracking_run(output_dir: Path) -> str | None:
    """The MLflow run id of the run's ``tracking.json``; None when it has none or it cannot be read
    (the id is a link shown beside the run, nothing is computed from it)."""
    try:
        return json.loads((Path(output_dir) / "tracking.json").read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def read_saved_config(output_dir: Path) -> tuple[dict | None, str | None]:
    """``(config, None)``: the run's saved ``config.yaml`` as plain containers, or ``(None, why)``
    when it is missing, not whole YAML or not a mapping."""
    try:
        cfg = to_plain(OmegaConf.load(Path(output_dir) / "config.yaml"))
    except Exception as exc:  # noqa: BLE001 - OmegaConf and yaml raise several kinds for a damaged file
        return None, f"config.yaml is {_why(exc)}"
    return (cfg, None) if isinstance(cfg, dict) else (None, "config.yaml is not a mapping")


def run_findings(output_dir: Path, rows: list[dict], problems: list[str]) -> dict:
    """``{"warnings": [...], "flags": [...]}``: the finished run's (``output_dir``, its metrics ``rows``) regime warnings and entropy flags as its ``summary.json`` lists them. Where
    the summary is missing or not whole, they are recomputed from the run's metrics rows and saved
    config (what the run's end computed: ``regime.report_regime``), and where the config cannot be
    read either they are unknown (``"unknown": True``, shown as ``?``); each such run is one line in
    ``problems``. A saved config that cannot be read is one line too: a study's report step then takes
    that run's settings from another seed's config or from its presets."""
    out = Path(output_dir)
    summary, why = read_summary(out)
    cfg, why_cfg = read_saved_config(out)
    if why_cfg:
        problems.append(
            f"{out}: {why_cfg}: the run's settings cannot be read back (a lab study takes them from another seed's config or its presets)"
        )
    if summary is not None:
        return {k: [f for f in summary.get(k) or [] if isinstance(f, dict) and "id" in f] for k in ("warnings", "flags")}
    if cfg is None:
        problems.append(f"{out}: {why}: its regime warnings and entropy flags are unknown (shown as ?)")
        return {"warnings": [], "flags": [], "unknown": True}
    problems.append(f"{out}: {why}: its regime warnings and entropy flags were recomputed from metrics.jsonl and config.yaml")
    algo = cfg.get("algo") or {}
    return {"warnings": regime_warnings(rows, algo, cfg.get("data")), "flags": entropy_flags(rows, algo)}
