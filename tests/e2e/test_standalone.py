"""The repository stands alone: a clone with nothing beside it and no network runs the tests and
evaluates offline from the benchmark files packaged with it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "entropyrl.cli.main"]
# Written so that this file does not match itself.
OUTSIDE = re.compile(r"\.\./" + "shared" + r"|\.parent\s*/\s*[\"']" + "shared" + "[\"']")


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing to list")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [f for f in out.stdout.decode().split("\0") if f]


def test_no_tracked_file_points_outside_the_repository():
    offenders = []
    for name in _tracked_files():
        path = REPO / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (parquet, png)
            continue
        for lineno, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{name}:{lineno}: {line.strip()[:100]}")
    assert not offenders, "references to a folder beside the checkout:\n" + "\n".join(offenders)


def test_test_data_lives_in_the_repository(golden_dir, data_dir):
    spec_vectors = {
        "advantages",
        "cov",
        "inputs",
        "overlong",
        "pass_at_k",
        "quadrants",
        "stare",
        "stare_controller",
        "steer",
        "surrogate",
        "token_stats",
    }
    assert golden_dir.resolve().is_relative_to(REPO)
    assert spec_vectors <= {p.stem for p in golden_dir.glob("*.json")}
    for entry in data_dir.iterdir():  # links into the checkout, nothing else
        assert entry.resolve().is_relative_to(REPO), entry
    assert (data_dir / "verl" / "DAPO-Math-17k.parquet").is_file()
    assert "ENTROPYRL_DATA" not in os.environ  # tests default to the packaged files


def test_packaged_benchmarks_are_small_and_licensed():
    from entropyrl.evals.benchmarks import PACKAGED_DATA

    files = [p for p in PACKAGED_DATA.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 5_000_000  # "a few MB"
    assert {p.name for p in files} >= {"README.md", "LICENSE", "test.jsonl"}
    readme = (PACKAGED_DATA / "README.md").read_text()
    for folder in ("qwen-math-eval", "math500", "aime25"):
        assert f"`{folder}/" in readme  # every folder's provenance is stated


@pytest.mark.slow
def test_eval_runs_offline_from_the_packaged_files(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ENTROPYRL_DATA"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run(
        [
            *CLI,
            "eval",
            "aime24",
            "model=tiny",
            "model.warm_start.steps=3",
            "model.warm_start.batch_size=8",
            "eval.n_samples=1",
            "eval.limit=2",
            "eval.max_new_tokens=8",
            "output_dir=run",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["benchmarks"]["aime24"]["problems"] == 2
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    from entropyrl.evals.benchmarks import PACKAGED_DATA, read_rows

    first = [str(r["id"]) for r in read_rows(PACKAGED_DATA / "qwen-math-eval" / "aime24" / "test.jsonl")[:2]]
    assert [s["problem_id"] for s in samples] == first


@pytest.mark.slow
def test_a_built_wheel_carries_the_benchmark_files(tmp_path):
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    for name in _tracked_files():  # exactly what a clone holds
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("entropyrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in (
        "qwen-math-eval/aime24/test.jsonl",
        "qwen-math-eval/LICENSE",
        "aime25/test.jsonl",
        "math500/test.jsonl",
        "math500/LICENSE",
        "README.md",
    ):
        assert f"entropyrl/data/benchmarks/{rel}" in names, rel
