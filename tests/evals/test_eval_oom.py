"""`entropyrl eval` that runs out of memory after its first benchmark: one `error:` line naming what
ran out, where, and the eval keys that lower it; exit code 2; the first benchmark's results kept in
samples.jsonl and summary.json (status FAILED) and in an MLflow run ended FAILED. Each of torch's
three ways of saying so (the accelerator's error, the CPU allocator's RuntimeError, MemoryError)."""

from __future__ import annotations

import json

import pytest
import torch

from entropyrl.cli.main import main
from entropyrl.evals import runner

FAST_TINY = ["model=tiny", "model.warm_start.steps=3", "model.warm_start.batch_size=8"]
ARGS = ["eval", "aime24", "math500", *FAST_TINY, "eval.limit=1", "eval.n_samples=1", "eval.max_new_tokens=4", "output_dir=ev"]

OOMS = {
    "accelerator": (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "GPU memory"),
    "cpu-allocator": (
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 34359738368 bytes."),
        "host memory (RAM)",
    ),
    "memory-error": (MemoryError(), "host memory (RAM)"),
}


def _fail_on_second(monkeypatch, name: str, exc: BaseException) -> list[int]:
    """``runner.<name>`` runs as before for the first benchmark, then raises ``exc``."""
    real, calls = getattr(runner, name), []

    def patched(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, name, patched)
    return calls


def _run(capsys, *extra: str) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as ended:
        main([*ARGS, *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return ended.value.code, [line for line in err.splitlines() if line.startswith("error:")]


def _kept_first(in_tmp, line: str) -> dict:
    summary = json.loads((in_tmp / "ev" / "summary.json").read_text())
    assert summary["status"] == "FAILED" and summary["error"] in line
    assert list(summary["benchmarks"]) == ["aime24"] and "eval/aime24/avg@1" in summary["metrics"]
    rows = [json.loads(r) for r in (in_tmp / "ev" / "samples.jsonl").read_text().splitlines()]
    assert rows and {r["benchmark"] for r in rows} == {"aime24"}
    return summary


@pytest.mark.parametrize("kind", list(OOMS))
def test_out_of_memory_while_generating_keeps_the_finished_benchmark(kind, monkeypatch, capsys, in_tmp):
    exc, what = OOMS[kind]
    calls = _fail_on_second(monkeypatch, "sample_texts", exc)
    code, errors = _run(capsys, "tracking.enabled=false")
    assert code == 2 and len(calls) == 2
    assert len(errors) == 1, errors
    line = errors[0]
    assert line.startswith(f"error: out of {what} while generating math500 ("), line
    for key in ("eval.batch_size (now 16)", "eval.max_new_tokens (now 4)", "eval.n_samples (now 1)", "eval.limit (now 1)"):
        assert key in line, line
    assert "(aime24) is kept in" in line and "`entropyrl eval math500 ...`" in line and "MLflow" not in line
    _kept_first(in_tmp, line)


def test_out_of_memory_while_grading_names_the_grading_processes(monkeypatch, capsys, in_tmp):
    _fail_on_second(monkeypatch, "grade_batch", MemoryError())
    code, errors = _run(capsys, "tracking.enabled=false", "eval.workers=1")
    assert code == 2 and len(errors) == 1
    assert errors[0].startswith("error: out of host memory (RAM) while grading math500"), errors[0]
    assert "eval.workers (now 1)" in errors[0] and "eval.batch_size" not in errors[0]
    _kept_first(in_tmp, errors[0])


def test_the_mlflow_run_of_an_eval_out_of_memory_ends_failed_with_what_finished(monkeypatch, capsys, in_tmp):
    _fail_on_second(monkeypatch, "sample_texts", MemoryError())
    code, errors = _run(capsys)  # the default store: sqlite:///mlflow.db in the working directory
    assert code == 2 and len(errors) == 1 and "the MLflow run ended FAILED" in errors[0], errors
    summary = _kept_first(in_tmp, errors[0])
    from entropyrl.core.tracking import TrackingStore

    run = TrackingStore(summary["tracking_uri"]).client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert "eval/aime24/avg_at_1" in run.data.metrics and not any("math500" in k for k in run.data.metrics)


def test_another_runtime_error_is_not_called_out_of_memory(monkeypatch, in_tmp):
    _fail_on_second(monkeypatch, "sample_texts", RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        main([*ARGS, "tracking.enabled=false"])
