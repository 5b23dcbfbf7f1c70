"""trainer.staleness: 0 is the synchronous loop unchanged; k >= 1 trains from a rollout worker
process with batches at most k versions old (stamped, too-stale ones dropped and counted), a
checkpoint keeps the batches drawn ahead of the next k steps so that a resumed run trains what the
uninterrupted one trains, a worker that fails or dies ends the run with one UserError, and
configurations without an asynchronous path are refused before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.rollout.base import Rollout
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.algos.step_batch import StepBatch
from entropyrl.trainers.async_rollout import (
    AsyncRollouts,
    StaleBatch,
    WorkerFailed,
    async_step_metrics,
    check_async,
    record_mismatch,
    staleness_counts,
    staleness_histogram,
    too_stale,
    visible_gpus,
    worker_devices,
)
from entropyrl.trainers.interventions.tis import m2po_keep, mismatch_weight
from entropyrl.trainers.run import checkpoint as ckpt
from entropyrl.trainers.run.run_dir import config_differences

ASYNC_METRICS = (
    "async/staleness/mean",
    "async/staleness/max",
    "async/dropped",
    "async/trainer_idle_frac",
    "async/worker_idle_frac",
    "async/samples_per_s",
    "async/entropy_behaviour",
    "async/entropy_gap",
    "async/staleness/frac_0",
    "async/staleness/frac_1",
    "async/logp_gap/proximal_current",
    "async/logp_gap/behaviour_current",
    "async/controller_entropy",
    "async/controller_entropy_behaviour",
)
# logged at any staleness, the synchronous loop included
QUARTILE_METRICS = tuple(f"clip/frac/entropy_q{i}" for i in range(1, 5))
STALE_METRICS = ("async/stale_clip_frac", *(f"async/stale_clip_frac/entropy_q{i}" for i in range(1, 5)))


def _overrides(fast_train: list[str], *extra: str) -> list[str]:
    return [
        *fast_train,
        "output_dir=run",
        "trainer.threads=1",
        "trainer.val_every=0",
        "val.prompts=0",
        "tracking.enabled=false",
        *extra,
    ]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/") and k != "timestamp"}


# -- the drop rule and the metrics, without a model ------------------------------------------
def test_too_stale_counts_versions_behind_the_trainer():
    assert not too_stale(batch_version=3, trainer_version=4, staleness=1)
    assert too_stale(batch_version=2, trainer_version=4, staleness=1)
    assert not too_stale(batch_version=2, trainer_version=4, staleness=2)


class _ListQueue:
    def __init__(self, items):
        self.items = list(items)

    def get(self, timeout=None):
        return self.items.pop(0)


class _Started:
    """Stands for a running worker process: next_batch and drain only read the queue."""

    def is_alive(self) -> bool:
        return True


def _item(step: int, version: int, rows: int) -> StaleBatch:
    """What the worker sends for ``step``: a batch of ``rows`` responses generated at ``version``."""
    return StaleBatch(step, version, (_step_batch(step, rows=rows), {"acc/mean": 0.5}), 1.25, idle_s=1.0, cycle_s=4.0)


def test_a_too_stale_batch_is_dropped_and_its_samples_counted(monkeypatch):
    rollouts = AsyncRollouts(compose("train", ["tracking.enabled=false"]), staleness=1)
    rollouts.process = object()  # started: next_batch only reads the queue
    rollouts.queue = _ListQueue([_item(3, 1, rows=6), _item(4, 3, rows=6)])
    batch, metrics = rollouts.next_batch(None, step=4)
    assert len(batch) == 6 and rollouts.queue.items == []
    assert batch.policy_version == 3  # the version the worker stamped, carried by the batch itself
    assert metrics["async/dropped"] == 6.0  # version 1 at trainer version 4 is 3 behind > 1
    assert metrics["async/staleness/mean"] == metrics["async/staleness/max"] == 1.0
    assert (metrics["async/staleness/frac_0"], metrics["async/staleness/frac_1"]) == (0.0, 1.0)  # trained only
    assert metrics["async/worker_idle_frac"] == 0.25
    assert metrics["async/entropy_behaviour"] == 1.25 and metrics["acc/mean"] == 0.5
    step = async_step_metrics({**metrics, "time/generate": 0.5, "time/step": 2.0, "entropy": 1.0}, rows=6)
    assert step == {"async/trainer_idle_frac": 0.25, "async/samples_per_s": 3.0, "async/entropy_gap": 0.25}


def test_a_dropped_batch_skips_its_own_step_and_never_shifts_the_later_ones():
    rollouts = AsyncRollouts(compose("train", ["tracking.enabled=false"]), staleness=1)
    rollouts.process = object()  # started: next_batch only reads the queue
    # step 4's batch is 3 versions old (dropped); steps 5 and 6 have their own (told apart by their rows)
    rollouts.queue = _ListQueue([_item(4, 1, rows=6), _item(5, 4, rows=5), _item(6, 5, rows=4)])
    batch, metrics = rollouts.next_batch(None, step=4)
    assert batch is None and metrics == {"async/dropped": 6.0}  # the step trains nothing
    batch, metrics = rollouts.next_batch(None, step=5)
    assert len(batch) == 5 and metrics["async/dropped"] == 0.0 and metrics["async/staleness/mean"] == 1.0
    batch, _ = rollouts.next_batch(None, step=6)
    assert len(batch) == 4 and rollouts.queue.items == []


def test_a_batch_stamped_for_a_later_step_waits_for_that_step():
    rollouts = AsyncRollouts(compose("train", ["tracking.enabled=false"]), staleness=1)
    rollouts.process = object()
    rollouts.queue = _ListQueue([_item(5, 4, rows=5)])  # step 4's batch never came
    batch, metrics = rollouts.next_batch(None, step=4)
    assert batch is None and metrics == {"async/dropped": 0.0} and [b.step for b in rollouts.pending] == [5]
    batch, _ = rollouts.next_batch(None, step=5)
    assert len(batch) == 5 and rollouts.pending == []


def test_the_staleness_histogram_is_the_share_of_trained_samples_at_each_lag():
    assert staleness_counts(lag=2, rows=6, staleness=4) == [0.0, 0.0, 6.0, 0.0, 0.0]
    # two ranks' counts summed (what next_batch reduces): 6 samples at lag 0, 2 at lag 2
    summed = [a + b for a, b in zip(staleness_counts(0, 6, 2), staleness_counts(2, 2, 2))]
    assert staleness_histogram(summed) == {
        "async/staleness/frac_0": 0.75,
        "async/staleness/frac_1": 0.0,
        "async/staleness/frac_2": 0.25,
    }
    assert staleness_histogram([0.0, 0.0]) == {}  # nothing trained: no shares
    with pytest.raises(ValueError, match="outside the staleness bound"):
        staleness_counts(lag=3, rows=1, staleness=2)


# -- the batches drawn ahead, kept by a checkpoint ---------------------------------------------
def _step_batch(seed: int, rows: int = 4, width: int = 3) -> StepBatch:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, width, dtype=torch.long)
    roll = Rollout(
        prompt_ids=torch.randint(0, 50, (rows, 2), generator=g),
        prompt_mask=torch.ones(rows, 2, dtype=torch.long),
        response_ids=torch.randint(0, 50, (rows, width), generator=g),
        response_mask=mask,
        texts=[f"r{seed}-{i}" for i in range(rows)],
        truncated=torch.zeros(rows, dtype=torch.bool),
        sampling_logp=-torch.rand(rows, width, generator=g),
    )
    return StepBatch(roll, torch.rand(rows, generator=g), torch.ones(rows), torch.arange(rows) // 2)


class _SavesNothing:
    def save_pretrained(self, folder) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)


def test_a_checkpoint_keeps_the_batches_drawn_ahead_and_a_resume_trains_them_as_recorded(tmp_path):
    cfg = compose("train", ["tracking.enabled=false", "trainer.staleness=2"])
    rollouts = AsyncRollouts(cfg, staleness=2)
    rollouts.process = _Started()
    drawn = [StaleBatch(s, s - 2, (_step_batch(s), {"acc/mean": s / 10}), 0.5 + s, idle_s=0.25, cycle_s=1.0) for s in (4, 5)]
    rollouts.queue = _ListQueue([*drawn, "not taken: step 6 is not one of the next k"])
    record = rollouts.checkpoint_record(step=4)  # the trainer at version 4: steps 4 and 5 come next
    assert [b.step for b in rollouts.pending] == [4, 5] and len(rollouts.queue.items) == 1
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    name = ckpt.pending_batches_name(0)
    folder = ckpt.save_checkpoint(tmp_path, 4, _SavesNothing(), _SavesNothing(), optimizer, {}, objects={name: record})
    assert (folder / name).is_file() and not list((tmp_path / "checkpoints").glob(".tmp-*"))

    resumed = AsyncRollouts(cfg, staleness=2)
    assert resumed.restore(ckpt.load_pending_batches(folder, rank=0), step=4) is None
    resumed.process = _Started()  # started after the pending batches: none of them is read from it
    resumed.queue = _ListQueue([])
    for step, want in zip((4, 5), drawn):
        batch, metrics = resumed.next_batch(None, step=step)
        assert torch.equal(batch.responses.response_ids, want.collected[0].responses.response_ids)
        assert torch.equal(batch.responses.sampling_logp, want.collected[0].responses.sampling_logp)
        assert (
            torch.equal(batch.rewards, want.collected[0].rewards) and batch.responses.texts == want.collected[0].responses.texts
        )
        assert metrics["acc/mean"] == step / 10 and metrics["async/entropy_behaviour"] == 0.5 + step
        assert metrics["async/staleness/mean"] == 2.0 and metrics["async/staleness/frac_2"] == 1.0  # as stamped
        assert batch.policy_version == step - 2
        assert metrics["async/worker_idle_frac"] == 0.25
    assert ckpt.load_pending_batches(tmp_path / "checkpoints" / "no_such_step", rank=0) is None


def test_pending_batches_that_do_not_continue_the_run_are_not_used():
    cfg = compose("train", ["tracking.enabled=false", "trainer.staleness=1"])
    record = {"step": 2, "staleness": 1, "world_size": 1, "rank": 0, "batches": [_item(2, 1, rows=2)]}
    assert record_mismatch(record, step=2, staleness=1, world_size=1) is None
    assert record_mismatch(record, 2, 2, 1) == "drawn at trainer.staleness=1, this run has trainer.staleness=2"
    assert record_mismatch(record, 2, 1, 2) == "drawn by 1 trainer rank, this run has 2"
    assert record_mismatch(record, 4, 1, 1) == "drawn at step 2, the checkpoint is at step 4"
    rollouts = AsyncRollouts(cfg, staleness=1)
    note = rollouts.restore(None, step=2)  # a checkpoint saved before the batches were kept
    assert "holds no batches drawn ahead" in note and "generated fresh from the restored weights" in note
    note = rollouts.restore(None, step=2, problem="pending_batches_rank0.pt cannot be read (EOFError)")
    assert note.startswith("not using the batches") and "(pending_batches_rank0.pt cannot be read (EOFError))" in note
    assert rollouts.pending == []
    assert rollouts.restore(record, step=2) is None and rollouts.pending == record["batches"]


def test_a_worker_failing_while_a_checkpoint_waits_leaves_its_batches_out_and_ends_the_run_later():
    rollouts = AsyncRollouts(compose("train", ["tracking.enabled=false", "trainer.staleness=2"]), staleness=2)
    rollouts.process = _Started()
    rollouts.queue = _ListQueue([_item(4, 2, rows=2), WorkerFailed(5, "RuntimeError: out of memory")])
    assert rollouts.checkpoint_record(step=4) is None  # the checkpoint is written without them
    batch, _metrics = rollouts.next_batch(None, step=4)  # the batch that was ready is still trained
    assert len(batch) == 2
    with pytest.raises(UserError, match="failed while producing step 6's batch: RuntimeError: out of memory"):
        rollouts.next_batch(None, step=5)


def test_changing_the_staleness_on_resume_is_refused_by_the_config_check():
    """The batches drawn ahead hold for one gate: trainer.staleness is not a resumable change, so a
    resume with another value is one error line listing it (run_dir.check_output_dir)."""
    saved, requested = (OmegaConf.to_container(compose("train", [f"trainer.staleness={k}"]), resolve=True) for k in (1, 2))
    assert config_differences(saved, requested) == [("trainer.staleness", 1, 2)]


def _report_start(cfg_yaml, weights, out, stop, first_step, staleness):
    """A stand-in worker body that loads the published weights and sends back where it starts."""
    weights.load_into(torch.nn.Linear(2, 2))
    time.sleep(0.5)  # a trainer that did not wait for the load would have moved on by now
    out.put((first_step, weights.loaded.value, weights.version.value, staleness))


def test_a_restarted_worker_starts_after_the_pending_batches_from_the_checkpoint_weights(fast_train, in_tmp):
    rollouts = AsyncRollouts(compose("train", _overrides(fast_train, "trainer.staleness=2")), staleness=2, worker=_report_start)
    rollouts.pending = [_item(4, 2, rows=2), _item(5, 3, rows=2)]
    try:
        rollouts.start(torch.nn.Linear(2, 2), step=4)  # returns once the worker holds version 4
        assert rollouts.weights.loaded.value == 4
        assert rollouts.queue.get(timeout=120) == (6, 4, 4, 2)  # step 6 behind the gate (version 6 - 2)
    finally:
        rollouts.close()


# -- refused where no asynchronous path exists -------------------------------------------------
def test_negative_staleness_is_refused():
    with pytest.raises(UserError, match="trainer.staleness"):
        compose("train", ["trainer.staleness=-1"])


def test_several_ranks_start_a_worker_each_which_shares_their_gpus():
    class TwoRanks:
        world_size = 2

    cfg = compose("train", ["trainer.staleness=2"])
    assert check_async(cfg) == 2
    assert check_async(compose("train", ["rollout=vllm", "trainer.staleness=1"])) == 1  # both engines
    assert check_async(cfg, TwoRanks()) == 2
    with pytest.raises(UserError, match="2 trainer ranks start one worker each.*trainer.rollout_gpus=0"):
        check_async(compose("train", ["trainer.staleness=1", "trainer.rollout_gpus=1"]), TwoRanks())


# -- where the worker runs: trainer.rollout_gpus ---------------------------------------------------
def test_the_worker_takes_the_last_visible_gpus_and_the_trainer_keeps_the_first(monkeypatch):
    assert worker_devices(["0", "1", "2", "3"], 1) == (["0", "1", "2"], ["3"])
    assert worker_devices(["GPU-a", "GPU-b", "GPU-c"], 2) == (["GPU-a"], ["GPU-b", "GPU-c"])
    assert worker_devices(["0"], 0) == (["0"], ["0"])  # 0: shared
    with pytest.raises(UserError, match=r"trainer.rollout_gpus=1 needs 2 GPUs .* sees 1 GPU \(5\)"):
        worker_devices(["5"], 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6,7")
    assert visible_gpus() == ["4", "6", "7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_rollout_gpus_without_a_worker_or_the_gpus_is_refused_before_the_run(monkeypatch):
    with pytest.raises(UserError, match="only trainer.staleness >= 1 starts"):
        check_async(compose("train", ["trainer.rollout_gpus=1"]))
    vllm_tp2 = ["trainer.staleness=1", "trainer.rollout_gpus=1", "rollout=vllm", "rollout.tensor_parallel_size=2"]
    with pytest.raises(UserError, match="set trainer.rollout_gpus=2"):
        check_async(compose("train", vllm_tp2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UserError, match="this process sees 0 GPUs"):
        check_async(compose("train", ["trainer.staleness=1", "trainer.rollout_gpus=1"]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert check_async(compose("train", ["trainer.staleness=1", "trainer.rollout_gpus=1"])) == 1


def _report_devices(cfg_yaml, weights, out, stop, first_step, staleness):
    """A stand-in worker body that sends back the GPUs its process was started with."""
    out.put(os.environ.get("CUDA_VISIBLE_DEVICES"))


@pytest.mark.parametrize("rollout_gpus, expected", [(1, "3"), (2, "2,3"), (0, "0,1,2,3")])
def test_the_worker_process_starts_with_its_own_gpus_and_the_trainer_keeps_its_view(monkeypatch, rollout_gpus, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    cfg = compose("train", ["trainer.staleness=1", f"trainer.rollout_gpus={rollout_gpus}"])
    rollouts = AsyncRollouts(cfg, staleness=1, worker=_report_devices)
    try:
        rollouts.start(torch.nn.Linear(2, 2), step=0)
        assert rollouts.queue.get(timeout=120) == expected
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # this process's own view is unchanged
    finally:
        rollouts.close()


def test_a_cli_run_asking_for_gpus_it_does_not_have_is_one_error_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "train", "trainer.staleness=1", "trainer.rollout_gpus=1", "output_dir=run"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: trainer.rollout_gpus=1 needs 2 GPUs")
    assert not (tmp_path / "run").exists()  # refused before anything of the run was created


# -- a worker that fails or dies ---------------------------------------------------------------
@pytest.mark.slow  # the worker process imports torch and the package before it fails
def test_a_failing_worker_ends_the_run_with_its_error(fast_train, in_tmp):
    cfg = compose("train", _overrides(fast_train, "model.path=/no/such/model/folder"))
    rollouts = AsyncRollouts(cfg, staleness=1)
    try:
        with pytest.raises(UserError, match=r"the rollout worker failed while producing step 1's batch: \w+"):
            rollouts.next_batch(torch.nn.Linear(2, 2), step=0)
    finally:
        rollouts.close()
    assert rollouts.process is None


def test_a_killed_worker_ends_the_run_with_one_line(fast_train, in_tmp):
    rollouts = AsyncRollouts(compose("train", _overrides(fast_train)), staleness=1)
    rollouts.start(torch.nn.Linear(2, 2), step=0)
    rollouts.process.kill()
    try:
        with pytest.raises(UserError, match=r"the rollout worker \(pid \d+\) exited with code -9 before sending step 1's"):
            rollouts.next_batch(None, step=0)
    finally:
        rollouts.close()


# -- real runs ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_staleness_zero_is_the_synchronous_loop(fast_train, in_tmp):
    from entropyrl.trainers.trainer import train

    explicit = compose("train", _overrides(fast_train, "output_dir=explicit", "trainer.staleness=0"))
    without = compose("train", _overrides(fast_train, "output_dir=without"))
    with open_dict(without):
        del without.trainer["staleness"]  # a config from before the key existed
    train(explicit, log=lambda *_: None)
    train(without, log=lambda *_: None)
    a, b = _rows(in_tmp / "explicit"), _rows(in_tmp / "without")
    assert len(a) == 4 and [_untimed(r) for r in a] == [_untimed(r) for r in b]
    assert not any(k.startswith("async/") and not k.startswith("async/stale_clip_frac") for r in a for k in r)
    assert all(set(QUARTILE_METRICS) <= set(r) for r in a)  # the clip split by entropy quartile: every loop
    # the stale ratio pi_prox / pi_behav: the trained model sampled the batch itself, so never outside the clip range
    assert all(r[k] == 0.0 for r in a for k in STALE_METRICS if r[k] is not None) and all(set(STALE_METRICS) <= set(r) for r in a)


@pytest.mark.slow
def test_staleness_one_trains_from_the_worker_and_resumes(fast_train, in_tmp):
    from entropyrl.trainers.trainer import train

    first = train(compose("train", _overrides(fast_train, "trainer.staleness=1", "trainer.total_steps=2")), log=lambda *_: None)
    assert first["status"] == "FINISHED" and first["steps"] == 2
    again = train(compose("train", _overrides(fast_train, "trainer.staleness=1", "trainer.total_steps=4")), log=lambda *_: None)
    assert again["status"] == "FINISHED" and again["steps"] == 4
    rows = _rows(in_tmp / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert set(ASYNC_METRICS) <= set(r), sorted(set(ASYNC_METRICS) - set(r))
        # algo.controller_entropy=current (the default): the controllers read the trainer's entropy
        assert r["async/controller_entropy"] == r["entropy"] and r["async/controller_entropy_behaviour"] == 0.0
        assert r["async/staleness/max"] <= 1 and r["async/dropped"] == 0
        assert 0 <= r["async/trainer_idle_frac"] <= 1 and 0 <= r["async/worker_idle_frac"] <= 1
    lags = [r["async/staleness/mean"] for r in rows]
    # a fresh start begins from the current weights; the resumed run trains step 3 on the batch the
    # stopped run had drawn ahead (saved with the step-2 checkpoint), and its worker starts at step 4
    assert lags == [0.0, 1.0, 1.0, 1.0]
    for step in (2, 4):
        record = ckpt.load_pending_batches(in_tmp / "run" / "checkpoints" / f"step_{step:06d}", rank=0)
        assert record["step"] == step and [b.step for b in record["batches"]] == [step]
    assert rows[0]["async/entropy_gap"] == pytest.approx(0.0, abs=1e-5)  # same weights: same entropy
    assert any(abs(r["async/entropy_gap"]) > 1e-4 for r in rows if r["async/staleness/mean"] == 1)


# the metrics a resumed step must repeat; the async/ ones say it trained the same batch, recorded or not
EXACT_METRICS = ("entropy", "loss/policy", "reward/mean", "acc/mean", "async/staleness/mean", "async/entropy_behaviour")


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [1, 2])
def test_a_resumed_async_run_trains_the_batches_the_uninterrupted_run_trains(fast_train, in_tmp, staleness):
    """Stopped at the step-2 checkpoint and resumed, a run at staleness k trains steps 3.. on the
    batches the uninterrupted run trains: the k batches drawn ahead are saved with the checkpoint
    and trained first (their versions as recorded), then the new worker continues from step 3 + k.
    ``trainer.ppo_epochs=2`` makes training slower than generation, so the worker generates each
    batch as soon as the gate opens (lag exactly k): only then is the uninterrupted run's schedule
    a deterministic function of the seed, which the comparison needs."""
    from entropyrl.trainers.trainer import train

    def run(folder: str, steps: int) -> list[dict]:
        extra = [f"output_dir={folder}", f"trainer.staleness={staleness}", "trainer.ppo_epochs=2", f"trainer.total_steps={steps}"]
        assert train(compose("train", _overrides(fast_train, *extra)), log=lambda *_: None)["status"] == "FINISHED"
        return _rows(in_tmp / folder)

    whole = run("whole", 5)
    run("resumed", 2)
    resumed = run("resumed", 5)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    # the worker's own batches after the resume: the ones not recorded at the checkpoint
    generated = [r for r in resumed if r["step"] > 2 + staleness]
    lags = [r["async/staleness/mean"] for r in whole[2:] + generated]
    if lags != [float(staleness)] * len(lags):
        pytest.skip(
            f"the worker did not keep k={staleness} steps ahead (lags {lags}): generation was not faster than training here"
        )
    for a, b in zip(whole[2:], resumed[2:]):
        diff = {k: (a[k], b[k]) for k in EXACT_METRICS if abs(a[k] - b[k]) > 1e-6}
        assert not diff, f"step {a['step']}: {diff}"


@pytest.mark.slow
def test_sigterm_to_the_process_group_stops_at_a_step_boundary(fast_train, in_tmp):
    """A scheduler's SIGTERM reaches trainer and worker: the trainer saves at the step boundary and
    says how to resume; the worker does not die first (no 'rollout worker exited' error)."""
    cmd = [
        sys.executable,
        "-m",
        "entropyrl.cli.main",
        "train",
        *_overrides(fast_train, "trainer.staleness=1", "trainer.total_steps=500", "trainer.save_every=0"),
    ]
    proc = subprocess.Popen(cmd, cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (in_tmp / "run" / "metrics.jsonl").exists() or not (in_tmp / "run" / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no step logged in time"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "error:" not in err, err[-3000:]
    steps = [r["step"] for r in _rows(in_tmp / "run")]
    assert json.loads((in_tmp / "run" / "summary.json").read_text())["status"] == "KILLED"
    assert sorted(int(p.name.split("_")[1]) for p in (in_tmp / "run" / "checkpoints").glob("step_*")) == [steps[-1]]
    assert "received SIGTERM" in err and "To continue, run the same command again" in err


# -- the entropy the controllers read: algo.controller_entropy -----------------------------------
def test_controller_entropy_reads_the_chosen_policy():
    current = Algorithm.from_config({}, max_response_length=4)
    assert current.controller_entropy == "current" and current.controller_reading(1.0, 2.0) == 1.0
    behaviour = Algorithm.from_config({"controller_entropy": "behaviour"}, max_response_length=4)
    assert behaviour.controller_reading(1.0, 2.0) == 2.0
    assert behaviour.controller_reading(1.0, None) == 1.0  # no worker (k = 0): the same policy
    with pytest.raises(UserError, match="algo.controller_entropy=sampler is not allowed: it must be one of current, behaviour"):
        Algorithm.from_config({"controller_entropy": "sampler"}, max_response_length=4)


@pytest.mark.slow
def test_with_a_worker_the_controllers_read_the_behaviour_entropy_when_asked(fast_train, in_tmp, monkeypatch):
    from entropyrl.trainers.trainer import train

    read = []
    begin_step = Algorithm.begin_step
    monkeypatch.setattr(Algorithm, "begin_step", lambda self, h: (read.append(h), begin_step(self, h))[1])
    overrides = ["algo=stare", "algo.controller_entropy=behaviour", "trainer.staleness=1", "trainer.total_steps=2"]
    assert train(compose("train", _overrides(fast_train, *overrides)), log=lambda *_: None)["status"] == "FINISHED"
    rows = _rows(in_tmp / "run")
    assert read == [r["async/entropy_behaviour"] for r in rows] == [r["async/controller_entropy"] for r in rows]
    assert all(r["async/controller_entropy_behaviour"] == 1.0 for r in rows)
    assert rows[1]["async/staleness/mean"] == 1.0 and read[1] != rows[1]["entropy"]  # a stale batch: not the current's


@pytest.mark.slow
def test_a_short_async_cli_run_logs_the_histogram_the_gaps_and_the_quartile_shares(fast_train, in_tmp):
    cmd = [sys.executable, "-m", "entropyrl.cli.main", "train"]
    overrides = ["trainer.staleness=1", "trainer.total_steps=3", "algo.interventions=[tis]", "algo.tis.mode=icepop"]
    proc = subprocess.run([*cmd, *_overrides(fast_train, *overrides)], cwd=in_tmp, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(in_tmp / "run")
    tis_quartiles = [f"rollout/tis_clip_frac/entropy_q{i}" for i in range(1, 5)]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert set(ASYNC_METRICS) | set(QUARTILE_METRICS) | set(tis_quartiles) | set(STALE_METRICS) <= set(r)
        assert r["async/staleness/frac_0"] + r["async/staleness/frac_1"] == pytest.approx(1.0)
        assert r["async/staleness/frac_1"] == r["async/staleness/mean"]  # one batch a step: one lag
        shares = [r[k] for k in (*QUARTILE_METRICS, *tis_quartiles) if r[k] is not None]
        assert shares and all(0.0 <= v <= 1.0 for v in shares)
    first, stale = rows[0], rows[1]
    # the first batch comes from the trainer's own weights: behaviour = proximal, and its gap to the current is the proximal's
    assert first["rollout/logp_diff_mean"] == pytest.approx(0.0, abs=1e-6)
    assert first["async/stale_clip_frac"] == 0.0  # the same weights: the stale ratio is 1
    assert first["async/logp_gap/behaviour_current"] == pytest.approx(first["async/logp_gap/proximal_current"], abs=1e-6)
    assert stale["rollout/logp_diff_mean"] > 1e-4 and stale["async/logp_gap/behaviour_current"] > 1e-4


# -- the corrections against their golden vectors (tests/golden/make_async_corrections.py) -----
GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "async_corrections.json").read_text())


def _t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("case", sorted(GOLDEN["cases"]))
def test_m2po_masks_the_largest_squared_log_ratios_to_the_threshold(case):
    inp = GOLDEN["cases"][case]["inputs"]
    old, behaviour, mask = _t64(inp["old_logp"]), _t64(inp["sampling_logp"]), _t64(inp["mask"])
    for want in GOLDEN["cases"][case]["m2po"]:
        keep = m2po_keep(old - behaviour, mask, want["tau"])
        assert torch.equal(keep, _t64(want["keep"]).bool())
        assert float(((old - behaviour)[keep] ** 2).mean()) == pytest.approx(want["second_moment_kept"], rel=1e-9)
        w, masked = mismatch_weight(
            "m2po",
            old,
            behaviour,
            mask,
            cap=2.0,
            icepop_low=0.5,
            icepop_high=5.0,
            seq_low=0.9,
            seq_high=1.1,
            m2_threshold=want["tau"],
        )
        torch.testing.assert_close(w, _t64(want["weight"]), rtol=1e-6, atol=1e-6)
        assert torch.equal(masked, mask.bool() & ~keep)


@pytest.mark.parametrize("case", sorted(GOLDEN["cases"]))
def test_decoupled_objective_matches_areal(case):
    inp = GOLDEN["cases"][case]["inputs"]
    for want in GOLDEN["cases"][case]["decoupled"]:
        algo = Algorithm.from_config(
            {"interventions": ["tis"], "tis": {"mode": "decoupled", "cap": want["cap"]}}, max_response_length=8
        )
        logp = _t64(inp["logp"]).requires_grad_(True)
        out = algo.loss(
            logp=logp,
            old_logp=_t64(inp["old_logp"]),
            entropy=torch.zeros_like(logp),
            advantages=_t64(inp["advantages"]),
            mask=_t64(inp["mask"]),
            sampler_logp=_t64(inp["sampling_logp"]),
        )
        (grad,) = torch.autograd.grad(out.loss, logp)
        torch.testing.assert_close(out.loss.detach(), torch.tensor(want["loss"], dtype=torch.float64), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, _t64(want["grad"]), rtol=1e-6, atol=1e-6)
        w, _ = mismatch_weight(
            "decoupled",
            _t64(inp["old_logp"]),
            _t64(inp["sampling_logp"]),
            _t64(inp["mask"]),
            cap=want["cap"],
            icepop_low=0.5,
            icepop_high=5.0,
            seq_low=0.9,
            seq_high=1.1,
        )
        torch.testing.assert_close(w, _t64(want["weight"]), rtol=1e-6, atol=1e-6)


def test_m2po_threshold_must_be_positive():
    with pytest.raises(UserError, match="m2_threshold must be > 0"):
        Algorithm.from_config({"interventions": ["tis"], "tis": {"mode": "m2po", "m2_threshold": 0.0}}, max_response_length=4)


@pytest.mark.slow
def test_a_killed_worker_ends_the_cli_run_with_one_error_line(fast_train, in_tmp, spawned_children):
    cmd = [
        sys.executable,
        "-m",
        "entropyrl.cli.main",
        "train",
        *_overrides(fast_train, "trainer.staleness=1", "trainer.total_steps=500", "trainer.save_every=2"),
    ]
    proc = subprocess.Popen(cmd, cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    metrics = in_tmp / "run" / "metrics.jsonl"
    while not metrics.exists() or len(metrics.read_text().splitlines()) < 2:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no step logged in time"
        time.sleep(0.05)
    (worker,) = spawned_children(proc.pid)
    os.kill(worker, signal.SIGKILL)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"the rollout worker (pid {worker}) exited with code -9" in errors[0], err[-3000:]
    saved = sorted(int(p.name.split("_")[1]) for p in (in_tmp / "run" / "checkpoints").glob("step_*"))
    assert saved and saved[-1] >= 2  # what was saved before the worker died stays
