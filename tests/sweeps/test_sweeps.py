"""Sweeps without SLURM: ablation expansion, the shipped ablations, aggregation math on synthetic
metrics, status and report rebuilt from a sweep folder, the dry-run table, and a real local sweep
in which one job fails while the other finishes (then a re-run retries only the failed one)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from entropyrl.conf import compose, config_groups
from entropyrl.core.errors import UserError
from entropyrl.core.folder_lock import FolderLock
from entropyrl.sweeps import aggregate as agg
from entropyrl.sweeps.ablation import expand, merge_overrides, variants_of
from entropyrl.sweeps.planning import validate_jobs
from entropyrl.sweeps.state import save_sweep
from entropyrl.trainers.run.regime import findings_cell

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
# A job of a few seconds: 3 steps of 4 prompts, validation only at the end, one checkpoint.
TINY = [
    "data=toy",
    "train.trainer.total_steps=3",
    "train.trainer.prompts_per_step=4",
    "train.trainer.val_every=3",
    "train.trainer.save_every=0",
    "train.val.prompts=8",
]


def run_cli(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# expansion
# ---------------------------------------------------------------------------------------------
def test_variants_list_grid_and_product():
    listed = variants_of({"name": "x", "variants": [{"name": "a", "overrides": ["algo=stare"]}, "algo=steer"]})
    assert [(v.name, v.overrides) for v in listed] == [("a", ("algo=stare",)), ("steer", ("algo=steer",))]
    grid = variants_of({"name": "x", "grid": {"algo.stare.p": [0.05, 0.2], "algo.stare.gate": [True, False]}})
    assert [v.name for v in grid] == ["p0.05,gatetrue", "p0.05,gatefalse", "p0.2,gatetrue", "p0.2,gatefalse"]
    assert grid[1].overrides == ("algo.stare.p=0.05", "algo.stare.gate=false")
    both = variants_of(
        {
            "name": "x",
            "variants": [{"name": "o1", "overrides": ["algo=stare"]}, {"name": "c2", "overrides": ["algo=stare_c2"]}],
            "grid": {"algo.stare.w": [1.1, 1.2]},
        }
    )
    assert [v.name for v in both] == ["o1,w1.1", "o1,w1.2", "c2,w1.1", "c2,w1.2"]
    assert both[3].overrides == ("algo=stare_c2", "algo.stare.w=1.2")


@pytest.mark.parametrize(
    "ablation, message",
    [
        ({"name": "x"}, "has no variants"),
        ({"variants": ["algo=steer"]}, "the ablation has no name"),
        ({"name": "x", "variants": [{"name": "a"}, {"name": "a"}]}, "two variants are named 'a'"),
        ({"name": "x", "variants": [{"name": "a b", "overrides": []}]}, "must be letters"),
        ({"name": "x", "variants": [{"overrides": ["algo=stare"]}]}, "needs a name"),
        ({"name": "x", "grid": {"algo.stare.p": []}}, "has no values"),
    ],
)
def test_bad_ablations_raise_user_errors(ablation, message):
    with pytest.raises(UserError, match=message):
        variants_of(ablation)


def test_merge_overrides_last_value_wins():
    assert merge_overrides(["a=1", "b=2"], ["+c.d=3", "a=4"], ["c.d=5"]) == ["b=2", "a=4", "c.d=5"]
    with pytest.raises(UserError, match="key=value"):
        merge_overrides(["trainer.total_steps"])


def test_expand_jobs_order_overrides_and_dirs(tmp_path):
    abl = {
        "name": "g",
        "base": ["algo=stare"],
        "variants": [
            {"name": "on", "overrides": ["algo.stare.gate=true", "trainer.total_steps=9"]},
            {"name": "off", "overrides": ["algo=grpo"]},
        ],
    }
    jobs = expand(
        abl,
        seeds=[3, 4],
        sweep_dir=tmp_path / "sw",
        budget=["trainer.total_steps=5", "optim.lr=0.1"],
        train_overrides=["optim.lr=0.2"],
        extra_overrides=["trainer.threads=1"],
    )
    assert [(j.variant, j.seed) for j in jobs] == [("on", 3), ("on", 4), ("off", 3), ("off", 4)]
    on3, off4 = jobs[0], jobs[3]
    assert on3.key == "on/s3" and on3.output_dir == str((tmp_path / "sw" / "runs" / "on" / "s3").resolve())
    # budget < base < variant < command line < the job's own keys
    assert "trainer.total_steps=9" in on3.overrides and "trainer.total_steps=5" not in on3.overrides
    assert "trainer.total_steps=5" in off4.overrides and "algo=grpo" in off4.overrides
    assert "algo=stare" not in off4.overrides
    assert "optim.lr=0.2" in on3.overrides and "optim.lr=0.1" not in on3.overrides
    assert on3.overrides[-4:] == [
        "trainer.seed=3",
        f"output_dir={on3.output_dir}",
        "trainer.resume=auto",
        "trainer.progress=false",
    ]
    assert len({j.output_dir for j in jobs}) == 4
    with pytest.raises(UserError, match="set by the sweep"):
        expand(abl, seeds=[0], sweep_dir=tmp_path, train_overrides=["trainer.seed=1"])
    with pytest.raises(UserError, match="no variant 'nope'"):
        expand(abl, seeds=[0], sweep_dir=tmp_path, only=["nope"])
    assert [j.variant for j in expand(abl, seeds=[0], sweep_dir=tmp_path, only=["off"])] == ["off"]


def test_a_command_line_override_that_would_erase_what_the_variants_differ_in_is_refused(tmp_path):
    """`entropyrl sweep ablation=gate algo.stare.gate=true` trained always_on as gated, under its own name.
    Null: a key the variants do not set (or all set alike) is the user's to change, and one variant alone
    has nothing to erase."""
    abl = {
        "name": "g",
        "variants": [
            {"name": "on", "overrides": ["algo.stare.gate=true", "trainer.total_steps=9"]},
            {"name": "off", "overrides": ["algo.stare.gate=false", "trainer.total_steps=9"]},
            {"name": "grpo", "overrides": ["algo=grpo", "trainer.total_steps=9"]},
        ],
    }
    message = r"'algo.stare.gate=true' would replace the setting that ablation=g's variants differ in \(on algo.stare.gate=true, off algo.stare.gate=false, grpo leaves it unset\)"
    with pytest.raises(UserError, match=message):
        expand(abl, seeds=[0], sweep_dir=tmp_path, train_overrides=["algo.stare.gate=true"])
    with pytest.raises(UserError, match=r"'algo=stare' would replace"):
        expand(abl, seeds=[0], sweep_dir=tmp_path, train_overrides=["algo=stare"])
    for fine in (["trainer.total_steps=3"], ["optim.lr=0.1"]):
        assert len(expand(abl, seeds=[0], sweep_dir=tmp_path, train_overrides=fine)) == 3
    assert len(expand(abl, seeds=[0], sweep_dir=tmp_path, train_overrides=["algo.stare.gate=true"], only=["on"])) == 1


def test_shipped_ablations_compose_and_cover_every_algo(tmp_path):
    names = config_groups()["ablation"]
    for required in ("gate", "quantile", "weight", "variant", "steer_mapping", "steer_min", "clip", "interventions"):
        assert required in names
    for name in names:
        cfg = compose("sweep", [f"ablation={name}"])
        assert cfg.ablation.name == name
        jobs = expand(cfg.ablation, seeds=[0], sweep_dir=tmp_path / name)
        assert len(jobs) >= 2, name
        validate_jobs(jobs)  # every variant's training config composes
    gate = {v.name: v.overrides for v in variants_of(compose("sweep", ["ablation=gate"]).ablation)}
    assert list(gate) == ["gated", "always_on", "off"]
    assert "algo.stare.gate=false" in gate["always_on"] and "experiment=lab_grpo" in gate["off"]
    covered = {
        o.split("=", 1)[1]
        for v in variants_of(compose("sweep", ["ablation=interventions"]).ablation)
        for o in v.overrides
        if o.startswith("algo=")
    }
    assert covered == set(config_groups()["algo"])


def test_split_overrides():
    from entropyrl.sweeps.planning import split_overrides

    sweep, train = split_overrides(
        ["ablation=gate", "train.trainer.total_steps=5", "+train.tracking.tags.x=1", "seeds=[0,1]", "~train.val.benchmarks"]
    )
    assert sweep == ["ablation=gate", "seeds=[0,1]"]
    assert train == ["trainer.total_steps=5", "+tracking.tags.x=1", "~val.benchmarks"]


# ---------------------------------------------------------------------------------------------
# aggregation math
# ---------------------------------------------------------------------------------------------
def write_metrics(
    path: Path, entropy: list[float], val: dict[int, float] | None = None, extra_line: str = "", gate: list[float] | None = None
) -> None:
    path.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, h in enumerate(entropy, start=1):
        row = {"step": i, "entropy": h, "reward/mean": 0.1 * i, "acc/mean": 0.05 * i}
        if gate is not None:
            row["stare/gate_on"] = gate[i - 1]
        if val and i in val:
            row["val/acc"] = val[i]
        lines.append(json.dumps(row))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + extra_line)


def test_aggregation_math_on_synthetic_metrics(tmp_path):
    write_metrics(tmp_path / "a", [1.0, 0.8, 0.5, 0.2, 0.1], {3: 0.4, 5: 0.5}, extra_line='{"step": 6, "entr')
    rows = agg.load_rows(tmp_path / "a")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # the torn last line is skipped
    steps, ent = agg.series(rows, "entropy")
    assert agg.auc(steps, ent) == pytest.approx(0.9 + 0.65 + 0.35 + 0.15)
    assert agg.auc(np.array([0.0, 2.0, 5.0]), np.array([1.0, 1.0, 0.0])) == pytest.approx(2.0 + 1.5)  # uneven steps
    assert agg.auc(np.array([1.0]), np.array([3.0])) == 0.0
    assert agg.first_step_below(steps, ent, 0.3) == 4
    assert agg.first_step_below(steps, ent, 0.05) is None
    assert agg.first_step_below(steps, ent, 0.2) == 5  # strictly below
    assert agg.tail_stats(ent, 0.1) == (0.1, 0.1)
    assert agg.tail_stats(ent, 0.4) == pytest.approx((0.15, 0.1))
    m = agg.run_metrics(rows, threshold=0.3, tail_frac=0.4)
    assert m["final_val_acc"] == 0.5 and m["steps"] == 5 and m["first_step_below"] == 4
    assert m["final_reward"] == pytest.approx(0.5)

    # duplicate steps (a resumed run re-logging a step): the last row wins
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "entropy": h}) for s, h in [(1, 1.0), (2, 0.9), (2, 0.7), (3, 0.6)]) + "\n"
    )
    assert [r["entropy"] for r in agg.load_rows(tmp_path / "b")] == [1.0, 0.7, 0.6]

    b = agg.band([(np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0])), (np.array([1, 2]), np.array([3.0, 0.0]))])
    assert b["steps"].tolist() == [1, 2, 3] and b["mean"].tolist() == [2.0, 1.0, 3.0]
    assert b["lo"].tolist() == [1.0, 0.0, 3.0] and b["hi"].tolist() == [3.0, 2.0, 3.0] and b["n"].tolist() == [2, 2, 1]

    s = agg.variant_summary([{"final_val_acc": 0.5, "first_step_below": 4}, {"final_val_acc": 0.7, "first_step_below": None}])
    assert s["final_val_acc"]["mean"] == pytest.approx(0.6) and s["final_val_acc"]["std"] == pytest.approx(0.1)
    assert s["first_step_below"]["crossed"] == 1 and s["first_step_below"]["of"] == 2
    assert s["first_step_below"]["mean"] == 4


# ---------------------------------------------------------------------------------------------
# status and report from a sweep folder (synthetic jobs)
# ---------------------------------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def make_synthetic_sweep(root: Path) -> Path:
    sw = root / "sw"
    jobs = []
    for variant, seed in [("v1", 0), ("v1", 1), ("v2", 0), ("v2", 1), ("v3", 0), ("v3", 1)]:
        out = sw / "runs" / variant / f"s{seed}"
        jobs.append(
            {
                "key": f"{variant}/s{seed}",
                "variant": variant,
                "seed": seed,
                "output_dir": str(out),
                "overrides": ["trainer.total_steps=5", f"trainer.seed={seed}", f"output_dir={out}"],
            }
        )
    save_sweep(
        sw,
        {
            "sweep_id": "syn-1",
            "sweep_dir": str(sw),
            "ablation": {"name": "syn"},
            "seeds": [0, 1],
            "launcher": {"name": "local"},
            "tracking": {"enabled": False},
            "report": {"entropy_threshold": 0.3, "tail_frac": 0.4},
            "jobs": jobs,
        },
    )
    runs = sw / "runs"
    # v1 is gated STARE: its gate open on 3 of 5 steps in seed 0, 2 of 5 in seed 1
    write_metrics(runs / "v1" / "s0", [1.0, 0.8, 0.5, 0.2, 0.1], {5: 0.5}, gate=[0, 0, 1, 1, 1])
    write_metrics(runs / "v1" / "s1", [1.0, 0.9, 0.6, 0.4, 0.26], {5: 0.7}, gate=[0, 0, 0, 1, 1])
    for seed in (0, 1):
        (runs / "v1" / f"s{seed}" / "job.json").write_text(json.dumps({"state": "done", "steps": 5, "attempt": 1}))
    # what the runs' regime checks wrote (trainers/run/regime.py): both seeds collapsed, one had a warning
    collapse = {"id": "collapse", "message": "entropy collapsed", "first_step": 5}
    (runs / "v1" / "s0" / "summary.json").write_text(
        json.dumps(
            {
                "status": "FINISHED",
                "flags": [{**collapse, "first_step": 4}],
                "warnings": [{"id": "kl_cov_on_policy", "message": "kl_cov's penalty was 0", "first_step": 1}],
            }
        )
    )
    (runs / "v1" / "s1" / "summary.json").write_text(json.dumps({"status": "FINISHED", "flags": [collapse], "warnings": []}))
    (runs / "v2" / "s0").mkdir(parents=True)
    (runs / "v2" / "s0" / "job.json").write_text(json.dumps({"state": "failed", "error": "RuntimeError: boom"}))
    (runs / "v2" / "s0" / "train.log").write_text("Traceback ... RuntimeError: boom\n")
    write_metrics(runs / "v2" / "s1", [1.0, 0.9])
    (runs / "v2" / "s1" / "job.json").write_text(
        json.dumps({"state": "running", "pid": os.getpid(), "host": socket.gethostname()})
    )
    (runs / "v3" / "s0").mkdir(parents=True)
    (runs / "v3" / "s0" / "job.json").write_text(
        json.dumps({"state": "running", "pid": _dead_pid(), "host": socket.gethostname()})
    )
    return sw


def test_status_and_report_rebuild_from_files(tmp_path):
    sw = make_synthetic_sweep(tmp_path)
    out = run_cli("status", str(sw), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    states = {s["key"]: s for s in json.loads(out.stdout)}
    assert {k: s["state"] for k, s in states.items()} == {
        "v1/s0": "done",
        "v1/s1": "done",
        "v2/s0": "failed",
        "v2/s1": "running",
        "v3/s0": "failed",
        "v3/s1": "pending",
    }
    assert states["v2/s0"]["detail"] == "RuntimeError: boom"
    assert states["v2/s0"]["log"] == str(sw / "runs" / "v2" / "s0" / "train.log")
    assert states["v2/s1"]["detail"] == "step 2/5"
    assert states["v3/s0"]["detail"].startswith("lost:")
    table = run_cli("status", str(sw), cwd=tmp_path)
    assert table.returncode == 0 and "2 done, 1 running, 1 pending, 2 failed" in table.stdout
    assert str(sw / "runs" / "v2" / "s0" / "train.log") in table.stdout

    out = run_cli("report", str(sw), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    md = (sw / "report.md").read_text()
    v1 = next(line for line in md.splitlines() if line.startswith("| `v1`"))
    cells = [c.strip() for c in v1.strip("|").split("|")]
    # seeds, final val acc, entropy last 40% mean, min, AUC, first step below 0.3, acted, warnings, flags
    assert cells[1:] == [
        "2/2",
        "0.600 ± 0.100",
        "0.240 ± 0.090",
        "0.180 ± 0.080",
        "2.29 ± 0.24",
        "4.5 (2/2)",
        "stare/gate_on 0.50",
        "kl_cov_on_policy@1 (1/2 seeds)",
        "collapse@4/5",
    ]
    assert "| acted |" in md and "the share of steps STARE's gate was open" in md
    assert "| `v1/s0` | done | 5 | 0.500 | 2.05 | kl_cov_on_policy@1 | collapse@4 |" in md
    assert "| `v2` | 0/2 | - |" in md
    assert "`v2/s0`: RuntimeError: boom" in md and str(sw / "runs" / "v2" / "s0" / "train.log") in md
    for name in ("entropy", "reward", "accuracy", "val_accuracy"):
        assert (sw / "plots" / f"{name}.png").stat().st_size > 5000
    rep = json.loads((sw / "report.json").read_text())
    assert rep["variants"]["v1"]["summary"]["entropy_auc"]["mean"] == pytest.approx((2.05 + 2.53) / 2)
    comparison = (sw / "comparison.csv").read_text().splitlines()
    assert comparison[0].startswith("variant,seeds_done,seeds_total,final_val_acc_mean")
    assert comparison[1].startswith("v1,2,2,0.6") and comparison[1].endswith(
        "kl_cov_on_policy@1 (1/2 seeds),collapse@4/5,stare/gate_on 0.50"
    )
    assert rep["jobs"][0]["flags"] == "collapse@4"
    assert rep["variants"]["v1"]["acted"] == {"stare/gate_on": pytest.approx(0.5)}

    # the report follows the files: v2/s1 finishes, the rebuild counts it
    write_metrics(sw / "runs" / "v2" / "s1", [1.0, 0.9, 0.8, 0.7, 0.6], {5: 0.2})
    (sw / "runs" / "v2" / "s1" / "job.json").write_text(json.dumps({"state": "done", "steps": 5}))
    assert run_cli("report", str(sw), cwd=tmp_path).returncode == 0
    assert "| `v2` | 1/2 | 0.200 |" in (sw / "report.md").read_text()


def test_status_of_a_folder_without_a_sweep_is_a_one_line_error(tmp_path):
    out = run_cli("status", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: ") and "not a sweep folder" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# the CLI: dry run, errors, a real local sweep with a failing job
# ---------------------------------------------------------------------------------------------
def test_dry_run_prints_the_job_table_and_runs_nothing(tmp_path):
    out = run_cli(
        "sweep", "ablation=gate", "seeds=[0,1]", "sweep_dir=sw", "--dry-run", "train.trainer.total_steps=7", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ablation gate: 6 jobs (3 variants x 2 seeds)")
    assert lines[1].split() == ["variant", "seed", "state", "overrides", "output_dir"]
    rows = [line.split() for line in lines[3:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [(v, s, "new") for v in ("gated", "always_on", "off") for s in "01"]
    for r in rows:
        assert "trainer.total_steps=7" in r and "trainer.resume=auto" in r
        assert r[-1] == str(tmp_path / "sw" / "runs" / r[0] / f"s{r[1]}")
    assert "algo.stare.gate=false" in lines[5] and "experiment=lab_grpo" in lines[7]
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["ablation=nope"], "unknown ablation=nope"),
        (["launcher=nope"], "unknown launcher=nope"),
        (["variants=[gated,nope]"], "has no variant 'nope'"),
        (["train.trainer.bogus=1"], "variant gated: unknown config key 'trainer.bogus'"),
        (["train.trainer.seed=3"], "is set by the sweep"),
        (["seeds=[0,x]"], "seeds=[0,x] is not allowed: it must be a list of integers (each >= 0)"),
        (["poll_seconds=0"], "poll_seconds=0 is not allowed: it must be a number > 0"),
        (["launcher.max_parallel=abc"], "launcher.max_parallel=abc is not allowed: it must be a positive integer"),
        (["launcher=slurm", "launcher.mem_gb=-3", "--dry-run"], "launcher.mem_gb=-3 is not allowed"),
        (["launcher=local", "--no-wait"], "--no-wait needs a launcher whose jobs outlive this process"),
    ],
)
def test_sweep_mistakes_are_one_line_errors(args, expected, tmp_path):
    out = run_cli("sweep", *args, "sweep_dir=sw", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], out.stderr
    assert not (tmp_path / "sw").exists()


FAILING = (
    "ablation.variants=[{name:ok,overrides:['algo=grpo','trainer.mini_batch_prompts=4']},"
    "{name:bad,overrides:['trainer.mini_batch_prompts=3']}]"
)


@pytest.mark.slow
def test_local_sweep_reports_a_failed_job_and_rerun_retries_only_it(tmp_path):
    args = ["ablation=gate", FAILING, "seeds=[0]", "launcher=local", "launcher.max_parallel=2", "poll_seconds=0.5", *TINY]
    out = run_cli("sweep", *args, cwd=tmp_path)  # default sweep_dir: outputs/sweeps/gate-<time>
    assert out.returncode == 1, out.stderr[-3000:]
    [sw] = list((tmp_path / "outputs" / "sweeps").glob("gate-*"))
    err = out.stderr
    assert "FAILED bad/s0: UserError: trainer.prompts_per_step (4) must be a multiple of trainer.mini_batch_prompts (3)" in err
    assert "done ok/s0: 3 steps" in err and "1 done, 1 failed" in err
    sweep = json.loads((sw / "sweep.json").read_text())
    bad_log = next(j["stderr"] for j in sweep["jobs"] if j["key"] == "bad/s0")
    assert f"log: {bad_log}" in err and "must be a multiple" in Path(bad_log).read_text()  # the traceback
    ok = sw / "runs" / "ok" / "s0"
    assert [json.loads(x)["step"] for x in (ok / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert "`bad/s0`: UserError" in (sw / "report.md").read_text()
    assert (sw / "plots" / "entropy.png").exists()
    # the finished job's regime warnings and flags, as its summary.json lists them
    ok_summary = json.loads((ok / "summary.json").read_text())
    cells = f"| {findings_cell([ok_summary['warnings']])} | {findings_cell([ok_summary['flags']])} |"
    report_lines = (sw / "report.md").read_text().splitlines()
    assert cells in next(line for line in report_lines if line.startswith("| `ok/s0` |"))
    assert cells in next(line for line in report_lines if line.startswith("| `ok` |"))

    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = client.get_run(sweep["tracking"]["parent_run_id"])
    assert parent.info.status == "FAILED" and parent.data.tags["sweep_id"] == sweep["sweep_id"]
    child = client.get_run(json.loads((ok / "summary.json").read_text())["mlflow_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert (child.data.tags["variant"], child.data.tags["seed"]) == ("ok", "0")
    assert child.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "report")} >= {"report/report.md", "report/plots"}

    # --resume: the latest gate sweep, in this process this time: only the failed job runs again
    again = run_cli("sweep", *[a for a in args if not a.startswith("launcher")], "launcher=debug", "--resume", cwd=tmp_path)
    assert again.returncode == 1, again.stderr[-3000:]
    assert "2 jobs (1 done, 0 still queued/running, 1 to run)" in again.stderr
    assert "submitted bad/s0" in again.stderr and "submitted ok/s0" not in again.stderr
    sweep = json.loads((sw / "sweep.json").read_text())
    assert {j["key"]: j["submissions"] for j in sweep["jobs"]} == {"ok/s0": 1, "bad/s0": 2}
    history = (sw / "runs" / "bad" / "s0" / "job.history.jsonl").read_text().splitlines()
    assert len(history) == 1 and json.loads(history[0])["state"] == "failed"

    # changing a job's training settings under the same folder is refused
    changed = run_cli(
        "sweep",
        *[a if a != "train.trainer.total_steps=3" else "train.trainer.total_steps=4" for a in args],
        f"sweep_dir={sw}",
        "--dry-run",
        cwd=tmp_path,
    )
    assert changed.returncode == 2 and "already holds job ok/s0 with other training settings" in changed.stderr


def test_report_fields_are_finite_or_nan():
    m = agg.run_metrics([])
    assert math.isnan(m["final_val_acc"]) and math.isnan(m["entropy_auc"]) and m["first_step_below"] is None
    assert math.isnan(m["final_val_pass"]) and math.isnan(m["val_pass_k"])


def test_final_val_pass_is_the_last_pass_at_the_largest_k():
    from entropyrl.sweeps.report import COLUMNS, shown_columns

    rows = [
        {"step": 5, "entropy": 0.5, "val/acc": 0.25, "val/pass_at_1": 0.2, "val/pass_at_4": 0.5},
        {"step": 10, "entropy": 0.4, "val/acc": 0.5, "val/pass_at_1": 0.3, "val/pass_at_4": 0.75},
    ]
    m = agg.run_metrics(rows)
    assert m["final_val_pass"] == 0.75 and m["val_pass_k"] == 4.0
    with_pass, without = agg.variant_summary([m]), agg.variant_summary([agg.run_metrics([{"step": 1, "entropy": 0.5}])])
    assert [c[0] for c in shown_columns([with_pass, without])] == [c[0] for c in COLUMNS]
    assert "final_val_pass" not in [c[0] for c in shown_columns([without])]  # no variant sampled pass@k: no column


def test_a_second_sweep_process_on_the_same_folder_is_refused(tmp_path):
    with FolderLock(tmp_path / "sw", name=".sweep.lock"):  # this process follows the folder
        out = run_cli("sweep", "ablation=gate", "seeds=[0]", "sweep_dir=sw", "launcher=debug", *TINY, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"is in use by another `entropyrl sweep` (host {socket.gethostname()}, pid {os.getpid()}" in out.stderr, out.stderr[
        -2000:
    ]
    assert not (tmp_path / "sw" / "runs").exists()


def test_async_jobs_are_placed_at_plan_time(tmp_path):
    """An asynchronous job starts a worker per trainer rank; a worker with GPUs of its own needs them
    in the job's request, and runs beside one trainer rank: both refused before anything is submitted."""
    abl = compose("sweep", ["ablation=gate"]).ablation

    def jobs(*overrides):
        return expand(abl, seeds=[0], sweep_dir=tmp_path, only=["off"], train_overrides=list(overrides))

    validate_jobs(jobs("trainer.staleness=1", "trainer.rollout_gpus=1"), world_size=1, gpus_per_node=2, ranks_per_node=1)
    validate_jobs(jobs("trainer.staleness=1", "trainer.rollout_gpus=1"))  # a local launcher: the run checks its GPUs
    with pytest.raises(UserError, match=r"variant off: trainer.rollout_gpus=1 beside 1 trainer rank\(s\) needs 2 GPUs"):
        validate_jobs(jobs("trainer.staleness=1", "trainer.rollout_gpus=1"), world_size=1, gpus_per_node=1, ranks_per_node=1)
    validate_jobs(jobs("trainer.staleness=1"), world_size=2, gpus_per_node=2, ranks_per_node=2)  # a worker per rank
    with pytest.raises(UserError, match="the job's 2 ranks start one worker each.*launcher.tasks_per_node=1"):
        validate_jobs(jobs("trainer.staleness=1", "trainer.rollout_gpus=1"), world_size=2, gpus_per_node=4, ranks_per_node=2)
    with pytest.raises(UserError, match="only trainer.staleness >= 1 starts"):
        validate_jobs(jobs("trainer.rollout_gpus=1"), world_size=1, gpus_per_node=2, ranks_per_node=1)


