"""`entropyrl grade` and `entropyrl eval` through the real CLI, and the trainer's validation hook."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
HAS_TINY = importlib.util.find_spec("entropyrl.models") is not None
# A few warm-start steps: a real embedded model, built in seconds (its own cache entry).
FAST_TINY = ["model=tiny", "model.warm_start.steps=3", "model.warm_start.batch_size=8"]


def run_cli(*args, cwd=None, env=None, timeout=300):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=timeout)


@pytest.fixture()
def graded_input(tmp_path):
    lines = [
        json.dumps({"id": 1, "response": "so $\\boxed{073}$", "answer": "73"}),
        "this is not json",
        json.dumps({"id": 3, "response": "Answer: 5", "answer": 6}),
        json.dumps({"id": 4, "answer": "1"}),
        json.dumps({"id": 5, "response": "x = \\boxed{\\dfrac{1}{2}}", "answer": ["0.5"]}),
        "",
        json.dumps({"id": 7, "response": None, "answer": "1"}),
        json.dumps({"id": 8, "response": "no answer at all", "answer": "2"}),
    ]
    path = tmp_path / "responses.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_grade_cli_grades_good_lines_and_names_bad_ones(graded_input, tmp_path):
    out_path = tmp_path / "out" / "graded.jsonl"
    out = run_cli("grade", graded_input, "--out", out_path, "--allow-skipped")
    assert out.returncode == 0, out.stderr
    for lineno in (2, 4, 7):
        assert f"responses.jsonl:{lineno}:" in out.stderr
    assert "Traceback" not in out.stderr
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r["id"] for r in rows] == [1, 3, 5, 8]
    assert [r["correct"] for r in rows] == [True, False, True, False]
    assert [r["extracted"] for r in rows] == ["073", "5", "\\dfrac{1}{2}", None]
    assert rows[0]["response"] == "so $\\boxed{073}$"  # other fields kept
    assert "graded 4 lines" in out.stdout and "0.5000" in out.stdout and "3 malformed" in out.stdout
    skipped = run_cli("grade", graded_input, "--out", out_path)  # rows skipped: not a success
    assert skipped.returncode == 1 and "3 malformed line(s)" in skipped.stderr and "--allow-skipped" in skipped.stderr


def test_grade_a_binary_file_names_the_first_bad_lines_and_counts_the_rest(tmp_path):
    import random

    rng = random.Random(0)
    src = tmp_path / "blob.jsonl"
    blob = b"\n".join(bytes(rng.randrange(256) for _ in range(30)).replace(b"\n", b"").replace(b"\r", b"") for _ in range(200))
    src.write_bytes(json.dumps({"response": "\\boxed{2}", "answer": "2"}).encode() + b"\n" + blob + b"\n")
    out = run_cli("grade", src, "--out", tmp_path / "graded.jsonl")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    named = [ln for ln in out.stderr.splitlines() if ln.startswith("skipped: ")]
    assert len(named) == 6 and "195 more malformed line(s)" in named[-1], out.stderr
    assert len(out.stderr.splitlines()) < 12
    allowed = run_cli("grade", src, "--out", tmp_path / "graded.jsonl", "--allow-skipped")
    assert allowed.returncode == 0 and "graded 1 lines" in allowed.stdout


def test_grade_cli_default_output_and_nothing_gradable(tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text(json.dumps({"response": "\\boxed{2}", "answer": "2"}) + "\n")
    out = run_cli("grade", good)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "a.graded.jsonl").read_text())["correct"] is True
    bad = tmp_path / "b.jsonl"
    bad.write_text("nope\n")
    out = run_cli("grade", bad)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: ")
    missing = run_cli("grade", tmp_path / "missing.jsonl")
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_eval_bad_benchmark_and_missing_data_are_one_line_errors(tmp_path):
    out = run_cli("eval", "aime2024", cwd=tmp_path)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unknown benchmark 'aime2024'" in lines[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_cli(
        "eval", "math500", f"eval.data_root={empty}", "tracking.enabled=false", cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"}
    )
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(empty / "math500" / "test.jsonl") in lines[0] and "ENTROPYRL_DATA" in lines[0]
    out = run_cli("eval", cwd=tmp_path)
    assert out.returncode == 2 and "no benchmark given" in out.stderr
    out = run_cli("eval", "math500", "eval.backend=tgi", "tracking.enabled=false", cwd=tmp_path)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "unknown eval.backend=tgi; valid: hf, vllm" in lines[0]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TINY, reason="entropyrl.models is not there yet")
def test_eval_end_to_end_with_the_tiny_model(tmp_path, data_dir):
    out = run_cli(
        "eval",
        "aime24",
        *FAST_TINY,
        "eval.n_samples=4",
        "eval.limit=3",
        "eval.max_new_tokens=8",
        "eval.threads=1",
        "eval.heartbeat_s=0.001",
        "output_dir=run",
        cwd=tmp_path,
        env={"ENTROPYRL_DATA": str(data_dir)},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "aime24" in out.stdout and "avg@n" in out.stdout  # the rich table
    # no terminal (a log): what starts, then heartbeat lines with tokens/s and an ETA, from the engine's decoding steps
    assert "generate aime24: 12 responses of up to 8 tokens, 16 at once" in out.stderr, out.stderr[-3000:]
    beats = [ln for ln in out.stderr.splitlines() if ln.startswith("generate aime24: ") and "tokens/s" in ln]
    assert beats and "ETA <= " in beats[0] and "/12 responses" in beats[0], out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # English problems through the embedded character tokenizer: said and counted, never silently scored
    unread = [w for w in summary["warnings"] if "3 of 3 prompt(s) hold characters the model cannot represent" in w]
    assert unread and "model=smollm2-135m" in unread[0] and "warning: eval aime24: 3 of 3 prompt(s)" in out.stderr
    assert summary["threads"] == 1  # eval.threads, as trainer.threads: never torch's one-per-core default
    bench = summary["benchmarks"]["aime24"]
    assert bench["n_samples"] == 4 and bench["problems"] == 3
    assert set(bench["metrics"]) == {"avg@4", "pass@1", "pass@2", "pass@4", "maj@4"}
    assert all(0.0 <= v <= 1.0 for v in bench["metrics"].values())
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 12
    assert {s["sample"] for s in samples} == {0, 1, 2, 3} and len({s["problem_id"] for s in samples}) == 3
    assert {"benchmark", "problem_id", "sample", "response", "extracted", "correct"} <= set(samples[0])
    # avg@4 is the share of correct samples
    assert bench["metrics"]["avg@4"] == pytest.approx(sum(s["correct"] for s in samples) / 12)
    # every sample's reflection block (eval.reflection_words: default), the benchmark's reflection figures
    assert all({"count", "density", "tokens", "unit"} <= set(s["reflection"]) for s in samples)
    assert all(s["reflection"]["unit"] == "tokens" and isinstance(s["reflection"]["tokens"], int) for s in samples)
    assert bench["reflection"]["reflection/frac"] == pytest.approx(sum(s["reflection"]["count"] > 0 for s in samples) / 12)
    assert {"reflection@4", "reflection/precision", "reflection/recall"} <= set(bench["reflection"])
    assert "reflection aime24: reflection@4" in out.stdout

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["entropyrl"], output_format="list")
    assert len(runs) == 1 and runs[0].info.run_id == summary["mlflow_run_id"]
    metrics = runs[0].data.metrics
    for key in (
        "eval/aime24/avg_at_4",
        "eval/aime24/pass_at_1",
        "eval/aime24/pass_at_4",
        "eval/aime24/maj_at_4",
        "eval/aime24/reflection_at_4",
        "eval/aime24/reflection/frac",
    ):
        assert key in metrics
    assert metrics["eval/aime24/avg_at_4"] == pytest.approx(bench["metrics"]["avg@4"])
    artifacts = {a.path for a in mlflow.tracking.MlflowClient().list_artifacts(runs[0].info.run_id)}
    assert {"samples.jsonl", "summary.json"} <= artifacts


@pytest.mark.slow
def test_eval_unrepresentable_error_is_one_line_and_leaves_no_folder(tmp_path, data_dir):
    out = run_cli(
        "eval",
        "aime24",
        *FAST_TINY,
        "eval.limit=2",
        "eval.unrepresentable=error",
        "tracking.enabled=false",
        "output_dir=run",
        cwd=tmp_path,
        env={"ENTROPYRL_DATA": str(data_dir)},
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(lines) == 1 and "eval aime24: 2 of 2 prompt(s)" in lines[0] and "rows " in lines[0]
    assert "use a real model (e.g. model=smollm2-135m)" in lines[0]
    assert not (tmp_path / "run").exists()  # refused before anything was written: no empty folder


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_ctrl_c_on_an_eval_leaves_no_empty_folder_and_says_so(tmp_path, data_dir, signame):
    """SIGINT to the process group (Ctrl-C in a terminal) or SIGTERM (a scheduler, ``timeout``) while
    generating: exit 128 + the signal, no traceback, one line, and no empty ``outputs/eval/<time>/``
    (nothing was computed to keep)."""
    import signal
    import time

    sig = getattr(signal, signame)

    def inherit_an_ignored_sigint():  # as a job started in the background of a script does: Ctrl-C must still stop it
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [*CLI, "eval", "math500", *FAST_TINY, "eval.n_samples=64", "eval.threads=1", "tracking.enabled=false"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ENTROPYRL_DATA": str(data_dir)},
        start_new_session=True,
        preexec_fn=inherit_an_ignored_sigint,
    )
    seen = ""
    deadline = time.monotonic() + 120
    while "generate math500:" not in seen:  # the run has started generating
        line = proc.stderr.readline()
        assert line or proc.poll() is None, seen[-3000:]
        assert time.monotonic() < deadline, seen[-3000:]
        seen += line
    assert list((tmp_path / "outputs" / "eval").iterdir())  # its folder exists while it runs
    os.killpg(proc.pid, sig)
    _, rest = proc.communicate(timeout=120)
    err = seen + rest
    assert proc.returncode == 128 + sig and "Traceback" not in err, err[-3000:]
    assert "eval stopped before any result: nothing written" in err and f"stopped by {signame}" in err
    assert list((tmp_path / "outputs" / "eval").iterdir()) == []


def _stop_while_generating(cwd: Path, env: dict, *args: str, bench: str) -> tuple[int, str]:
    """``entropyrl eval *args`` in its own process group, SIGINT to the group once it generates ``bench``."""
    import signal
    import time

    proc = subprocess.Popen(
        [*CLI, "eval", *args, *FAST_TINY, "eval.threads=1", "tracking.enabled=false"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    seen, deadline = "", time.monotonic() + 120
    while f"generate {bench}:" not in seen:
        line = proc.stderr.readline()
        assert (line or proc.poll() is None) and time.monotonic() < deadline, seen[-3000:]
        seen += line
    os.killpg(proc.pid, signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    return proc.returncode, seen + rest


def test_a_stopped_eval_keeps_the_benchmarks_it_finished_and_leaves_an_earlier_runs_files_alone(tmp_path, data_dir):
    """Ctrl-C during the second benchmark discarded the first one's results, and a stop in a folder an
    earlier run wrote said "what it wrote is in" that folder, whose summary.json was the earlier run's."""
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"problem": f"{i}+{i}", "answer": str(2 * i)}) + "\n" for i in range(2)))
    env = {**os.environ, "ENTROPYRL_DATA": str(data_dir)}
    out = tmp_path / "ev"
    code, err = _stop_while_generating(
        tmp_path, env, str(small), "math500", "eval.n_samples=64", f"output_dir={out}", bench="math500"
    )
    assert code == 130 and "Traceback" not in err, err[-3000:]
    assert f"eval stopped: the benchmarks it finished are in {out}/summary.json" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "KILLED" and list(summary["benchmarks"]) == ["small"]
    assert "stopped while generate math500" in summary["error"]
    assert {json.loads(line)["benchmark"] for line in (out / "samples.jsonl").read_text().splitlines()} == {"small"}
    # stopped in the same folder before any benchmark finished: the earlier run's files stay, and it says so
    before = (out / "summary.json").read_bytes()
    code, err = _stop_while_generating(tmp_path, env, "math500", "eval.n_samples=64", f"output_dir={out}", bench="math500")
    assert code == 130 and f"nothing written ({out} holds an earlier run's files, left as they were)" in err, err[-3000:]
    assert (out / "summary.json").read_bytes() == before


