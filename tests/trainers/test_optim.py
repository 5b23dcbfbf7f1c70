"""The optimizer and learning-rate schedule as config (``optim.*``, trainers/optim.py): the schedule
factors, one-line errors for unknown names and the renamed ``trainer.lr``/``weight_decay``/``betas``
(train, sweep, config show), ``lr`` logged every step (metrics.jsonl and a real MLflow sqlite store),
the scheduler state in checkpoints, and runs saved under the old keys still resuming."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.core.validation import validate_config
from entropyrl.trainers.optim import LR_SCHEDULES, advance_scheduler, build_optimizer, build_scheduler, check_optim, lr_factor
from entropyrl.trainers.run.run_dir import config_differences, upgrade_saved_config

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
SMALL = [
    "data=toy",
    "trainer.prompts_per_step=4",
    "trainer.mini_batch_prompts=4",
    "val.prompts=0",
    "trainer.val_every=0",
    "trainer.progress=false",
    "trainer.threads=1",
]


def optim(**kw):
    return OmegaConf.create(
        {
            "name": "adamw",
            "lr": 1.0,
            "weight_decay": 0.0,
            "betas": [0.9, 0.999],
            "scheduler": "constant",
            "warmup_steps": 0,
            "min_lr_ratio": 0.0,
            **kw,
        }
    )


def factors(cfg, total: int) -> list[float]:
    return [lr_factor(cfg, s, total) for s in range(total)]


# -- the schedule ------------------------------------------------------------------------------
def test_constant_without_warmup_is_exactly_the_lr():
    assert set(factors(optim(), 30)) == {1.0}


def test_warmup_rises_linearly_from_zero_as_verl_then_each_schedule():
    for name in ("constant", "linear", "cosine"):
        f = factors(optim(scheduler=name, warmup_steps=4), 20)
        assert f[:5] == [0.0, 0.25, 0.5, 0.75, 1.0], name
    linear = optim(scheduler="linear", min_lr_ratio=0.1)
    lin = [lr_factor(linear, s, 10) for s in range(11)]  # steps 0..10 of a 10-step run
    assert lin[0] == 1.0 and all(a > b for a, b in zip(lin, lin[1:]))
    assert math.isclose(lin[5], 1 - 0.9 * 0.5) and math.isclose(lin[10], 0.1)
    cos = factors(optim(scheduler="cosine", warmup_steps=2, min_lr_ratio=0.2), 12)
    assert math.isclose(cos[7], 0.2 + 0.8 * 0.5)  # half-way through the decay: the mid-point
    assert math.isclose(lr_factor(optim(scheduler="cosine", min_lr_ratio=0.2), 12, 12), 0.2)  # the floor
    assert all(a > b for a, b in zip(cos[2:], cos[3:]))


def test_the_scheduler_applies_the_factor_per_training_step():
    params = [torch.nn.Parameter(torch.zeros(2))]
    cfg = optim(lr=0.5, scheduler="cosine", warmup_steps=2)
    opt = build_optimizer(params, cfg)
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["betas"] == (0.9, 0.999)
    sched = build_scheduler(opt, cfg, total_steps=6)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == [0.5 * f for f in factors(cfg, 6)]


def test_a_first_step_without_an_update_still_advances_the_schedule_without_a_warning():
    # an all-equal first batch makes no optimizer step; the schedule counts training steps anyway
    import warnings

    params = [torch.nn.Parameter(torch.zeros(2))]
    cfg = optim(lr=0.5, warmup_steps=4)
    opt = build_optimizer(params, cfg)
    sched = build_scheduler(opt, cfg, total_steps=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "lr_scheduler.step() before optimizer.step()"
        advance_scheduler(sched)
    assert opt.param_groups[0]["lr"] == 0.5 * 0.25
    with pytest.warns(UserWarning, match="before `optimizer.step"):  # what plain .step() would have said
        build_scheduler(build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg), cfg, 8).step()


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(UserError, match=r"^unknown optim.name=sgd; valid: adamw$"):
        check_optim(optim(name="sgd"))
    with pytest.raises(UserError, match=r"^unknown optim.scheduler=step; valid: " + ", ".join(sorted(LR_SCHEDULES)) + "$"):
        check_optim(optim(scheduler="step"))


# -- config: ranges and the renamed keys -------------------------------------------------------
@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=0", "optim.lr=0 is not allowed: it must be a number > 0"),
        ("optim.betas=[0.9]", "optim.betas=[0.9] is not allowed: it must be a list of 2 numbers (each in [0, 1))"),
        ("optim.betas=[0.9,1.0]", "optim.betas=[0.9,1] is not allowed"),
        ("optim.warmup_steps=-1", "optim.warmup_steps=-1 is not allowed: it must be an integer >= 0"),
        ("optim.min_lr_ratio=1.5", "optim.min_lr_ratio=1.5 is not allowed: it must be a number in [0, 1]"),
        ("trainer.lr=5e-4", "trainer.lr was renamed optim.lr; use optim.lr=5e-4"),
        ("+trainer.weight_decay=0.1", "trainer.weight_decay was renamed optim.weight_decay; use optim.weight_decay=0.1"),
        ("trainer.betas=[0.9,0.95]", "trainer.betas was renamed optim.betas; use optim.betas=[0.9,0.95]"),
    ],
)
def test_bad_optim_values_and_renamed_keys_are_one_line_errors(override, message):
    with pytest.raises(UserError) as err:
        compose("train", [override])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_renamed_key_set_by_a_config_file_is_refused_too():
    from hydra.core.config_store import ConfigStore

    # an experiment config of the earlier layout (a user's YAML; stored here in Hydra's ConfigStore)
    ConfigStore.instance().store(group="experiment", name="test_old_lr", package="_global_", node={"trainer": {"lr": 1e-3}})
    with pytest.raises(UserError, match=r"^trainer.lr was renamed optim.lr; use optim.lr=0.001$"):
        compose("train", ["experiment=test_old_lr"])
    plain = OmegaConf.to_container(compose("train", []))
    plain["trainer"]["betas"] = [0.9, 0.95]
    with pytest.raises(UserError, match=r"^trainer.betas was renamed optim.betas; use optim.betas=\[0.9,0.95\]$"):
        validate_config(plain, "train")


def test_cli_train_sweep_and_config_show_name_the_new_key(in_tmp):
    for argv in (
        ["train", "trainer.lr=1e-3"],
        ["config", "show", "trainer.lr=1e-3"],
        ["sweep", "ablation=gate", "--dry-run", "trainer.lr=1e-3"],
        ["sweep", "ablation=gate", "--dry-run", "train.trainer.weight_decay=0.1"],
    ):
        out = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=300)
        assert out.returncode == 2, (argv, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and " was renamed optim." in lines[0] and "; use optim." in lines[0], (argv, lines)
    out = subprocess.run([*CLI, "train", "optim.name=sgd", "output_dir=never"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip() == "error: unknown optim.name=sgd; valid: adamw", out.stderr[-2000:]
    assert not (in_tmp / "never").exists()  # refused before anything was created


def test_saved_configs_under_the_old_keys_compare_as_the_same_settings():
    requested = OmegaConf.to_container(compose("train", []), resolve=True)
    old = json.loads(json.dumps(requested))
    opt = old.pop("optim")
    old["trainer"].update(lr=opt["lr"], weight_decay=opt["weight_decay"], betas=opt["betas"])
    assert config_differences(upgrade_saved_config(old, requested), requested) == []
    cosine = json.loads(json.dumps(requested))
    cosine["optim"]["scheduler"] = "cosine"  # the old run had a constant lr: not the same run
    assert config_differences(upgrade_saved_config(old, cosine), cosine) == [("optim.scheduler", "constant", "cosine")]


# -- real runs ---------------------------------------------------------------------------------
def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_cosine_with_warmup_logs_an_lr_that_rises_for_5_steps_then_falls(in_tmp):
    out = subprocess.run(
        [
            *CLI,
            "train",
            "optim.scheduler=cosine",
            "optim.warmup_steps=5",
            "trainer.total_steps=20",
            *SMALL,
            "trainer.save_every=0",
            "output_dir=run",
            "tracking.uri=sqlite:///mlflow.db",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lrs = [r["lr"] for r in rows_of(in_tmp / "run")]
    assert len(lrs) == 20
    assert all(a < b for a, b in zip(lrs[:6], lrs[1:6])), lrs  # steps 1..6: rising (5 rises)
    assert all(a > b for a, b in zip(lrs[5:], lrs[6:])), lrs  # then falling to the end
    assert math.isclose(max(lrs), 3e-4)
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{in_tmp / 'mlflow.db'}")
    run_id = json.loads((in_tmp / "run" / "summary.json").read_text())["mlflow_run_id"]
    history = sorted(client.get_metric_history(run_id, "lr"), key=lambda m: m.step)
    assert [m.step for m in history] == list(range(1, 21))
    assert [m.value for m in history] == pytest.approx(lrs)


@pytest.mark.slow
def test_the_schedule_resumes_from_the_checkpoint(in_tmp):
    from entropyrl.trainers.run.checkpoint import load_trainer_state
    from entropyrl.trainers.trainer import train

    base = [*SMALL, "optim.warmup_steps=6", "output_dir=run", "tracking.enabled=false", "trainer.save_every=3"]
    train(compose("train", [*base, "trainer.total_steps=3"]), log=lambda *_: None)
    state = load_trainer_state(in_tmp / "run" / "checkpoints" / "step_000003")
    assert state["scheduler"]["last_epoch"] == 3
    train(compose("train", [*base, "trainer.total_steps=8"]), log=lambda *_: None)
    assert [r["lr"] for r in rows_of(in_tmp / "run")] == pytest.approx(
        [3e-4 * f for f in (0, 1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1, 1)]
    )


@pytest.mark.slow
def test_a_run_saved_before_the_optim_section_resumes(in_tmp):
    from entropyrl.trainers.trainer import train

    base = [*SMALL, "output_dir=run", "tracking.enabled=false", "trainer.save_every=2"]
    train(compose("train", [*base, "trainer.total_steps=2"]), log=lambda *_: None)
    # what a run of the earlier layout left: trainer.lr/weight_decay/betas, no optim, no scheduler state
    run = in_tmp / "run"
    saved = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    opt = saved.pop("optim")
    saved["trainer"].update(lr=opt["lr"], weight_decay=opt["weight_decay"], betas=opt["betas"])
    (run / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    state_path = run / "checkpoints" / "step_000002" / "trainer_state.pt"
    state = torch.load(state_path, weights_only=False)
    del state["scheduler"]
    torch.save(state, state_path)
    log: list[str] = []
    summary = train(compose("train", [*base, "trainer.total_steps=4"]), log=log.append)
    assert summary["steps"] == 4 and any("resumed from" in m for m in log), log
    assert [r["step"] for r in rows_of(run)] == [1, 2, 3, 4]
    assert {r["lr"] for r in rows_of(run)} == {3e-4}
