"""Resume continues only the same run: a folder holding a run with other settings is refused with the
differing keys listed; trainer.resume=never refuses a folder that holds a run; overwrite starts a
fresh run (new MLflow run, old checkpoints and metrics gone). Real training runs, a real MLflow
sqlite store, the CLI as a subprocess where the one-line error matters."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.trainers.run.run_dir import FIGURES, RUN_FILES, config_differences

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def overrides(workdir: Path, fast_train: list[str], *extra: str) -> list[str]:
    return [
        *fast_train,
        "output_dir=run",
        "trainer.threads=1",
        "trainer.val_every=0",
        "val.prompts=0",
        f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}",
        *extra,
    ]


def train(workdir: Path, fast_train: list[str], *extra: str, log: list | None = None) -> dict:
    from entropyrl.trainers.trainer import train as run_training

    return run_training(
        compose("train", overrides(workdir, fast_train, *extra)), log=(log.append if log is not None else lambda *_: None)
    )


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_in_mlflow(workdir: Path, run_id: str) -> list[int]:
    with sqlite3.connect(workdir / "mlflow.db") as db:
        return [
            s for (s,) in db.execute("select step from metrics where run_uuid = ? and key = 'entropy' order by step", (run_id,))
        ]


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))


def folder_state(run_dir: Path) -> dict:
    # .lock names the process that last held the folder (a refused in-process run held it a moment)
    return {p.relative_to(run_dir).as_posix(): p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.name != ".lock"}


@pytest.mark.slow
def test_a_run_with_other_settings_is_refused_and_run_length_may_change(in_tmp, fast_train):
    first = train(in_tmp, fast_train, "trainer.total_steps=2")
    run_dir = in_tmp / "run"
    before = folder_state(run_dir)
    # The reported case: GRPO run continued as STARE. One line, the differing keys, how to start fresh.
    out = subprocess.run(
        [*CLI, "train", *overrides(in_tmp, fast_train, "algo=stare", "trainer.total_steps=3")],
        cwd=in_tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: output_dir=run holds a run with other settings"), out.stderr
    for fragment in (
        "algo.name: grpo -> stare",
        "algo.clip.high: 0.2 -> 0.28",
        "trainer.resume=overwrite",
        "another output_dir=",
    ):
        assert fragment in lines[0], fragment
    assert folder_state(run_dir) == before  # nothing touched
    with pytest.raises(UserError, match=r"optim.lr: 0.0003 -> 0.001"):
        train(in_tmp, fast_train, "trainer.total_steps=3", "optim.lr=1e-3")
    # Run length and logging options may change: this continues the same run.
    second = train(
        in_tmp,
        fast_train,
        "trainer.total_steps=3",
        "trainer.progress=false",
        "trainer.keep_checkpoints=3",
        "diagnostics.entropy_change=true",
    )
    assert second["mlflow_run_id"] == first["mlflow_run_id"]
    assert [r["step"] for r in rows(run_dir)] == [1, 2, 3]
    assert steps_in_mlflow(in_tmp, first["mlflow_run_id"]) == [1, 2, 3]


@pytest.mark.slow
def test_resume_never_refuses_and_overwrite_starts_a_fresh_run(in_tmp, fast_train):
    first = train(in_tmp, fast_train, "trainer.total_steps=2")
    run_dir = in_tmp / "run"
    # everything a run writes at the top of its folder (its writers' lock aside) is something overwrite deletes
    assert {p.name for p in run_dir.iterdir()} - {"checkpoints", ".lock"} <= set(RUN_FILES)
    (run_dir / FIGURES["tools"]).write_bytes(b"an earlier tool run's figure")  # one this run does not draw
    first_rows = rows(run_dir)
    before = folder_state(run_dir)
    with pytest.raises(
        UserError,
        match=r"already holds a run \(checkpoints up to step 2, metrics.jsonl, an MLflow "
        r"run link.*trainer.resume=overwrite",
    ):
        train(in_tmp, fast_train, "trainer.total_steps=3", "trainer.resume=never")
    assert folder_state(run_dir) == before
    log: list[str] = []
    fresh = train(in_tmp, fast_train, "trainer.total_steps=3", "trainer.resume=overwrite", log=log)
    assert any("trainer.resume=overwrite: deleted the previous run" in m for m in log), log
    assert not (run_dir / FIGURES["tools"]).exists()  # no figure of the old run beside the new run's
    assert not any("resumed from" in m for m in log)
    assert fresh["mlflow_run_id"] != first["mlflow_run_id"]
    assert steps_in_mlflow(in_tmp, fresh["mlflow_run_id"]) == [1, 2, 3]  # the new run gets its metrics
    assert steps_in_mlflow(in_tmp, first["mlflow_run_id"]) == [1, 2]  # the old one is left as it was
    new_rows = rows(run_dir)
    assert [r["step"] for r in new_rows] == [1, 2, 3]
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("time/")}  # noqa: E731
    assert strip(new_rows[0]) == strip(first_rows[0])  # started from scratch: same seed, same step 1
    assert checkpoint_steps(run_dir) == [2, 3]
    # and a plain re-run continues the new run
    again = train(in_tmp, fast_train, "trainer.total_steps=4")
    assert again["mlflow_run_id"] == fresh["mlflow_run_id"]


def test_only_run_length_and_logging_keys_may_differ():
    a = {
        "algo": {"name": "grpo"},
        "trainer": {"total_steps": 2, "lr": 0.1, "progress": True, "threads": 1},
        "tracking": {"run_name": "x"},
        "val": {"prompts": 4},
        "output_dir": "a",
    }
    b = {
        "algo": {"name": "grpo"},
        "trainer": {"total_steps": 9, "lr": 0.1, "progress": False, "threads": 2},
        "tracking": {"run_name": "y"},
        "val": {"prompts": 8},
        "output_dir": "/abs/a",
    }
    assert config_differences(a, b) == []
    b["trainer"]["lr"] = 0.2
    b["rollout"] = {"n": 4}
    assert config_differences(a, b) == [("rollout.n", "<absent>", 4), ("trainer.lr", 0.1, 0.2)]


# Interventions that carry state from step to step (a controller's integral, an adaptive coefficient
# and the sums it reads, a gate, an anchor, a random pick's counter). A resumed run must continue
# exactly where the uninterrupted one would be: same seed, same steps, every logged value equal.
STATEFUL = {
    "aent": ["algo.aent.warmup_steps=0"],  # the coefficient moves from step 2 on
    "entropic": [],
    "siren": [],
    "stare": [],
    "adaptive_entropy": [],
    "clip_cov": [],
}


def same(x, y) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(STATEFUL))
def test_a_resumed_run_continues_exactly_where_it_stopped(tmp_path, fast_train, algo):
    from entropyrl.trainers.trainer import train as run_training

    def run(folder: str, steps: int) -> None:
        run_training(
            compose(
                "train",
                [
                    *fast_train,
                    f"algo={algo}",
                    *STATEFUL[algo],
                    f"output_dir={tmp_path / folder}",
                    f"trainer.total_steps={steps}",
                    "trainer.threads=1",
                    "trainer.val_every=0",
                    "val.prompts=0",
                    f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                ],
            ),
            log=lambda *_: None,
        )

    run("whole", 4)
    run("resumed", 2)
    run("resumed", 4)  # continues from the step-2 checkpoint
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("time/")}  # noqa: E731
    whole, resumed = [strip(r) for r in rows(tmp_path / "whole")], [strip(r) for r in rows(tmp_path / "resumed")]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(whole[2:], resumed[2:]):
        diff = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if not same(a.get(k), b.get(k))}
        assert not diff, f"step {a['step']}: {diff}"
