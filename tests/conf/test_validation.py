"""Config values are checked (type and range) before any side effect: one `error:` line naming the
key, the bad value and what is allowed, exit 2, no output folder, no MLflow store or run.
Real CLI subprocesses in an empty working directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.core.validation import SCHEMAS, Rule, validate_config

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def assert_one_line_error(out: subprocess.CompletedProcess, *fragments: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert "Traceback" not in out.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def assert_nothing_created(workdir, *names: str) -> None:
    created = sorted(p.name for p in workdir.iterdir())
    assert created == sorted(names), created  # no output folder, no mlflow.db, no mlruns/


@pytest.mark.parametrize(
    "override, allowed",
    [
        ("trainer.total_steps=abc", "a positive integer"),
        ("trainer.total_steps=-5", "a positive integer"),  # used to "succeed" with 0 steps
        ("trainer.total_steps=2.5", "a positive integer"),  # used to run 2 steps silently
        ("optim.lr=-1", "a number > 0"),
        ("optim.lr=abc", "a number > 0"),
        ("rollout.n=0", "a positive integer"),
        ("trainer.resume=maybe", "one of auto, never, overwrite"),  # used to be taken as auto
        ("tracking.name=wandb", "one of mlflow"),  # was accepted and read by nothing: the run went to MLflow
        ("algo=stare algo.stare.p=1.5", "in (0, 1]"),  # the intervention's own range (Params.validate)
        ("trainer.threads=abc", "0 / auto for the CPUs left"),  # used to end in a ValueError traceback
        ("trainer.threads=-2", "a positive integer (torch threads)"),  # used to run on 1 thread silently
    ],
)
def test_bad_train_values_fail_before_anything_is_created(override, allowed, tmp_path, cli_in_process):
    out = cli_in_process("train", *override.split(), "output_dir=run")
    assert_one_line_error(out, override.split()[-1], allowed)
    assert_nothing_created(tmp_path)


def test_bad_value_in_a_real_cli_process(tmp_path):
    out = run_cli("train", "trainer.total_steps=abc", "output_dir=run", cwd=tmp_path)
    assert_one_line_error(out, "trainer.total_steps=abc is not allowed: it must be a positive integer")
    assert_nothing_created(tmp_path)


@pytest.mark.parametrize(
    "make, output_dir, fragment",
    [
        (lambda d: (d / "taken").write_text("x"), "taken", "is a file, not a folder"),
        (lambda d: (d / "taken").write_text("x"), "taken/run", "lies under"),
    ],
)
def test_output_dir_that_is_or_lies_under_a_file(make, output_dir, fragment, tmp_path):
    make(tmp_path)
    out = run_cli("train", f"output_dir={output_dir}", cwd=tmp_path)
    assert_one_line_error(out, f"output_dir={output_dir}", fragment)
    assert_nothing_created(tmp_path, "taken")
    out = run_cli("eval", "aime24", f"output_dir={output_dir}", cwd=tmp_path)
    assert_one_line_error(out, f"output_dir={output_dir}", fragment)
    assert_nothing_created(tmp_path, "taken")


def test_sweep_seeds_must_be_integers(tmp_path):
    out = run_cli("sweep", "ablation=gate", "seeds=abc", "sweep_dir=sw", cwd=tmp_path)
    assert_one_line_error(out, "seeds=abc", "a list of integers")
    assert_nothing_created(tmp_path)


def test_sweep_dry_run_checks_every_jobs_composed_config(tmp_path):
    out = run_cli("sweep", "ablation=gate", "--dry-run", "train.trainer.total_steps=abc", "sweep_dir=sw", cwd=tmp_path)
    assert_one_line_error(out, "trainer.total_steps=abc", "a positive integer", "variant ")
    assert_nothing_created(tmp_path)


def test_sweep_dry_run_checks_every_jobs_algorithm_and_interventions(tmp_path):
    out = run_cli("sweep", "ablation=gate", "--dry-run", "train.algo.stare.p=2", "sweep_dir=sw", cwd=tmp_path)
    assert_one_line_error(out, "algo.stare.p=2 is not allowed", "in (0, 1]", "variant ")
    assert_nothing_created(tmp_path)


def test_grade_out_under_a_file_fails_before_grading(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"response": "\\boxed{2}", "answer": "2"}) + "\n")
    (tmp_path / "taken").write_text("x")
    out = run_cli("grade", "in.jsonl", "--out", "taken/graded.jsonl", cwd=tmp_path)
    assert_one_line_error(out, "--out taken/graded.jsonl", "lies under", "which is a file")
    assert_nothing_created(tmp_path, "in.jsonl", "taken")
    out = run_cli("grade", "in.jsonl", "--workers", "0", cwd=tmp_path)
    assert_one_line_error(out, "--workers", ">= 1")


# -- the tables themselves (in-process: pure checks) ---------------------------------------------
@pytest.mark.parametrize("config_name", sorted(SCHEMAS))
def test_shipped_defaults_pass_their_table(config_name):
    validate_config(compose(config_name, validate=False), config_name)


@pytest.mark.parametrize(
    "config_name, override, fragment",
    [
        ("train", "optim.weight_decay=-0.1", "optim.weight_decay=-0.1 is not allowed: it must be a number >= 0"),
        ("train", "trainer.progress=maybe", "must be true or false"),
        ("train", "val.top_p=0", "val.top_p=0 is not allowed: it must be a number in (0, 1]"),
        ("train", "model.warm_start.label_noise=2", "in [0, 1]"),
        ("train", "tracking.experiment=''", "a non-empty string"),
        ("eval", "eval.n_samples=0", "a positive integer, or null"),
        ("eval", "eval.grade_timeout=0", "eval.grade_timeout=0 is not allowed"),
        ("eval", "eval.backend=''", "eval.backend= is not allowed: it must be a non-empty string"),
        ("eval", "eval.threads=1.5", "eval.threads=1.5 is not allowed: it must be a positive integer (torch threads)"),
        ("train", "trainer.threads=0.5", "or 0 / auto for the CPUs left to the run"),
        ("sweep", "seeds=[0,-1]", "seeds=[0,-1]"),
        ("sweep", "launcher.max_parallel=0", "launcher.max_parallel=0"),
    ],
)
def test_bad_values_name_key_value_and_allowed(config_name, override, fragment):
    with pytest.raises(UserError) as info:
        compose(config_name, override.split())
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


# -- a component's own values: declared beside it, checked once by the training pre-flight -------
@pytest.mark.parametrize(
    "override, fragment",
    [
        ("algo=steer algo.steer.lambda_min=0.9 algo.steer.lambda_max=0.5", "algo.steer.lambda_min=0.9 must be <="),
        ("algo=stare algo.stare.p=0", "algo.stare.p=0 is not allowed: it must be a number in (0, 1]"),
        ("algo.clip.low=1.5", "algo.clip.low=1.5 is not allowed: it must be a number in [0, 1]"),
        ("algo.clip.low=-0.1", "algo.clip.low=-0.1 is not allowed"),
        ("algo.kl_coef=-1", "algo.kl_coef=-1 is not allowed: it must be a number >= 0"),
        ("algo.dynamic_sampling.max_num_gen_batches=0", "max_num_gen_batches=0 is not allowed: it must be a positive"),
        ("algo.dynamic_sampling.enabled=maybe", "algo.dynamic_sampling.enabled=maybe is not allowed: it must be true or false"),
        ("algo=clip_cov algo.clip_cov.ratio=2", "algo.clip_cov: need 0 <= ratio <= 1"),
        ("algo.loss_agg=sum", "unknown algo.loss_agg=sum; valid: "),
        ("algo.overlong.enabled=true algo.overlong.buffer=0", "algo.overlong.buffer=0 is not allowed"),
        ("rollout=vllm rollout.tis.enabled=true rollout.tis.cap=0", "rollout.tis.cap must be > 0"),
    ],
)
def test_component_values_are_checked_once_before_anything_is_created(override, fragment, tmp_path):
    from entropyrl.trainers.preflight import check_training

    cfg = compose("train", [*override.split(), f"output_dir={tmp_path / 'run'}"])  # compose leaves them
    with pytest.raises(UserError) as info:
        check_training(cfg)
    assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert not (tmp_path / "run").exists()


def test_the_shared_tables_hold_no_component_keys():
    # the algorithm's keys live in ALGO_KEYS, each intervention's in its Params: nowhere else
    from entropyrl.trainers.algos.algorithm import ALGO_KEYS

    assert not [k for table in SCHEMAS.values() for k in table if k.startswith("algo.")]
    assert "clip.low" in ALGO_KEYS and "stare.p" not in ALGO_KEYS


def test_integral_floats_are_integers_but_fractions_are_not():
    rule = Rule("int", low=1)
    assert rule.ok(3) and rule.ok(3.0) and not rule.ok(2.5) and not rule.ok(True) and not rule.ok("3")
    assert compose("train", ["trainer.total_steps=1e3"]).trainer.total_steps == 1000.0


def test_the_algorithms_defaults_are_declared_once_in_the_grpo_yaml():
    """Every key of ALGO_KEYS has its default in conf/algo/grpo.yaml and nowhere else: the algorithm
    built from nothing, from a plain dict and from the composed config agree (overlong.buffer once
    differed: 2 in the YAML, 0 in the code)."""
    import dataclasses

    from entropyrl.trainers.algos.algo_config import algo_defaults, default
    from entropyrl.trainers.algos.algorithm import ALGO_KEYS, Algorithm
    from entropyrl.trainers.interventions.base import LossContext

    for key in ALGO_KEYS:
        default(key)  # a KeyError names a key the YAML lacks
    composed = Algorithm.from_config(compose("train").algo, max_response_length=8)
    for built in (Algorithm(max_response_length=8), Algorithm.from_config({}, max_response_length=8)):
        assert repr(built).split(", ", 1)[1] == repr(composed).split(", ", 1)[1]  # all but the name
        assert (built.eps_low, built.eps_high, built.dual_c, built.overlong_buffer, built.loss_agg, built.objective) == (
            composed.eps_low,
            composed.eps_high,
            composed.dual_c,
            composed.overlong_buffer,
            composed.loss_agg,
            composed.objective,
        )
    assert algo_defaults()["overlong"]["buffer"] == composed.overlong_buffer == 2
    # the loss context and the surrogate take the configured clip; they carry no default of their own
    fields = {f.name: f for f in dataclasses.fields(LossContext)}
    assert all(fields[k].default is dataclasses.MISSING for k in ("eps_low", "eps_high", "dual_c"))


# -- the schema is complete: every key any shipped YAML sets has a rule, and every rule a key ---------
# The schema of a command is its YAML (the one place each default is declared, commented where it is
# declared) plus its rule table (core/validation.py: the type and range of each key, or the component
# that checks a section). These tests keep the two one-to-one over every shipped config file.
PRIMARY_GROUPS = {
    "train": ("algo", "model", "data", "rollout", "tools", "tracking", "experiment", "intervention"),
    "eval": ("model", "tools", "tracking"),
    "sweep": ("ablation", "launcher", "tracking"),
}
# algo.<key> that name a registered component (checked against its registry where it is read)
ALGO_NAMED = ("name", "advantage", "loss_agg", "objective", "objective_args", "interventions")


def _yaml_keys(node, prefix: str = "") -> list[str]:
    keys = []
    for k, v in node.items():
        if k == "defaults" and not prefix:
            continue
        if isinstance(v, dict) and v:
            keys += _yaml_keys(v, f"{prefix}{k}.")
        else:
            keys.append(f"{prefix}{k}")
    return keys


def _shipped_keys() -> dict[str, dict[str, str]]:
    """``{command: {key: the file that sets it}}`` over the command's run schema (core/schema/), the
    primary YAML, the schemas of its groups (``GROUP_SCHEMAS``) and every option of its groups (where
    each lands: ``# @package _global_`` at the root, an intervention at ``algo.<name>``, any other
    option under its group)."""
    import yaml

    from entropyrl.conf import CONF_DIR, GROUP_SCHEMAS, RUN_SCHEMAS
    from entropyrl.core.schema import defaults

    out: dict[str, dict[str, str]] = {}
    for command, groups in PRIMARY_GROUPS.items():
        keys = {k: f"core/schema/{command}.py" for k in _yaml_keys(defaults(RUN_SCHEMAS[command]))}
        for k in _yaml_keys(yaml.safe_load((CONF_DIR / f"{command}.yaml").read_text())):
            keys.setdefault(k, f"{command}.yaml")
        for group in groups:
            group_schemas = GROUP_SCHEMAS.get(group)
            for schema in group_schemas.values() if isinstance(group_schemas, dict) else [group_schemas]:
                for k in _yaml_keys(defaults(schema)) if schema is not None else []:
                    keys.setdefault(f"{group}.{k}", f"core/schema/{group}.py")
            for path in sorted((CONF_DIR / group).glob("*.yaml")):
                text = path.read_text()
                node = yaml.safe_load(text) or {}
                if "# @package _global_" in text.split("\n", 3)[0]:
                    prefix = ""
                elif group == "intervention":
                    prefix = f"algo.{path.stem}."
                else:
                    prefix = f"{group}."
                for k in _yaml_keys(node):
                    keys.setdefault(prefix + k, f"{group}/{path.name}")
        out[command] = keys
    return out


def _algo_key_declared(rest: str) -> bool:
    import dataclasses

    from entropyrl.trainers.algos.algorithm import ALGO_KEYS
    from entropyrl.trainers.interventions import INTERVENTIONS

    head, _, tail = rest.partition(".")
    if rest in ALGO_KEYS or head in ALGO_NAMED:
        return True
    if head in INTERVENTIONS and tail:
        return tail.split(".")[0] in {f.name for f in dataclasses.fields(INTERVENTIONS[head].Params)}
    return False


def test_every_key_a_shipped_yaml_sets_has_a_rule():
    from entropyrl.core.validation import rule_for

    missing = []
    for command, keys in _shipped_keys().items():
        for key, where in sorted(keys.items()):
            if key.startswith("algo."):
                ok = _algo_key_declared(key[len("algo.") :])
            else:
                ok = key.startswith("hydra.") or rule_for(command, key) is not None
            if not ok:
                missing.append(f"{command}: {key} (set in {where})")
    assert not missing, "keys without a rule (core/validation.py, ALGO_KEYS or a Params):\n" + "\n".join(missing)


def test_every_rule_names_a_key_a_shipped_yaml_sets():
    keys = _shipped_keys()
    stale = []
    for command, table in SCHEMAS.items():
        for key in table:
            own = key[:-2] if key.endswith(".*") else key
            if own not in keys[command] and not any(k.startswith(own + ".") for k in keys[command]):
                stale.append(f"{command}: {key}")
    assert not stale, "rules for keys no shipped YAML sets:\n" + "\n".join(stale)


@pytest.mark.parametrize("command, group", [("train", "tools"), ("sweep", "ablation"), ("sweep", "launcher")])
def test_every_preset_passes_the_schema(command, group):
    """Options composed nowhere else (tests/conf/test_config.py composes the train groups, the lab and
    preset tests the experiments): each composes and every value it sets passes its rule."""
    from entropyrl.conf import config_groups

    for option in config_groups()[group]:
        validate_config(compose(command, [f"{group}={option}"]), command)


def test_the_val_keys_validation_reads_are_declared_and_reach_it():
    """``validate`` reads ``val.prompt``, ``chat_template``, ``batch_size`` and ``data_root`` (as
    ``entropyrl eval`` reads ``eval.*``); they were refused as keys "nothing reads", so a run trained
    on the dapo prompt could only validate its benchmarks on the boxed one. An unknown prompt is one
    line before the run (null: the default prompt passes)."""
    from entropyrl.core.errors import UserError
    from entropyrl.evals.settings import EvalSettings
    from entropyrl.trainers.preflight import check_training

    cfg = compose("train", ["val.prompt=dapo", "val.chat_template=false", "val.batch_size=4", "val.data_root=/data"])
    assert EvalSettings.from_cfg(cfg.val).prompt == "dapo" and EvalSettings.from_cfg(cfg.val).chat_template is False
    assert (cfg.val.batch_size, cfg.val.data_root) == (4, "/data")
    with pytest.raises(UserError, match=r"unknown val.prompt=dpo; valid: boxed, dapo, native"):
        check_training(compose("train", ["val.benchmarks=[math500]", "val.prompt=dpo"]))
    check_training(compose("train", ["val.benchmarks=[math500]"]))
