"""What the tool prints names what it shows: `config show` prints the interventions the run applies
(not all of them), and a run's ending line names what was validated (no `val acc nan` when only
benchmarks were validated)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from entropyrl.conf import compose, intervention_names, used_settings
from entropyrl.trainers.run.run_report import summarize, validation_text

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def test_config_show_prints_only_the_interventions_the_run_applies():
    out = subprocess.run([*CLI, "config", "show", "algo=steer"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    algo = yaml.safe_load(out.stdout)["algo"]
    others = [n for n in intervention_names() if n != "steer"]
    assert "steer" in algo and not [n for n in others if n in algo]
    assert f"# {len([n for n in others if n in compose('train', ['algo=steer']).algo])} interventions" in out.stdout
    everything = subprocess.run([*CLI, "config", "show", "algo=steer", "--all"], capture_output=True, text=True, timeout=120)
    assert "stare" in yaml.safe_load(everything.stdout)["algo"]


def test_used_settings_keep_the_warm_start_of_the_embedded_model_only():
    # the default task sets the embedded model's warm start; a real model has none to show
    plain, _ = used_settings(compose("train", []))
    assert plain["model"]["warm_start"]["steps"] == 1000
    plain, _ = used_settings(compose("train", ["model=smollm2-135m"]))
    assert "warm_start" not in plain["model"]


def test_used_settings_keeps_tis_when_enabled_and_every_applied_intervention():
    plain, hidden = used_settings(compose("train", ["algo=grpo", "algo.interventions=[stare,clip_cov]"]))
    assert "stare" in plain["algo"] and "clip_cov" in plain["algo"] and "steer" in hidden
    plain, hidden = used_settings(compose("train", ["rollout=vllm", "rollout.tis.enabled=true"]))
    assert "tis" in plain["algo"] and "tis" not in hidden
    plain, hidden = used_settings(compose("train", ["rollout=vllm", "rollout.tis.enabled=false"]))
    assert "tis" not in plain["algo"] and "tis" in hidden


def test_the_ending_line_names_what_was_validated():
    bench_only = [{"step": 1, "entropy": 0.9}, {"step": 2, "entropy": 0.8, "val/math500/avg@4": 0.25, "val/math500/pass@4": 0.5}]
    summary = summarize(bench_only)
    text = validation_text(summary)
    assert text == "val math500 avg@4 0.250" and "nan" not in text
    both = summarize([{"step": 1, "entropy": 0.9, "val/acc": 0.5, "val/aime24/avg@2": 0.0}])
    assert validation_text(both) == "val acc 0.500, val aime24 avg@2 0.000"
    assert validation_text(summarize([{"step": 1, "entropy": 0.9}])) == "no validation"
