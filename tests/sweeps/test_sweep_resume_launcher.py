"""A bare `entropyrl sweep --resume` continues a sweep with the launcher it was started with (its
settings and the thread count its jobs ran with), not this command's defaults; a launcher given on
the command line wins, and is said. The sweep is planned and saved for real (no job runs)."""

from __future__ import annotations

import json
import subprocess
import sys

from entropyrl.conf import compose
from entropyrl.sweeps import planning
from entropyrl.sweeps.state import save_sweep

TRAIN = ["data=toy", "trainer.total_steps=3", "trainer.prompts_per_step=4"]


def _saved_sweep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose(
        "sweep",
        [
            "ablation=gate",
            "seeds=[0]",
            "sweep_dir=outputs/sweeps/gate-20260101-000000",
            "launcher=local",
            "launcher.max_parallel=2",
            "launcher.timeout_min=7",
            "launcher.threads_per_job=auto",
        ],
    )
    plan = planning.plan(cfg, TRAIN, explicit_dir=True, resume=False)
    record = plan.sweep_record(tracking={})
    save_sweep(plan.sweep_dir, record)
    threads = {o for j in record["jobs"] for o in j["overrides"] if o.startswith("trainer.threads=")}
    return record, threads


def test_a_bare_resume_keeps_the_saved_launcher_and_its_jobs_thread_count(tmp_path, monkeypatch):
    record, threads = _saved_sweep(tmp_path, monkeypatch)
    said: list[str] = []
    bare = compose("sweep", ["ablation=gate"])
    assert bare.launcher.max_parallel == 1  # this command's default
    sweep_ov, train_ov = planning.resume_overrides(bare, ["ablation=gate"], [], explicit_dir=False, log=said.append)
    resumed = compose("sweep", sweep_ov)
    assert resumed.launcher.name == "local" and resumed.launcher.max_parallel == 2 and resumed.launcher.timeout_min == 7
    assert len(threads) == 1  # auto, pinned to what the jobs ran with
    assert f"trainer.threads={resumed.launcher.threads_per_job}" in threads
    assert any(m.startswith("--resume: the sweep's own launcher: local") for m in said), said
    again = planning.plan(resumed, train_ov, explicit_dir=False, resume=True).sweep_record(tracking={})
    assert again["launcher"]["max_parallel"] == 2 and again["launcher"]["timeout_min"] == 7  # not the defaults
    assert [j["overrides"] for j in again["jobs"]] == [j["overrides"] for j in record["jobs"]]


def test_a_launcher_on_the_command_line_wins_and_is_said(tmp_path, monkeypatch):
    _saved_sweep(tmp_path, monkeypatch)
    said: list[str] = []
    given = ["ablation=gate", "launcher=debug"]
    sweep_ov, _ = planning.resume_overrides(compose("sweep", given), given, [], explicit_dir=False, log=said.append)
    assert compose("sweep", sweep_ov).launcher.name == "debug"
    assert any("launcher=debug as given, instead of the sweep's own launcher=local" in m for m in said), said


def test_the_cli_dry_run_of_a_bare_resume_names_the_saved_launcher(tmp_path, monkeypatch):
    _saved_sweep(tmp_path, monkeypatch)
    out = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "sweep", "ablation=gate", "--resume", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--resume: the sweep's own launcher: local (max_parallel=2" in out.stderr
    saved = json.loads((tmp_path / "outputs/sweeps/gate-20260101-000000/sweep.json").read_text())
    assert saved["launcher"]["max_parallel"] == 2