def test_a_sweep_saved_without_a_report_section_reads_as_the_schemas_defaults():
    """``build_report`` on a sweep.json saved before sweeps recorded their report section: the
    threshold and tail a sweep composed today gets from an ablation that names no threshold."""
    from omegaconf import OmegaConf

    from entropyrl.conf import compose
    from entropyrl.sweeps.report import SAVED_REPORT_DEFAULTS

    composed = OmegaConf.to_container(compose("sweep", ["ablation=clip"]).report, resolve=True)
    assert "entropy_threshold" not in (compose("sweep", ["ablation=clip"]).ablation.get("report") or {})
    assert SAVED_REPORT_DEFAULTS == composed


def test_a_jobs_progress_reads_its_total_from_the_config_its_run_wrote(tmp_path):
    """The shipped ablations set trainer.total_steps through a preset, so the live line read 'step 12/None'."""
    from entropyrl.sweeps.state import job_status

    out = tmp_path / "runs" / "gated" / "s0"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 13)))
    (out / "job.json").write_text(json.dumps({"state": "running", "pid": os.getpid(), "host": socket.gethostname()}))
    record = {"key": "gated/s0", "variant": "gated", "seed": 0, "output_dir": str(out), "overrides": ["experiment=lab_stare"]}
    assert job_status(record).detail == "step 12"  # no config written yet: no total to say, not "None"
    (out / "config.yaml").write_text("trainer:\n  total_steps: 300\n  seed: 0\nmodel:\n  warm_start:\n    steps: 500\n")
    assert job_status(record).detail == "step 12/300"
    # the null: a literal override still counts where the run wrote no config
    (out / "config.yaml").unlink()
    assert job_status({**record, "overrides": ["trainer.total_steps=40"]}).detail == "step 12/40"
