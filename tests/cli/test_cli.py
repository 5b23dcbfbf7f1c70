"""The command line: help texts, one-line errors, config show. Real subprocesses of the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_top_level_help_lists_commands():
    out = run_cli("--help")
    assert out.returncode == 0, out.stderr
    for command in ("train", "eval", "grade", "sweep", "config"):
        assert command in out.stdout


def test_quick_help_lists_the_commands_the_app_registers_and_imports_no_framework():
    """``entropyrl --help`` and ``entropyrl train --help`` answer without Typer (cli/quick_help.py);
    their command list is the Typer app's, and every other command's help is Typer's own."""
    from entropyrl.cli.app import app
    from entropyrl.cli.quick_help import COMMANDS

    registered = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert set(COMMANDS) == registered
    probe = (
        "import sys; from entropyrl.cli.main import main; main(['--help']); main(['train', '--help']); "
        "print(sorted(m for m in ('typer', 'rich', 'click', 'hydra', 'omegaconf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    eval_help = run_cli("eval", "--help").stdout  # Typer's, with its options
    assert "Usage:" in eval_help and "eval" in eval_help and "--help" in eval_help


def test_train_help_lists_groups_and_options():
    out = run_cli("train", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for fragment in ("algo:", "grpo", "dapo", "model:", "tiny", "data:", "toy", "rollout:", "hf", "tracking:", "mlflow"):
        assert fragment in text
    assert "launcher:" not in text  # launchers are the sweep's


@pytest.mark.parametrize(
    "args, expected",
    [
        (["train", "algo=nope"], "unknown algo=nope"),
        (["train", "model=gpt9"], "unknown model=gpt9"),
        (["train", "trainer.no_such_key=1"], "unknown config key 'trainer.no_such_key'"),
        (["train", "trainer.total_steps"], "write overrides as key=value"),
        (["config", "show", "rollout=nope"], "unknown rollout=nope"),
        (["train", "launcher=slurm"], "launcher=slurm is for sweeps"),
        # lab options the chosen experiment does not read (they were ignored without a word)
        (["lab", "--experiment", "tools", "--quadrant-batches", "5"], "which --experiment tools does not run: drop it"),
        (["lab", "--experiment", "quadrants", "--algos", "grpo"], "--algos grpo would do nothing: drop it"),
    ],
)
def test_bad_overrides_give_one_line_errors(args, expected, tmp_path):
    out = run_cli(*args, cwd=tmp_path)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ") and expected in lines[0]
    assert "Traceback" not in out.stderr


def test_unknown_group_option_names_valid_choices(tmp_path):
    out = run_cli("train", "algo=grop", cwd=tmp_path)
    assert "valid:" in out.stderr and "grpo" in out.stderr and "did you mean grpo" in out.stderr


def test_config_show_prints_composed_config():
    out = run_cli("config", "show", "algo=dapo", "trainer.total_steps=7")
    assert out.returncode == 0, out.stderr
    import yaml

    cfg = yaml.safe_load(out.stdout)
    assert cfg["algo"]["name"] == "dapo" and cfg["algo"]["clip"]["high"] == 0.28
    assert cfg["trainer"]["total_steps"] == 7
    assert cfg["model"]["name"] == "tiny"
