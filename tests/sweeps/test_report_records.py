"""A finished run's records that a report reads back (``summary.json``, ``config.yaml``) are believed
only when whole: a damaged summary read as an empty one took the run's collapse flag out of the sweep
report without a word. Now its findings are recomputed from the metrics and the saved config (what the
run's end computed), or shown as unknown, and the report says which file of which run."""

from __future__ import annotations

import json
from types import SimpleNamespace

from entropyrl.sweeps.lab.study_runs import collect_lab_runs
from entropyrl.sweeps.report import build_report
from entropyrl.trainers.run.regime import entropy_flags, regime_warnings

ALGO = {"name": "grpo"}


def _rows(n: int = 20) -> list[dict]:
    """Entropy 1.0 for half the run, then 0.1: below 0.2 x the first tenth, a collapse."""
    return [{"step": s, "entropy": 1.0 if s <= n // 2 else 0.1, "reward/mean": 0.5} for s in range(1, n + 1)]


def _sweep(tmp_path, seeds=(0,)):
    jobs = []
    for seed in seeds:
        d = tmp_path / "runs" / "grpo" / f"s{seed}"
        d.mkdir(parents=True)
        rows = _rows()
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        (d / "job.json").write_text(json.dumps({"state": "done", "steps": len(rows), "started": 1.0, "ended": 2.0}))
        (d / "config.yaml").write_text(f"algo: {{name: grpo, seed_tag: s{seed}}}\ndata: {{name: toy}}\n")
        found = {"warnings": regime_warnings(rows, ALGO, {"name": "toy"}), "flags": entropy_flags(rows, ALGO)}
        (d / "summary.json").write_text(json.dumps({"status": "FINISHED", "steps": len(rows), **found}))
        jobs.append({"key": f"grpo/s{seed}", "variant": "grpo", "seed": seed, "overrides": [], "output_dir": str(d)})
    sweep = {
        "sweep_id": "records-test",
        "ablation": {"name": "records"},
        "jobs": jobs,
        "launcher": {"name": "local"},
        "tracking": {"enabled": False},
        "train_overrides": [],
    }
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    return sweep, tmp_path / "runs" / "grpo" / "s0"


def _cut(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _report(tmp_path):
    lines: list[str] = []
    result = build_report(tmp_path, log_mlflow=False, log=lines.append)
    job = next(j for j in result["jobs"] if j["key"] == "grpo/s0")
    return result, job, [line for line in lines if line.startswith("warning:")]


def test_whole_records_are_read_as_they_are_and_say_nothing(tmp_path):
    _sweep(tmp_path)
    result, job, warnings = _report(tmp_path)
    assert job["flags"].startswith("collapse@") and warnings == [] and result["record_problems"] == []


def test_a_cut_summary_has_its_findings_recomputed_from_the_metrics_and_config_and_says_so(tmp_path):
    _, run = _sweep(tmp_path)
    whole = _report(tmp_path)[1]["flags"]
    _cut(run / "summary.json")
    result, job, warnings = _report(tmp_path)
    assert job["flags"] == whole and job["flags"].startswith("collapse@")  # not read as "no collapse"
    assert result["variants"]["grpo"]["flags"].startswith("collapse@")
    assert len(warnings) == 1 and f"{run}: summary.json is not whole" in warnings[0] and "recomputed" in warnings[0]


def test_a_run_with_neither_record_readable_shows_its_findings_as_unknown(tmp_path):
    _, run = _sweep(tmp_path)
    _cut(run / "summary.json")
    (run / "config.yaml").write_text(": not yaml [")
    result, job, warnings = _report(tmp_path)
    assert job["flags"] == "?" and job["warnings"] == "?" and result["variants"]["grpo"]["flags"].endswith("(?)")
    assert any("config.yaml is not whole" in w for w in warnings)
    assert any("summary.json is not whole" in w and "unknown" in w for w in warnings)


def test_a_missing_summary_is_said_too(tmp_path):
    _, run = _sweep(tmp_path)
    (run / "summary.json").unlink()
    _, job, warnings = _report(tmp_path)
    assert job["flags"].startswith("collapse@") and any("summary.json is missing" in w for w in warnings)


def test_a_study_takes_a_variants_settings_from_a_seed_whose_config_reads(tmp_path):
    """The first seed's config damaged: the variant's settings were an empty dict (every claim then read
    the defaults); now the next seed's config, and the null: with both whole, the first seed's."""
    sweep, run = _sweep(tmp_path, seeds=(0, 1))
    statuses = [
        SimpleNamespace(key=j["key"], variant=j["variant"], seed=j["seed"], state="done", output_dir=j["output_dir"])
        for j in sweep["jobs"]
    ]
    assert collect_lab_runs(sweep, statuses)[2]["grpo"]["algo"]["seed_tag"] == "s0"
    (run / "config.yaml").write_text(": not yaml [")
    assert collect_lab_runs(sweep, statuses)[2]["grpo"]["algo"]["seed_tag"] == "s1"


def test_a_report_on_a_stopped_sweep_leaves_its_parent_run_killed(tmp_path):
    """`entropyrl report` on a sweep stopped with jobs never submitted set its parent run back to
    RUNNING, with nothing left to follow and close it."""
    from entropyrl.core.tracking import TrackingStore
    from entropyrl.sweeps.report import _log_to_parent
    from entropyrl.sweeps.state import FAILED, PENDING, RUNNING

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = TrackingStore(uri)
    parent = store.open_run("sweeps", "a-sweep")
    store.finish(parent, status="KILLED")
    sweep = {"tracking": {"enabled": True, "uri": uri, "parent_run_id": parent, "experiment": "sweeps"}}
    result = {"files": [], "plots": [], "variants": {}, "counts": {RUNNING: 0, PENDING: 1, FAILED: 0}}
    lines: list[str] = []
    _log_to_parent(sweep, tmp_path, result, lines.append)
    assert not any(line.startswith("warning") for line in lines), lines
    assert TrackingStore(uri).client.get_run(parent).info.status == "KILLED"


def test_a_sweeps_own_tracking_tags_run_name_and_waits_reach_its_runs(tmp_path):
    """The sweep's tracking.tags, run_name, retry_s and flush_wait_s were accepted and read by nothing."""
    from types import SimpleNamespace

    from entropyrl.conf import compose
    from entropyrl.core.tracking import TrackingStore
    from entropyrl.sweeps.following import _Follower
    from entropyrl.sweeps.planning import open_parent_run, tracking_settings

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    given = ["ablation=gate", f"tracking.uri={uri}", "+tracking.tags={team:rl}", "tracking.run_name=mine", "tracking.retry_s=3"]
    tracking = tracking_settings(compose("sweep", given))
    sweep = {"sweep_id": "sw1", "ablation": {"name": "gate"}, "sweep_dir": str(tmp_path), "launcher": {"name": "local"}}
    sweep.update(jobs=[], seeds=[0])
    parent = open_parent_run(tracking, sweep)
    run = TrackingStore(uri).client.get_run(parent)
    assert run.data.tags["team"] == "rl" and run.data.tags["ablation"] == "gate" and run.info.run_name == "mine"
    follower = _Follower.__new__(_Follower)
    follower.sweep, follower.sweep_dir, follower.env = sweep, tmp_path, {}
    follower.tracking = {**tracking, "parent_run_id": parent}
    follower.launcher = SimpleNamespace(in_process=True, raise_job_errors=lambda cfg: False)
    follower.launcher_cfg = None
    record = {"key": "gated/s0", "variant": "gated", "seed": 0, "overrides": ["data=toy"], "output_dir": str(tmp_path / "j")}
    job_cfg = follower._callable(record).config()
    assert job_cfg.tracking.tags["team"] == "rl" and job_cfg.tracking.tags["variant"] == "gated"
    assert job_cfg.tracking.retry_s == 3 and job_cfg.tracking.run_name == "gated-s0"
