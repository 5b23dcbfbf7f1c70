"""Scale presets: `experiment=` files reproducing published configurations, the Qwen model presets,
and the DAPO-Math-17k prompt source (a real 200-row sample of its parquet in tests/fixtures/verl/,
graded by evals.grader)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from entropyrl.conf import CONF_DIR, compose, config_groups
from entropyrl.core.errors import UserError

CLI = [sys.executable, "-m", "entropyrl.cli.main"]
EXPERIMENTS = ("stare_7b_short_cot", "stare_7b_tool_use", "stare_32b_long_cot", "steer_7b", "dapo_7b", "kl_cov_7b")


def show(*overrides: str) -> dict:
    out = subprocess.run([*CLI, "config", "show", *overrides], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return yaml.safe_load(out.stdout)


# ---------------------------------------------------------------------------------------------
# experiment presets
# ---------------------------------------------------------------------------------------------
def test_config_show_prints_the_stare_7b_short_cot_configuration():
    cfg = show("experiment=stare_7b_short_cot")
    assert cfg["algo"]["name"] == "stare" and cfg["algo"]["interventions"] == ["stare"]
    stare = cfg["algo"]["stare"]
    assert (stare["p"], stare["w"], stare["h_tgt"], stare["variant"], stare["adaptive"]) == (0.1, 1.1, 0.3, "O1", False)
    assert (cfg["algo"]["clip"]["low"], cfg["algo"]["clip"]["high"], cfg["algo"]["clip"]["dual_c"]) == (0.2, 0.28, 10.0)
    assert cfg["algo"]["dynamic_sampling"] == {"enabled": True, "max_num_gen_batches": 10}
    assert cfg["model"]["path"] == "Qwen/Qwen2.5-Math-7B" and cfg["data"]["name"] == "dapo_math_17k"
    t = cfg["trainer"]
    assert (t["prompts_per_step"], t["mini_batch_prompts"], cfg["optim"]["lr"], t["grad_clip"]) == (64, 64, 1e-6, 1.0)
    assert t["dtype"] == "bfloat16" and t["gradient_checkpointing"] is True
    r = cfg["rollout"]
    assert (r["name"], r["n"], r["max_new_tokens"], r["temperature"], r["top_p"]) == ("vllm", 8, 3072, 1.0, 1.0)
    assert cfg["data"]["max_prompt_length"] == 1024
    v = cfg["val"]
    assert v["benchmarks"] == ["aime24", "aime25"] and (v["n_samples"], v["top_p"], v["temperature"]) == (32, 0.7, 1.0)


def test_config_show_prints_the_stare_32b_long_cot_configuration():
    """STARE on the DAPO recipe's 32B long-CoT shape; the STARE values are the short-CoT script's
    (no long-CoT value is published) and the YAML says so."""
    cfg = show("experiment=stare_32b_long_cot")
    assert cfg["algo"]["interventions"] == ["stare"] and cfg["model"]["name"] == "qwen2.5-32b"
    r, t, a = cfg["rollout"], cfg["trainer"], cfg["algo"]
    assert (r["max_new_tokens"], r["max_model_len"], r["n"], r["tensor_parallel_size"]) == (20480, 22528, 16, 4)
    assert (t["prompts_per_step"], t["mini_batch_prompts"], t["micro_batch_tokens"]) == (512, 32, 22528)
    assert a["overlong"] == {"enabled": True, "buffer": 4096, "filter": False}
    assert a["dynamic_sampling"]["enabled"] is True and cfg["data"]["max_prompt_length"] == 2048
    assert (a["stare"]["variant"], a["stare"]["w"], a["stare"]["h_tgt"]) == ("O1", 1.1, 0.3)
    text = (CONF_DIR / "experiment" / "stare_32b_long_cot.yaml").read_text()
    stare_lines = text.split("\n  stare:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(stare_lines) == 9 and all("# stare-short:" in line for line in stare_lines), stare_lines
    assert "NOT stated" in text


def test_config_show_prints_the_stare_7b_tool_use_configuration():
    cfg = show("experiment=stare_7b_tool_use")
    assert cfg["algo"]["name"] == "stare" and cfg["algo"]["interventions"] == ["stare"]
    stare = cfg["algo"]["stare"]
    assert (stare["p"], stare["w"], stare["m"], stare["h_tgt"], stare["variant"], stare["adaptive"]) == (
        0.1,
        1.1,
        0.9,
        0.3,
        "O1",
        False,
    )
    assert cfg["model"]["name"] == "qwen2.5-7b" and cfg["data"]["name"] == "dapo_math_17k"
    tools = cfg["tools"]
    assert tools["enabled"] is True and (tools["name"], tools["format"], tools["session"]) == (
        "code_interpreter",
        "hermes",
        "stateless",
    )
    assert (tools["max_turns"], tools["max_calls"], tools["max_output_chars"]) == (16, 16, 256)
    assert (tools["executor"]["wall_seconds"], tools["executor"]["memory_mb"]) == (30.0, 1024)
    assert not (tools["mask_invalid_calls"] or tools["mask_repeated"] or tools["drop_void_turns"])
    t, r = cfg["trainer"], cfg["rollout"]
    assert (t["total_steps"], t["prompts_per_step"], t["mini_batch_prompts"], cfg["optim"]["lr"]) == (2000, 64, 16, 1e-6)
    assert (r["name"], r["n"], r["max_new_tokens"], r["max_model_len"]) == ("vllm", 16, 16384, 18432)
    assert cfg["data"]["max_prompt_length"] == 2048
    assert (cfg["algo"]["clip"]["low"], cfg["algo"]["clip"]["high"], cfg["algo"]["clip"]["dual_c"]) == (0.2, 0.28, 10.0)
    v = cfg["val"]
    assert v["benchmarks"] == ["aime24", "aime25"] and (v["n_samples"], v["top_p"], v["max_new_tokens"]) == (30, 0.6, 16384)
    header = (CONF_DIR / "experiment" / "stare_7b_tool_use.yaml").read_text().split("\ndefaults:")[0]
    assert "cold start" in header and "model.path" in header  # the SFT checkpoint is the user's to give


def test_steer_and_dapo_presets():
    steer = compose("train", ["experiment=steer_7b"])
    assert steer.algo.name == "steer" and steer.algo.steer.lambda_min == 0.8 and steer.algo.steer.mapping == "exp"
    assert (steer.trainer.prompts_per_step, steer.trainer.mini_batch_prompts, steer.rollout.n) == (512, 32, 8)
    assert steer.optim.lr == 1e-6 and steer.rollout.max_new_tokens == 3072 and not steer.algo.dynamic_sampling.enabled
    assert (steer.algo.clip.high, steer.algo.clip.dual_c) == (0.28, 10.0)

    dapo = compose("train", ["experiment=dapo_7b"])
    assert dapo.algo.name == "dapo" and dapo.algo.dynamic_sampling.enabled and dapo.algo.overlong.enabled
    assert (dapo.trainer.prompts_per_step, dapo.trainer.mini_batch_prompts, dapo.rollout.n) == (512, 32, 16)
    assert (dapo.rollout.max_new_tokens, dapo.algo.overlong.buffer, dapo.data.max_prompt_length) == (8192, 4096, 2048)
    assert dapo.optim.weight_decay == 0.1 and dapo.trainer.total_steps == 200
    assert dapo.rollout.engine_kwargs.hf_overrides.max_position_embeddings == 32768


def test_command_line_overrides_win_over_the_experiment():
    cfg = compose("train", ["experiment=dapo_7b", "trainer.total_steps=5", "rollout.n=4", "model.path=/m/q7b"])
    assert (cfg.trainer.total_steps, cfg.rollout.n, cfg.model.path) == (5, 4, "/m/q7b")
    assert cfg.trainer.prompts_per_step == 512  # the rest of the preset stays


def test_unknown_experiment_lists_the_choices():
    with pytest.raises(UserError, match=r"unknown experiment=stare_7b; valid: dapo_7b, .*stare_7b_short_cot"):
        compose("train", ["experiment=stare_7b"])
    assert compose("train").model.name == "tiny"  # no experiment by default


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_preset_value_names_its_source(name):
    """`# @package _global_` on top, and every value line carries a comment saying where it is from."""
    assert set(EXPERIMENTS) <= set(config_groups()["experiment"])
    text = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
    assert text.splitlines()[0].strip() == "# @package _global_"
    body = text.split("\ndefaults:", 1)[1]
    for line in body.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or re.fullmatch(r"[\w./-]+:", stripped):
            continue  # blank, comment, or a section header
        assert "#" in line and re.search(r"#\s*(script|stare-short|verl|paper|spec|ours)\b", line), f"{name}: {line!r}"


@pytest.mark.parametrize(
    "model,hub",
    [
        ("qwen2.5-math-1.5b", "Qwen/Qwen2.5-Math-1.5B"),
        ("qwen2.5-math-7b", "Qwen/Qwen2.5-Math-7B"),
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B"),
    ],
)
def test_model_presets_name_a_hub_id_and_take_a_local_path(model, hub):
    assert compose("train", [f"model={model}"]).model.path == hub
    assert compose("train", [f"model={model}", "model.path=/models/x"]).model.path == "/models/x"


# ---------------------------------------------------------------------------------------------
# data=dapo_math_17k
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dapo(data_dir):
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    cfg = compose("train", ["data=dapo_math_17k", f"data.data_root={data_dir}"])
    return build_prompt_source(cfg.data, seed=3)


def test_dapo_parquet_loads_and_grades_an_answer_line(dapo):
    assert len(dapo) == 200 and dapo.where.endswith("verl/DAPO-Math-17k.parquet")  # the fixture sample
    item = next(p for p in dapo.train_items if p.answer == "42")
    prompt = dapo.prompt(item)
    assert item.prompt in prompt and "\\boxed" in prompt  # the file's own instruction (native)
    assert dapo.reward(item, "Adding the two cases gives 42.\nAnswer: 42") == 1.0
    assert dapo.reward(item, "Answer: 41") == 0.0
    assert dapo.rewards([item, item, item], ["so \\boxed{42}", "no final answer here", "Answer: 042"]) == [1.0, 0.0, 1.0]
    assert dapo.group(item) == "dapo_math_17k"


def test_dapo_prompt_stream_is_deterministic_and_covers_the_epoch(dapo, data_dir):
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    again = build_prompt_source(compose("train", ["data=dapo_math_17k", f"data.data_root={data_dir}"]).data, seed=3)
    assert dapo.sample(16, step=5) == again.sample(16, step=5)
    assert dapo.sample(16, step=5, attempt=2) == again.sample(16, step=5, attempt=2)
    seen = [p.id for s in range(12) for p in dapo.sample(16, step=s)]  # 192 of the 200 prompts
    assert len(set(seen)) == len(seen)  # no repeats inside an epoch
    epoch = [p.id for s in range(25) for p in dapo.sample(8, step=s)]  # exactly one epoch
    assert sorted(epoch) == sorted(p.id for p in dapo.train_items)
    other = build_prompt_source(compose("train", ["data=dapo_math_17k", f"data.data_root={data_dir}"]).data, seed=4)
    assert other.sample(16, step=5) != dapo.sample(16, step=5)


def test_dapo_filters_overlong_prompts_and_holds_out_validation(data_dir):
    from entropyrl.models.tiny import build_tokenizer
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    tok = build_tokenizer()  # one token per character
    cfg = compose(
        "train",
        [
            "data=dapo_math_17k",
            f"data.data_root={data_dir}",
            "data.limit=150",
            "data.max_prompt_length=500",
            "data.holdout=10",
            "data.chat_template=false",
            "data.unrepresentable=warn",  # English problems: the character tokenizer only measures their length here
        ],
    )
    src = build_prompt_source(cfg.data, seed=0, tokenizer=tok)
    kept = src.train_items + src.val_items
    assert 0 < len(kept) < 150
    assert all(len(tok(src.prompt(p), add_special_tokens=False)["input_ids"]) <= 500 for p in kept)
    assert len(src.validation(100)) == 10 and not {p.id for p in src.val_items} & {p.id for p in src.train_items}


def test_missing_dataset_offline_is_one_actionable_error(tmp_path, monkeypatch):
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose("train", ["data=dapo_math_17k", f"data.data_root={tmp_path}"])
    with pytest.raises(UserError, match="ENTROPYRL_DATA"):
        build_prompt_source(cfg.data, seed=0)


@pytest.mark.parametrize("name", [e for e in EXPERIMENTS if "7b" in e])
def test_7b_presets_state_a_checkpoint_cadence_and_size(name):
    """A 7B checkpoint (float32 weights + AdamW moments) is tens of GB: the presets save every 50 steps,
    keep the last two, and say how large they are where they set it."""
    cfg = compose("train", [f"experiment={name}"])
    assert cfg.trainer.save_every == 50 and cfg.trainer.keep_checkpoints == 2
    text = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
    assert re.search(r"save_every: 50 .*~\d+ GB", text) and re.search(r"keep_checkpoints: 2 .*GB on disk", text)


def _global_group_files():
    return sorted(
        p
        for p in CONF_DIR.glob("*/*.yaml")
        if p.parent.name not in ("experiment", "ablation") and p.read_text().lstrip().startswith("# @package _global_")
    )


@pytest.mark.parametrize("path", _global_group_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_global_group_file_sets_no_key_the_primary_config_would_override(path):
    """A group option such as data=tool_arith may set keys outside its group (@package _global_), but
    the primary configs list `_self_` after their groups: a key the primary config sets itself (train.yaml's
    trainer.*, val.*, ...) would silently win over the option's value. Such a value belongs in an
    experiment preset, which comes after `_self_`."""

    def leaves(node: dict, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for key, value in node.items():
            path_ = f"{prefix}{key}"
            out |= leaves(value, f"{path_}.") if isinstance(value, dict) and value else {path_}
        return out

    body = yaml.safe_load(path.read_text()) or {}
    for primary in ("train", "eval", "sweep"):
        primary_body = yaml.safe_load((CONF_DIR / f"{primary}.yaml").read_text())
        own = leaves({k: v for k, v in primary_body.items() if k != "defaults"})
        groups = {next(iter(d)) if isinstance(d, dict) else d for d in primary_body["defaults"]}
        if path.parent.name not in groups:
            continue
        mine = leaves({k: v for k, v in body.items() if k not in ("defaults", path.parent.name)})
        clash = sorted(mine & own)
        assert not clash, f"{path.name} sets {clash}, which {primary}.yaml sets after it (its _self_ comes later)"
    assert _global_group_files(), "the check found no global group file to look at"
