"""Sweeps on a real single-node SLURM cluster (tests/slurm/start.sh installs and starts it, stop.sh
stops it) tracked in a real `mlflow server`: the gate ablation as a job array of child runs under
one parent, and a job requeued mid-training that resumes into the same MLflow run."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the cluster: the `slurm_cluster` fixture of tests/conftest.py (one SLURM test at a time, across xdist workers)
pytestmark = pytest.mark.slurm

HERE = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "entropyrl.cli.main"]
TINY = [
    "data=toy",
    "train.trainer.total_steps=3",
    "train.trainer.prompts_per_step=4",
    "train.trainer.mini_batch_prompts=4",
    "train.trainer.val_every=3",
    "train.trainer.save_every=0",
    "train.val.prompts=8",
]
# Two jobs at a time on a 2-core node, one core each.
SLURM = [
    "launcher=slurm",
    "launcher.cpus_per_task=1",
    "launcher.mem_gb=2",
    "launcher.array_parallelism=2",
    "launcher.timeout_min=30",
    "poll_seconds=1",
]

# The session's `mlflow server` fixture lives in test_mlflow_server.py (one server per session).
_spec = importlib.util.spec_from_file_location("_entropyrl_test_mlflow_server", HERE / "test_mlflow_server.py")
_server_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server_mod)
mlflow_server = _server_mod.mlflow_server


@pytest.fixture(scope="session")
def warm_model():
    """Build the warm-started tiny model once, here, so parallel jobs never race to build it."""
    from entropyrl.conf import compose
    from entropyrl.models.loading import load_policy

    cfg = compose("train")
    load_policy(cfg.model, cfg.data, log=lambda *_: None)


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def test_gate_ablation_on_slurm_with_mlflow_server(slurm_cluster, mlflow_server, warm_model, tmp_path):
    out = subprocess.run(
        [
            *CLI,
            "sweep",
            "ablation=gate",
            "seeds=[0,1]",
            "sweep_dir=sw",
            *SLURM,
            f"tracking.uri={mlflow_server}",
            "tracking.experiment=slurm-gate",
            *TINY,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    sw = tmp_path / "sw"
    sweep = json.loads((sw / "sweep.json").read_text())
    jobs = sweep["jobs"]
    assert len(jobs) == 6
    arrays = {j["scheduler_job_id"].split("_")[0] for j in jobs}
    assert len(arrays) == 1, "one SLURM job array for the sweep"
    for j in jobs:
        js = json.loads((Path(j["output_dir"]) / "job.json").read_text())
        assert js["state"] == "done" and js["scheduler_job_id"] == j["scheduler_job_id"]
    script = next((sw / "logs").glob("*_submission.sh")).read_text()
    assert f"export ENTROPYRL_CACHE={os.environ['ENTROPYRL_CACHE']}" in script  # the warm model is reused
    assert sys.executable in script or str(Path(sys.executable).resolve()) in script

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("slurm-gate")
    parent_id = sweep["tracking"]["parent_run_id"]
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert sorted((r.data.tags["variant"], r.data.tags["seed"]) for r in children) == sorted(
        (v, s) for v in ("gated", "always_on", "off") for s in ("0", "1")
    )
    assert all(r.info.status == "FINISHED" and r.data.tags["sweep_id"] == sweep["sweep_id"] for r in children)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert (sw / "plots" / "entropy.png").stat().st_size > 5000
    md = (sw / "report.md").read_text()
    for v in ("gated", "always_on", "off"):
        assert f"| `{v}` | 2/2 |" in md
    assert {"report/report.md", "report/plots"} <= {a.path for a in client.list_artifacts(parent_id, "report")}

    status = subprocess.run([*CLI, "status", str(sw)], capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "6 done, 0 running, 0 pending, 0 failed" in status.stdout
    assert str(sw / "logs") in status.stdout


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, f"the sweep ended while waiting for {what}: {proc.stdout.read()[-3000:]}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _last_step(job_dir: Path) -> int:
    path = job_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def _resumed_steps(job_dir: Path) -> list[int]:
    log = job_dir / "train.log"
    text = log.read_text() if log.exists() else ""
    return [int(m) for m in re.findall(r"resumed from .*step_\d+ \(step (\d+)\)", text)]


def _start_again(job_id: str, proc: subprocess.Popen) -> None:
    """SLURM holds a requeued job back (BeginTime) for a while; let it start again now."""
    _wait_for(lambda: squeue_state(job_id) == "PENDING", 120, f"job {job_id} to be requeued", proc)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True, capture_output=True)


def test_requeued_job_resumes_into_the_same_run(slurm_cluster, mlflow_server, warm_model, tmp_path):
    """Requeued twice mid-training: by the admin (`scontrol requeue`), then preempted the way SLURM
    does it (SIGTERM + USR2: submitit calls the job's checkpoint() and requeues it itself)."""
    steps = 100
    proc = subprocess.Popen(
        [
            *CLI,
            "sweep",
            "ablation=clip",
            "variants=[symmetric]",
            "seeds=[0]",
            "sweep_dir=rq",
            *SLURM,
            f"tracking.uri={mlflow_server}",
            "tracking.experiment=slurm-requeue",
            f"train.trainer.total_steps={steps}",
            "train.trainer.prompts_per_step=4",
            "train.trainer.mini_batch_prompts=4",
            "train.trainer.val_every=0",
            "train.val.prompts=0",
            "train.trainer.save_every=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    job_dir = tmp_path / "rq" / "runs" / "symmetric" / "s0"
    try:
        # 1. a few steps logged and a checkpoint on disk: the admin requeues the job
        _wait_for(
            lambda: _last_step(job_dir) >= 3 and list((job_dir / "checkpoints").glob("step_*")), 300, "the first steps", proc
        )
        job_id = json.loads((tmp_path / "rq" / "sweep.json").read_text())["jobs"][0]["scheduler_job_id"]
        subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True, text=True)
        _start_again(job_id, proc)
        # 2. once the second attempt has resumed and made progress: preemption
        _wait_for(
            lambda: len(_resumed_steps(job_dir)) == 1 and _last_step(job_dir) >= _resumed_steps(job_dir)[0] + 3,
            300,
            "the second attempt to resume",
            proc,
        )
        subprocess.run(["scancel", job_id, "--signal", "SIGTERM"], check=True, capture_output=True)
        subprocess.run(["scancel", job_id, "--signal", "USR2"], check=True, capture_output=True)
        _start_again(job_id, proc)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]

    resumed = _resumed_steps(job_dir)
    log = (job_dir / "train.log").read_text()
    assert len(resumed) == 2 and 3 <= resumed[0] < resumed[1] < steps, log[-3000:]  # stopped mid-training twice
    assert "preempted or timed out: requeueing" in log and "FAILED" not in log
    job_state = json.loads((job_dir / "job.json").read_text())
    assert job_state["state"] == "done" and job_state["attempt"] == 3
    rows = [json.loads(x) for x in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    run_id = json.loads((job_dir / "tracking.json").read_text())["run_id"]
    assert json.loads((job_dir / "summary.json").read_text())["mlflow_run_id"] == run_id
    exp = client.get_experiment_by_name("slurm-requeue")
    children = client.search_runs([exp.experiment_id], "tags.variant = 'symmetric'")
    assert [r.info.run_id for r in children] == [run_id]  # one run across the three attempts
    history = [m.step for m in client.get_metric_history(run_id, "entropy")]
    assert sorted(history) == list(range(1, steps + 1))  # one continuous sequence, nothing twice
    assert client.get_run(run_id).info.status == "FINISHED"


# ---------------------------------------------------------------------------------------------
# a request the cluster can never satisfy (nodes of 2 CPUs here)
# ---------------------------------------------------------------------------------------------
def test_a_request_no_node_can_hold_is_refused_before_submitting(slurm_cluster, tmp_path):
    out = subprocess.run(
        [*CLI, "sweep", "ablation=gate", "seeds=[0]", "sweep_dir=sw", "launcher=slurm", "launcher.cpus_per_task=4", *TINY],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: launcher.cpus_per_task=4 exceeds the largest node of partition debug (2 CPUs); set launcher.cpus_per_task<=2"
    ), out.stderr
    assert not (tmp_path / "sw").exists()
    assert subprocess.run(["squeue", "-h", "-n", "entropyrl"], capture_output=True, text=True).stdout.strip() == ""


def test_a_job_that_can_never_start_stops_the_sweep(slurm_cluster, tmp_path):
    """Submitted anyway (launcher.check_request=false): SLURM keeps the array PENDING (PartitionConfig)
    forever; the sweep names the reason and the key within a minute, cancels its jobs, exits 2."""
    started = time.time()
    out = subprocess.run(
        [
            *CLI,
            "sweep",
            "ablation=gate",
            "seeds=[0]",
            "sweep_dir=sw",
            "launcher=slurm",
            "launcher.cpus_per_task=4",
            "launcher.check_request=false",
            "launcher.mem_gb=1",
            "poll_seconds=1",
            *TINY,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    elapsed = time.time() - started
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    ids = [j["scheduler_job_id"] for j in sweep["jobs"]]
    assert len(ids) == 3 and all(i for i in ids)
    assert re.match(
        r"error: job \S+ \(SLURM job \d+_\d\) cannot start: SLURM PENDING \(PartitionConfig\): "
        r"launcher\.cpus_per_task=4 exceeds the largest node of partition debug \(2 CPUs\); "
        r"set launcher\.cpus_per_task<=2; cancelled the sweep's 3 unfinished job\(s\)",
        lines[-1],
    ), lines[-1]
    assert elapsed < 90, f"took {elapsed:.0f} s to give up"
    # the live line of counts, with the scheduler's reason
    assert "jobs: 0 done, 0 running, 3 pending, 0 failed [SLURM PENDING (PartitionConfig)] (of 3)" in out.stderr
    for array in {i.split("_")[0] for i in ids}:  # nothing left waiting in the queue
        assert set(squeue_state(array).split()) == {"CANCELLED"}

    from mlflow.tracking import MlflowClient

    client = MlflowClient(sweep["tracking"]["uri"])
    assert client.get_run(sweep["tracking"]["parent_run_id"]).info.status == "FAILED"
    status = subprocess.run([*CLI, "status", str(tmp_path / "sw")], capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "0 done, 0 running, 0 pending, 3 failed" in status.stdout
    assert "SLURM CANCELLED" in status.stdout


# ---------------------------------------------------------------------------------------------
# multi-rank sweep jobs: 2 nodes x 1 task (partition two), 1 node x 2 tasks (partition debug)
# ---------------------------------------------------------------------------------------------
# Groups sampled alone (rollout.seed_scope=group) so that 1 or 2 ranks sample the same responses;
# one mini-batch per step, so both update on the same rows; two steps (the second from changed weights).
SAME_BATCH = [
    "train.trainer.total_steps=2",
    "train.trainer.prompts_per_step=4",
    "train.trainer.mini_batch_prompts=4",
    "train.trainer.micro_batch_responses=6",
    "train.rollout.n=4",
    "train.rollout.seed_scope=group",
    "train.trainer.share_prompt_forward=false",  # as FSDP's ranks run it: the one process compares the same forward
    "train.optim.lr=1e-3",
    "train.trainer.val_every=0",
    "train.trainer.save_every=0",
    "train.val.prompts=0",
    "tracking.enabled=false",
]
_REFERENCE: dict[tuple, Path] = {}


def _final_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    step = sorted((run / "checkpoints").glob("step_*"))[-1]
    return load_file(str(step / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory) -> Path:
    """Where the single-process reference runs live: a module folder, not a test's ``tmp_path``, which
    is deleted when its test passes while ``_REFERENCE`` hands the run to the next test."""
    return tmp_path_factory.mktemp("single_runs")


def _single_process_run(overrides: list[str], root: Path) -> Path:
    """The same job as one `entropyrl train` process (its overrides as sweep.json records them), run
    once per override list under ``root``."""
    own = [o for o in overrides if not o.startswith(("output_dir=", "trainer.threads="))]
    if tuple(own) not in _REFERENCE:
        out_dir = root / f"single{len(_REFERENCE)}"
        out = subprocess.run(
            [*CLI, "train", *own, f"output_dir={out_dir}", "trainer.threads=1"],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        _REFERENCE[tuple(own)] = out_dir
    return _REFERENCE[tuple(own)]


def _check_multi_rank_job(tmp_path: Path, launcher: list[str], single_runs: Path) -> dict:
    out = subprocess.run(
        [*CLI, "sweep", "ablation=clip", "variants=[symmetric]", "seeds=[0]", "sweep_dir=mr", *SLURM, *launcher, *SAME_BATCH],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    job = json.loads((tmp_path / "mr" / "sweep.json").read_text())["jobs"][0]
    run = Path(job["output_dir"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["world_size"] == 2, summary
    assert json.loads((run / "job.json").read_text())["state"] == "done"
    assert (run / "train.rank1.log").exists()  # rank 1 ran, and logged apart
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # one metrics stream: rank 0's

    single = _single_process_run(job["overrides"], single_runs)
    one = [json.loads(x) for x in (single / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((single / "summary.json").read_text())["world_size"] == 1
    for a, b in zip(one, rows):
        for key in ("loss/objective", "entropy", "grad_norm", "reward/mean"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])
    assert one[0]["loss/objective"] != one[1]["loss/objective"]
    w1, w2 = _final_weights(single), _final_weights(run)
    assert set(w1) == set(w2)
    # k_proj.bias carries no gradient signal (softmax ignores it): Adam turns rounding into ~1e-5
    # there (see test_distributed.py); every other weight within 2e-5 of the single process.
    worst = max(float((w1[k].float() - w2[k].float()).abs().max()) for k in w1 if not k.endswith("k_proj.bias"))
    assert worst <= 2e-5, worst
    return summary


def test_two_node_sweep_job_trains_as_two_ranks_and_matches_one_process(slurm_cluster, warm_model, tmp_path, single_runs):
    summary = _check_multi_rank_job(tmp_path, ["launcher.partition=two", "launcher.nodes=2"], single_runs)
    assert summary["nodes"] == ["n1", "n2"]  # one rank on each node


def test_one_node_two_task_sweep_job_matches_one_process(slurm_cluster, warm_model, tmp_path, single_runs):
    summary = _check_multi_rank_job(tmp_path, ["launcher.tasks_per_node=2"], single_runs)
    assert len(summary["nodes"]) == 2 and len(set(summary["nodes"])) == 1
    assert summary["nodes"][0] not in ("n1", "n2")  # partition debug's node


def test_the_sbatch_template_trains_a_run_on_slurm(slurm_cluster, warm_model, tmp_path):
    """examples/slurm/train.sbatch as a user submits it: the test cluster has no GPUs and two cores,
    so the GPU line goes and the task/CPU/memory sizes are given on the sbatch command line."""
    template = (HERE.parents[1] / "examples" / "slurm" / "train.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=8\n" in template
    script = tmp_path / "train.sbatch"
    script.write_text(template.replace("#SBATCH --gpus-per-node=8\n", ""))
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    train = [a.removeprefix("train.") for a in TINY] + [f"output_dir={run_dir}", "tracking.enabled=false"]
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--partition=debug",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            "--mem=2G",
            "--time=20",
            f"--output={log}",
            str(script),
            *train,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**os.environ, "ENTROPYRL_PYTHON": sys.executable},
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    deadline = time.time() + 600
    while (state := squeue_state(job_id)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        assert time.time() < deadline, f"job {job_id} did not end: {log.read_text()[-2000:] if log.exists() else ''}"
        time.sleep(1)
    assert state in ("COMPLETED", ""), (state, log.read_text()[-3000:] if log.exists() else "")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["steps"] == 3
    assert f"entropyrl-train: job {job_id}" in log.read_text()
