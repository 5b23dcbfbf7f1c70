"""What a resume reads back is checked before it is believed: a damaged or missing config.yaml is
replaced by the checkpoint's own copy of the config (a changed request is refused, config.yaml is
not rewritten), a metrics.jsonl line without an integer step and a truncated tracking.json are one
error line naming the file, the line and the way out, and a changed LoRA rank is a changed config.
One real LoRA run of the embedded model; its folder is copied and damaged per case."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.core.tracking import read_metrics
from entropyrl.trainers.run.run_dir import check_output_dir

RUN = [
    "data=toy",
    "trainer.total_steps=2",
    "trainer.prompts_per_step=8",
    "trainer.mini_batch_prompts=4",
    "trainer.save_every=2",
    "trainer.val_every=0",
    "val.prompts=0",
    "trainer.progress=false",
    "trainer.threads=1",
    "model.lora.rank=4",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    from entropyrl.trainers.trainer import train

    root = tmp_path_factory.mktemp("records")
    cfg = compose("train", [*RUN, f"output_dir={root / 'run'}", f"tracking.uri=sqlite:///{root / 'mlflow.db'}"])
    assert train(cfg, log=lambda *_: None)["status"] == "FINISHED"
    return root


@pytest.fixture()
def run(original, tmp_path) -> Path:
    shutil.copytree(original / "run", tmp_path / "run")
    shutil.copyfile(original / "mlflow.db", tmp_path / "mlflow.db")  # the store the run is tracked in
    return tmp_path / "run"


def _request(run: Path, *extra: str):
    return compose("train", [*RUN, f"output_dir={run}", f"tracking.uri=sqlite:///{run.parent / 'mlflow.db'}", *extra])


def test_every_checkpoint_keeps_a_copy_of_the_config(run):
    copy = run / "checkpoints" / "step_000002" / "config.yaml"
    assert copy.read_text() == (run / "config.yaml").read_text()


@pytest.mark.parametrize("damage", ["unparseable", "deleted"])
def test_without_a_readable_config_yaml_a_changed_request_is_refused_against_the_checkpoints_copy(run, damage):
    if damage == "unparseable":
        (run / "config.yaml").write_text("algo: [grpo\ntrainer: {total_steps: 2\n")
    else:
        (run / "config.yaml").unlink()
    before = (run / "config.yaml").read_bytes() if damage == "unparseable" else None
    with pytest.raises(UserError) as err:
        check_output_dir(_request(run, "algo=stare_o1", "optim.lr=1e-2"))
    msg = str(err.value)
    assert "\n" not in msg and "algo.name: grpo -> stare_o1" in msg and "optim.lr: 0.0003 -> 0.01" in msg
    assert "compared with the checkpoint's copy" in msg and "trainer.resume=overwrite" in msg
    if before is not None:
        assert (run / "config.yaml").read_bytes() == before  # not rewritten to claim STARE
    assert check_output_dir(_request(run, "trainer.total_steps=3")) == "resume"  # the same settings: resumes


def test_without_config_yaml_nor_a_copy_a_resume_is_refused(run):
    (run / "config.yaml").unlink()
    (run / "checkpoints" / "step_000002" / "config.yaml").unlink()  # a checkpoint from before copies
    with pytest.raises(UserError, match="no copy of the run's config.*restore config.yaml, or .*trainer.resume=overwrite"):
        check_output_dir(_request(run))
    assert check_output_dir(_request(run, "trainer.resume=overwrite")) == "overwrite"  # the way out


@pytest.mark.parametrize(
    "line, found",
    [('{"entropy": 0.5}', 'no "step"'), ('{"step": "3", "entropy": 0.5}', '"step": "3"'), ("[3, 0.5]", "a JSON list")],
)
def test_a_metrics_line_without_an_integer_step_names_the_file_and_line(run, line, found):
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], line, *lines[1:]]) + "\n")
    with pytest.raises(UserError) as err:
        check_output_dir(_request(run, "trainer.total_steps=3"))
    msg = str(err.value)
    assert "\n" not in msg and f"{metrics}:2:" in msg and found in msg and "trainer.resume=overwrite" in msg
    assert [r["step"] for r in read_metrics(run)] == [1, 2]  # readers skip it, never a KeyError


def test_a_truncated_tracking_json_names_the_file_and_the_way_out(run):
    link = run / "tracking.json"
    link.write_text(link.read_text()[:15])
    with pytest.raises(UserError) as err:
        check_output_dir(_request(run, "trainer.total_steps=3"))
    msg = str(err.value)
    assert "\n" not in msg and str(link) in msg and "not valid JSON" in msg and "delete it" in msg


def test_the_cli_says_one_line_for_a_damaged_record(run):
    metrics = run / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 2.0}\n')
    out = subprocess.run(
        [sys.executable, "-m", "entropyrl.cli.main", "train", *RUN, f"output_dir={run}", "tracking.enabled=false"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"error: {metrics}:3: not a step's record" in out.stderr


def test_a_changed_lora_rank_is_refused_as_a_changed_config_even_without_config_yaml(run):
    from entropyrl.trainers.run.run_dir import check_adapter

    (run / "config.yaml").unlink()
    with pytest.raises(UserError, match=r"model.lora.rank: 4 -> 8.*checkpoint's copy"):
        check_output_dir(_request(run, "model.lora.rank=8"))
    with pytest.raises(UserError) as err:  # the adapter itself says its rank
        check_adapter(run, _request(run, "model.lora.rank=8"), "start fresh")
    assert "a LoRA run of rank 4" in str(err.value) and "model.lora.rank=4" in str(err.value)
    with pytest.raises(UserError, match="full fine-tuning"):
        check_adapter(run, _request(run, "model.lora.rank=null"), "start fresh")
    check_adapter(run, _request(run), "start fresh")  # the same rank: fine


def test_a_resume_from_the_checkpoints_copy_continues_and_writes_config_yaml_again(run):
    from entropyrl.trainers.trainer import train

    (run / "config.yaml").write_text("{{{ damaged")
    log: list[str] = []
    summary = train(_request(run, "trainer.total_steps=3"), log=log.append)
    assert summary["status"] == "FINISHED" and any("resumed from" in m and "(step 2)" in m for m in log), log
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["algo"]["name"] == "grpo" and saved["trainer"]["total_steps"] == 3
