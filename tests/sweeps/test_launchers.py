"""Launchers (sweeps/launchers.py: the protocol, the registry, the built-ins): a new launcher registered
from this file alone runs a sweep end to end; the SLURM launcher's reading of sinfo/squeue answers
and its one-line advice; training keys given to `entropyrl sweep` as they are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import submitit

from entropyrl.cli.main import main
from entropyrl.conf import cfg_get
from entropyrl.core.errors import UserError
from entropyrl.sweeps.launchers import Launcher, QueueEntry, get_launcher, launcher_names, register_launcher
from entropyrl.sweeps.planning import split_overrides
from entropyrl.sweeps.slurm import WAITING, PartitionSize, SlurmLauncher, _gpus, _minutes, oversized

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
TINY = [
    "data=toy",
    "trainer.total_steps=3",
    "trainer.prompts_per_step=4",
    "trainer.mini_batch_prompts=4",
    "trainer.val_every=3",
    "trainer.save_every=0",
    "val.prompts=8",
]


class SlotsLauncher(Launcher):
    """Local processes through submitit's LocalExecutor, under another name and its own keys:
    ``launcher.slots`` jobs at once, ``launcher.cores_per_job`` torch threads each."""

    name = "slots"

    def __init__(self) -> None:
        self.executors: list[submitit.Executor] = []

    def executor(self, cfg, folder: Path) -> submitit.Executor:
        ex = submitit.LocalExecutor(folder)
        ex.update_parameters(timeout_min=float(cfg_get(cfg, "minutes", 30)))
        self.executors.append(ex)
        return ex

    def parallelism(self, cfg) -> int | None:
        return int(cfg_get(cfg, "slots", 1))

    def auto_threads(self, cfg) -> int | None:
        return int(cfg_get(cfg, "cores_per_job", 1))

    def describe(self, cfg) -> str:
        return f"slots ({cfg_get(cfg, 'slots', 1)} at once)"


@pytest.mark.slow
def test_a_launcher_registered_here_runs_a_sweep_end_to_end(in_tmp, capsys):
    launcher = register_launcher(
        SlotsLauncher(), defaults={"slots": 1, "cores_per_job": 1, "minutes": 30, "threads_per_job": "auto"}
    )
    assert "slots" in launcher_names() and get_launcher("slots") is launcher
    with pytest.raises(SystemExit) as ended:
        main(
            [
                "sweep",
                "ablation=clip",
                "variants=[clip_higher,symmetric]",
                "seeds=[0]",
                "launcher=slots",
                "launcher.slots=2",
                "sweep_dir=sw",
                "poll_seconds=0.5",
                *TINY,
            ]
        )
    err = capsys.readouterr().err
    assert ended.value.code == 0, err[-3000:]
    assert "2 jobs (0 done, 0 still queued/running, 2 to run) on slots (2 at once)" in err
    assert "jobs: 0 done, 2 running, 0 pending, 0 failed (of 2)" in err or "jobs: 0 done, 0 running, 2 pending" in err
    assert "2 done, 0 failed" in err
    sweep = json.loads((in_tmp / "sw" / "sweep.json").read_text())
    assert sweep["launcher"] == {"name": "slots", "slots": 2, "cores_per_job": 1, "minutes": 30, "threads_per_job": "auto"}
    assert len(launcher.executors) == 1 and launcher.executors[0].parameters["timeout_min"] == 30.0
    for job in sweep["jobs"]:
        assert "trainer.threads=1" in job["overrides"]  # the launcher's auto_threads
        assert Path(job["stderr"]).parent == in_tmp / "sw" / "logs"  # submitit's local logs
        rows = (Path(job["output_dir"]) / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(r)["step"] for r in rows] == [1, 2, 3]
    assert "| `clip_higher` | 1/1 |" in (in_tmp / "sw" / "report.md").read_text()

    # `entropyrl status` in another process knows nothing of `slots`: it follows the jobs' files
    status = subprocess.run([*CLI, "status", "sw"], capture_output=True, text=True, cwd=in_tmp, timeout=120)
    assert status.returncode == 0 and "2 done, 0 running, 0 pending, 0 failed" in status.stdout


def test_unknown_launcher_name_is_a_user_error():
    with pytest.raises(UserError, match="unknown launcher=nope; valid: .*debug, local"):
        get_launcher("nope")


# ---------------------------------------------------------------------------------------------
# SLURM: what sinfo and squeue say, turned into the key to change
# ---------------------------------------------------------------------------------------------
def test_slurm_time_and_gres_parsing():
    assert _minutes("infinite") is None and _minutes("UNLIMITED") is None
    assert _minutes("30") == 30 and _minutes("30:00") == 30 and _minutes("2:00:00") == 120
    assert _minutes("1-00:00:00") == 1440 and _minutes("1-02:30:00") == 1590
    assert _gpus("(null)") == 0 and _gpus("gpu:4") == 4 and _gpus("gpu:a100:4(S:0-1),gpu:v100:2") == 6


def test_slurm_request_against_the_largest_node():
    sizes = {
        "cpu": PartitionSize("cpu", cpus=2, mem_mb=4096, gpus=0, nodes=1, time_limit_min=60.0),
        "gpu": PartitionSize("gpu", cpus=32, mem_mb=256000, gpus=8, nodes=4, time_limit_min=None),
    }
    ok = {"cpus_per_task": 2, "mem_gb": 4, "nodes": 1, "timeout_min": 60}
    assert oversized(ok, sizes, "cpu") is None
    assert oversized({**ok, "cpus_per_task": 4}, sizes, "cpu") == (
        "launcher.cpus_per_task=4 exceeds the largest node of partition cpu (2 CPUs); set launcher.cpus_per_task<=2"
    )
    assert "set launcher.mem_gb<=4" in oversized({**ok, "mem_gb": 16}, sizes, "cpu")
    assert "set launcher.gpus_per_node<=0" in oversized({**ok, "gpus_per_node": 1}, sizes, "cpu")
    assert "set launcher.nodes<=1" in oversized({**ok, "nodes": 2}, sizes, "cpu")
    assert "set launcher.timeout_min<=60" in oversized({**ok, "timeout_min": 240}, sizes, "cpu")
    # one task (rank) per GPU by default: cpus_per_task is per rank, 8 x 4 fill the 32 CPUs
    assert (
        oversized({**ok, "partition": "gpu", "cpus_per_task": 4, "gpus_per_node": 8, "timeout_min": 9999}, sizes, "cpu") is None
    )
    assert "set launcher.tasks_per_node<=2" in oversized(
        {**ok, "partition": "gpu", "cpus_per_task": 16, "gpus_per_node": 8}, sizes, "cpu"
    )
    assert "set launcher.partition to one of: cpu, gpu" in oversized({**ok, "partition": "big"}, sizes, "cpu")


def test_ranks_per_job_and_requests_no_node_can_hold():
    from entropyrl.sweeps.launchers import LocalLauncher

    slurm = SlurmLauncher()
    assert slurm.tasks_per_node({"gpus_per_node": 8}) == 8 and slurm.tasks_per_node({}) == 1
    assert slurm.world_size({"nodes": 2, "gpus_per_node": 4}) == 8
    assert slurm.world_size({"nodes": 2, "tasks_per_node": 2, "gpus_per_node": 4}) == 4
    with pytest.raises(UserError, match=r"launcher.tasks_per_node=3 exceeds launcher.gpus_per_node=2 \(one GPU per rank\)"):
        slurm.check_values({"tasks_per_node": 3, "gpus_per_node": 2})
    sizes = {"cpu": PartitionSize("cpu", cpus=4, mem_mb=4096, gpus=0, nodes=2, time_limit_min=None)}
    assert oversized({"cpus_per_task": 2, "tasks_per_node": 2, "nodes": 2, "mem_gb": None}, sizes, "cpu") is None
    # a key the request leaves out is the schema's default (mem_gb 16 > 4 GB), a null one asks for nothing
    assert "set launcher.mem_gb<=4" in oversized({"cpus_per_task": 2, "tasks_per_node": 2, "nodes": 2}, sizes, "cpu")
    assert oversized({"cpus_per_task": 2, "tasks_per_node": 3, "mem_gb": None}, sizes, "cpu") == (
        "launcher.tasks_per_node=3 x launcher.cpus_per_task=2 exceeds the largest node of partition cpu (4 CPUs); "
        "set launcher.tasks_per_node<=2 or lower launcher.cpus_per_task"
    )
    local = LocalLauncher()
    with pytest.raises(UserError, match="launcher=local runs on this machine only"):
        local.check({"nodes": 2})
    from entropyrl.core.resources import available_cpus

    with pytest.raises(UserError, match=rf"exceed the {available_cpus()} CPUs"):
        local.check({"tasks_per_node": available_cpus() + 1})
    local.check({"tasks_per_node": 1})


def test_keys_a_launchers_section_leaves_out_read_as_the_schema_declares_them():
    """The base Launcher serves a plugin's launcher whose section holds only its own keys: what it
    leaves out reads as core/schema/launcher.py's defaults, never as a literal of the code's."""
    from entropyrl.core.schema import defaults
    from entropyrl.core.schema.launcher import LocalLauncherSchema
    from entropyrl.sweeps.launchers import SHARED_KEYS, declared

    local = defaults(LocalLauncherSchema)
    assert {k: SHARED_KEYS[k] for k in ("name", "nodes", "tasks_per_node", "threads_per_job", "max_parallel")} == {
        k: local[k] for k in ("name", "nodes", "tasks_per_node", "threads_per_job", "max_parallel")
    }
    assert declared({}, "max_parallel") == local["max_parallel"] and declared({"max_parallel": 3}, "max_parallel") == 3
    assert declared({"tasks_per_node": None}, "tasks_per_node") is None  # a null is the value given, not a gap
    with pytest.raises(KeyError):
        declared({}, "no_such_key")

    class Bare(Launcher):
        name = "bare"

    assert Bare().parallelism({}) == local["max_parallel"] and Bare().world_size({}) == local["nodes"]
    assert get_launcher({}).name == local["name"]


def test_prompts_that_do_not_split_over_a_jobs_ranks_are_refused_at_plan_time(tmp_path):
    out = subprocess.run(
        [
            *CLI,
            "sweep",
            "ablation=gate",
            "seeds=[0]",
            "sweep_dir=sw",
            "launcher=slurm",
            "launcher.nodes=3",
            "launcher.check_request=false",
            "trainer.prompts_per_step=4",
            "trainer.mini_batch_prompts=4",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: variant gated: trainer.prompts_per_step=4 must be a multiple of the job's 3 ranks "
        "(launcher.nodes x launcher.tasks_per_node); set train.trainer.prompts_per_step to a multiple of 3"
    ]
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize(
    "reason, advice",
    [
        ("InvalidAccount", "change launcher.account (now proj)"),
        ("PartitionTimeLimit", "change launcher.timeout_min (now 240)"),
        ("QOSMaxCpuPerJobLimit", "change launcher.cpus_per_task (now 4)"),
        ("BadConstraints", "change launcher.additional_parameters.constraint"),
        ("Priority", None),
        ("Dependency", None),
    ],
)
def test_slurm_pending_reasons_that_never_clear(reason, advice):
    cfg = {"account": "proj", "timeout_min": 240, "cpus_per_task": 4}
    assert SlurmLauncher().stuck(cfg, QueueEntry(WAITING, "PENDING", reason)) == advice


# ---------------------------------------------------------------------------------------------
# training keys on the sweep's command line (issue: `sweep ablation=gate trainer.total_steps=5`)
# ---------------------------------------------------------------------------------------------
def test_training_keys_go_to_the_jobs_as_they_are():
    sweep, train = split_overrides(
        [
            "ablation=gate",
            "trainer.total_steps=5",
            "algo.stare.p=0.2",
            "+val.x=1",
            "~val.benchmarks",
            "seeds=[0]",
            "launcher.max_parallel=2",
            "tracking.uri=x",
            "train.optim.lr=0.1",
            "model=tiny",
            "report.tail_frac=0.2",
        ]
    )
    assert sweep == ["ablation=gate", "seeds=[0]", "launcher.max_parallel=2", "tracking.uri=x", "report.tail_frac=0.2"]
    assert train == ["trainer.total_steps=5", "algo.stare.p=0.2", "+val.x=1", "~val.benchmarks", "optim.lr=0.1", "model=tiny"]


def test_sweep_accepts_training_keys_on_the_command_line(tmp_path):
    out = subprocess.run(
        [*CLI, "sweep", "ablation=gate", "trainer.total_steps=5", "seeds=[0]", "sweep_dir=sw", "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[3:]]
    assert [r[0] for r in rows] == ["gated", "always_on", "off"]
    assert all("trainer.total_steps=5" in r for r in rows)
    bad = subprocess.run(
        [*CLI, "sweep", "ablation=gate", "trainer.bogus=5", "sweep_dir=sw", "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert bad.returncode == 2 and "variant gated: unknown config key 'trainer.bogus'" in bad.stderr


@pytest.mark.slow
def test_local_sweep_job_runs_as_two_ranks_into_one_mlflow_run(tmp_path):
    """launcher=local launcher.tasks_per_node=2: each job is 2 gloo processes, one folder, one MLflow run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = subprocess.run(
        [
            *CLI,
            "sweep",
            "ablation=clip",
            "variants=[symmetric]",
            "seeds=[0]",
            "sweep_dir=sw",
            "launcher=local",
            "launcher.tasks_per_node=2",
            "poll_seconds=0.5",
            f"tracking.uri={uri}",
            "tracking.experiment=local-ranks",
            "trainer.total_steps=2",
            "trainer.prompts_per_step=4",
            "trainer.mini_batch_prompts=2",
            "trainer.val_every=0",
            "trainer.save_every=0",
            "val.prompts=0",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    run = tmp_path / "sw" / "runs" / "symmetric" / "s0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(summary["nodes"]) == 2
    assert "rank 1 of 2" in (run / "train.rank1.log").read_text()
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    children = client.search_runs([client.get_experiment_by_name("local-ranks").experiment_id], "tags.variant = 'symmetric'")
    assert [r.info.run_id for r in children] == [summary["mlflow_run_id"]]


class RefusingLauncher(SlotsLauncher):
    """A scheduler that refuses the sweep's jobs, as sbatch does for an account that does not exist."""

    name = "refusing"

    def submit(self, executor, callables):
        raise UserError("sbatch refused the sweep's jobs: Invalid account (set launcher.account)")


def test_a_launcher_that_refuses_the_jobs_ends_the_parent_run_failed(in_tmp, capsys):
    """The refusal came after the sweep's MLflow parent run opened, which stayed RUNNING for ever."""
    import sqlite3

    register_launcher(RefusingLauncher(), defaults={"slots": 1, "cores_per_job": 1, "minutes": 30, "threads_per_job": "auto"})
    db = in_tmp / "mlflow.db"
    args = ["sweep", "ablation=clip", "variants=[clip_higher]", "seeds=[0]", "launcher=refusing", "sweep_dir=sw", *TINY]
    with pytest.raises(SystemExit) as ended:
        main([*args, f"tracking.uri=sqlite:///{db}"])
    err = capsys.readouterr().err
    assert ended.value.code != 0 and "sbatch refused the sweep's jobs" in err and "Traceback" not in err, err[-3000:]
    parent = json.loads((in_tmp / "sw" / "sweep.json").read_text())["tracking"]["parent_run_id"]
    with sqlite3.connect(db) as con:
        assert con.execute("select status from runs where run_uuid = ?", (parent,)).fetchone()[0] == "FAILED"