def test_eval_defaults_follow_the_model_preset():
    from entropyrl.conf import compose
    from entropyrl.evals.runner import eval_settings

    small = eval_settings(compose("eval", ["model=smollm2-135m"]))
    assert (small.n_samples, small.max_new_tokens) == (1, 256)  # conf/model/smollm2-135m.yaml: model.eval
    given = eval_settings(compose("eval", ["model=smollm2-135m", "eval.max_new_tokens=100", "eval.n_samples=3"]))
    assert (given.n_samples, given.max_new_tokens) == (3, 100)  # an eval.* key given wins
    tiny = eval_settings(compose("eval", ["model=tiny"]))
    assert (tiny.n_samples, tiny.max_new_tokens) == (None, 1024)  # no model.eval: the benchmark's samples


def _char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>"] + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def test_validate_hook_returns_val_metrics_and_leaves_the_model_alone(data_dir):
    import torch
    from omegaconf import OmegaConf
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from entropyrl.evals.runner import validate

    tok = _char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=1024,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=None,
        )
    )
    model.train()
    val_cfg = OmegaConf.create(
        {
            "prompts": 128,
            "temperature": 1.0,
            "benchmarks": ["aime24", "amc23"],
            "n_samples": 2,
            "limit": 2,
            "max_new_tokens": 4,
            "data_root": str(data_dir),
        }
    )
    rng = torch.random.get_rng_state()
    out = validate(model, tok, list(val_cfg.benchmarks), val_cfg)
    assert torch.equal(torch.random.get_rng_state(), rng) and model.training
    for bench in ("aime24", "amc23"):
        for key in ("avg@2", "pass@1", "pass@2", "maj@2"):
            assert 0.0 <= out[f"val/{bench}/{key}"] <= 1.0
    assert set(out) >= {"val/average/avg@n", "val/average/pass@1"}
    assert validate(model, tok, ["aime24"], val_cfg) == {k: v for k, v in out.items() if k.startswith("val/aime24/")}


def test_an_eval_run_interrupted_while_logging_is_closed_killed_not_left_running(tmp_path, monkeypatch):
    """Ctrl-C while the eval's MLflow run takes its artifacts: the run ends KILLED (a store that fails
    there: FAILED), never RUNNING forever."""
    import sqlite3

    from entropyrl.conf import compose
    from entropyrl.core.tracking import TrackingStore
    from entropyrl.evals import runner

    db = tmp_path / "mlflow.db"
    cfg = compose("eval", [f"tracking.uri=sqlite:///{db}", f"output_dir={tmp_path / 'ev'}"])
    (tmp_path / "summary.json").write_text("{}")

    def interrupted(self, run_id, path, artifact_path=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(TrackingStore, "log_artifact", interrupted)
    results = {"aime24": {"n_samples": 1}}
    with pytest.raises(KeyboardInterrupt):
        runner._log_mlflow(cfg, results, {"eval/aime24/avg_at_1": 0.0}, [tmp_path / "summary.json"], "tiny", ["aime24"])
    with sqlite3.connect(db) as con:
        assert [r[0] for r in con.execute("select status from runs")] == ["KILLED"]
