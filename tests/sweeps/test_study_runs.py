"""read_study_runs: a report's settings come from what its finished runs ran, the presets only when none did."""

from __future__ import annotations

import json
from types import SimpleNamespace

from entropyrl.conf import compose
from entropyrl.sweeps.lab.study_runs import read_study_runs


def _sweep(tmp_path, runs: dict[str, str | None]):
    """A sweep folder with one finished seed per variant; ``runs[variant]`` is its config.yaml text (None: none)."""
    jobs, statuses = [], []
    for variant, config in runs.items():
        d = tmp_path / "runs" / variant / "s0"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "entropy": 0.5}) + "\n")
        if config is not None:
            (d / "config.yaml").write_text(config)
        jobs.append({"key": f"{variant}/s0", "variant": variant, "seed": 0, "overrides": [], "output_dir": str(d)})
        statuses.append(SimpleNamespace(key=f"{variant}/s0", variant=variant, seed=0, state="done", output_dir=str(d)))
    return {"jobs": jobs, "train_overrides": ["val.pass_k=6"]}, statuses


def test_the_settings_are_the_finished_runs_not_the_presets(tmp_path):
    sweep, statuses = _sweep(
        tmp_path,
        {
            "grpo": "algo: {name: grpo}\nval: {pass_k: 3}\n",
            "stare_k2": "algo: {name: grpo, stare: {h_tgt: 0.123}}\nval: {pass_k: 3}\n",
            "broken": ": not yaml [",
        },
    )
    presets = dict(stare_preset=["experiment=lab_stare"], base_preset=["experiment=lab_grpo"])
    study = read_study_runs(sweep, statuses, **presets, is_stare=lambda v: v.startswith("stare"))
    assert study.h_tgt == 0.123 and study.pass_key == "val/pass_at_3"
    assert set(study.runs) == {"grpo", "stare_k2", "broken"} and study.algo_cfgs["broken"] == {}
    assert study.every_job == ["val.pass_k=6"] and study.quadrants == {}
    # null: a STARE run the predicate does not call STARE gives no h_tgt; the preset (with the sweep's
    # overrides for every job) does
    study = read_study_runs(sweep, statuses, **presets)
    assert study.h_tgt == compose("train", ["experiment=lab_stare", "val.pass_k=6"]).algo.stare.h_tgt != 0.123


def test_a_sweep_with_no_finished_run_takes_its_settings_from_the_presets_and_the_sweeps_overrides(tmp_path):
    sweep, statuses = _sweep(tmp_path, {})
    study = read_study_runs(sweep, statuses, stare_preset=["experiment=lab_stare"], base_preset=["experiment=lab_grpo"])
    assert study.runs == {} and study.pass_key == "val/pass_at_6"
    assert study.h_tgt == compose("train", ["experiment=lab_stare"]).algo.stare.h_tgt


def _with_quadrant_job(tmp_path, text: str):
    """A sweep with one finished quadrant job whose quadrants.json holds ``text``."""
    sweep, statuses = _sweep(tmp_path, {"grpo": "algo: {name: grpo}\n"})
    d = tmp_path / "runs" / "quadrants" / "s1"
    d.mkdir(parents=True)
    (d / "quadrants.json").write_text(text)
    sweep["jobs"].append(
        {
            "key": "quadrants/s1",
            "variant": "quadrants",
            "seed": 1,
            "overrides": [],
            "output_dir": str(d),
            "extra": {"kind": "quadrants"},
        }
    )
    statuses.append(SimpleNamespace(key="quadrants/s1", variant="quadrants", seed=1, state="done", output_dir=str(d)))
    return sweep, statuses


def test_a_quadrant_result_that_is_not_whole_is_one_error_line_not_a_seed_quietly_lost(tmp_path):
    import pytest

    from entropyrl.core.errors import UserError

    presets = dict(stare_preset=["experiment=lab_stare"], base_preset=["experiment=lab_grpo"])
    whole = json.dumps({"q1": [0.1], "q2": [0.2]})
    study = read_study_runs(*_with_quadrant_job(tmp_path / "whole", whole), **presets)
    assert study.quadrants == {1: {"q1": [0.1], "q2": [0.2]}}  # null: a whole result reads as written
    for name, text in (("cut", whole[: len(whole) // 2]), ("list", "[1, 2]")):
        with pytest.raises(UserError, match=r"quadrants/s1's quadrant result\) cannot be read .*--resume"):
            read_study_runs(*_with_quadrant_job(tmp_path / name, text), **presets)
