"""``make install-gpu``: CUDA torch and vLLM, pinned. The recipe is read with ``make -n`` (nothing
runs); its pins must match ``pyproject.toml``'s; and pip's resolver, asked with ``--dry-run`` against
the package index alone (no local wheel folders), must find those exact versions and a vLLM that pins
the same torch and admits the same transformers. Needs no GPU; skipped when the index cannot be reached."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _recipe_pins(tmp_path: Path) -> dict[str, str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(
        ["make", "-n", "install-gpu", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "vllm==" in ln and " install " in ln)
    return dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9][^\s]*)", line))


def _pyproject_pins() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = [Requirement(d) for d in deps]
    return {r.name: str(r.specifier).removeprefix("==") for r in reqs if str(r.specifier).startswith("==")}


def test_install_gpu_recipe_pins_torch_vllm_and_transformers_as_pyproject_does(tmp_path):
    pins, project = _recipe_pins(tmp_path), _pyproject_pins()
    assert set(pins) == {"torch", "vllm", "transformers"}
    assert pins["torch"] == project["torch"] and pins["transformers"] == project["transformers"]
    # with TORCH_INDEX the CUDA build comes from PyTorch's index, PyPI staying the other index
    out = subprocess.run(
        ["make", "-n", "install-gpu", f"VENV={tmp_path / 'venv'}", "TORCH_INDEX=https://download.pytorch.org/whl/cu130"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "--extra-index-url https://download.pytorch.org/whl/cu130 torch==" in out.stdout


def test_install_gpu_pins_resolve_on_the_package_index(tmp_path):
    pins = _recipe_pins(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_FIND_LINKS", "PIP_EXTRA_INDEX", "PIP_INDEX"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # the index only: no local CPU wheel folder stands in for CUDA torch
    report = tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--no-deps",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        *[f"{k}=={v}" for k, v in pins.items()],
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("the package index did not answer within 5 minutes")
    if out.returncode != 0 and re.search(
        r"NewConnectionError|NameResolution|ConnectTimeout|No matching distribution|"
        r"Could not fetch|ProxyError|SSLError",
        out.stderr,
    ):
        pytest.skip(f"the package index cannot be reached here: {out.stderr.strip().splitlines()[-1][:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    found = {i["metadata"]["name"].lower(): i for i in json.loads(report.read_text())["install"]}
    assert {k: found[k]["metadata"]["version"] for k in pins} == pins  # exact, and torch not a "+cpu" build
    assert not found["torch"]["download_info"]["url"].startswith("file:")
    needs = {r.name: r for r in map(Requirement, found["vllm"]["metadata"]["requires_dist"]) if r.marker is None}
    assert str(needs["torch"].specifier) == f"=={pins['torch']}"
    assert needs["transformers"].specifier.contains(pins["transformers"])
