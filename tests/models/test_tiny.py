"""The embedded default: character tokenizer, tiny Qwen2 model, built-in tasks."""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.models import tiny
from entropyrl.models.loading import load_policy
from entropyrl.tasks import builtin as tasks


def test_tokenizer_round_trip_through_save_pretrained(tmp_path):
    from transformers import AutoTokenizer

    tok = tiny.build_tokenizer()
    text = "17+25=42 M7:91 0123456789"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(text, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids + [loaded.eos_token_id], skip_special_tokens=True) == text
    assert loaded.pad_token_id != loaded.eos_token_id


def test_model_round_trip_and_head_dim(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = compose("train")
    tok = tiny.build_tokenizer()
    model = tiny.build_model(cfg.model.arch, tok, seed=0).eval()
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    assert model.config.model_type == "qwen2"
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([tok("17+25=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)


def test_tasks_rewards():
    cfg = compose("train").data
    add = tasks.Problem("add", "17+25=", "42", (17, 25))
    assert tasks.reward(add, "42") == 1.0
    assert tasks.reward(add, "43") == 0.0 and tasks.reward(add, "") == 0.0 and tasks.reward(add, "4 2") == 0.0
    mult = tasks.Problem("multiple", "M7:", "14", (7,))
    assert all(tasks.reward(mult, a) == 1.0 for a in tasks.correct_answers(mult))
    assert len(tasks.correct_answers(mult)) == 14
    assert tasks.reward(mult, "15") == 0.0 and tasks.reward(mult, "014") == 0.0 and tasks.reward(mult, "0") == 0.0
    source = tasks.BuiltinTaskSource(cfg, seed=5)
    assert source.sample(16, step=3) == source.sample(16, step=3)  # resume-safe
    assert source.sample(16, step=3) != source.sample(16, step=4)
    assert source.validation(8) == tasks.BuiltinTaskSource(cfg, seed=99).validation(8)
    for p in source.sample(64, step=0):
        assert set(p.prompt) <= set(tasks.ALPHABET) and tasks.reward(p, p.answer) == 1.0


def test_warm_start_gives_a_nonzero_unsaturated_policy():
    cfg = compose("train")
    model, tok = load_policy(cfg.model, cfg.data)
    from entropyrl.rollout.hf_engine import HFRollout

    problems = tasks.sample_problems(cfg.data, 64, random.Random(0))
    roll = HFRollout(OmegaConf.merge(cfg.rollout, {"batch_size": 512}), model, tok).generate(
        [p.prompt for p in problems], n=4, seed=0
    )
    acc = sum(tasks.reward(problems[i // 4], t) for i, t in enumerate(roll.texts)) / len(roll.texts)
    assert 0.15 < acc < 0.85, acc
    # cached: a second load does not rebuild
    path = tiny.embedded_model_dir(cfg.model, cfg.data)
    assert (path / "warm_start.json").exists()


def test_warm_start_does_not_depend_on_the_callers_thread_count(tmp_path, monkeypatch):
    """The warm start is chaotic in float rounding (another thread count, other reduction orders,
    weights apart by up to 0.3 after 800 steps), so it runs on one thread whatever the caller set:
    the same embedded model on a loaded or an idle machine, and the caller's count comes back."""
    cfg = compose("train", ["model.warm_start.steps=40"])
    built = []
    for threads in (2, 1):
        monkeypatch.setenv("ENTROPYRL_CACHE", str(tmp_path / f"cache-{threads}"))
        torch.set_num_threads(threads)
        try:
            path = tiny.embedded_model_dir(cfg.model, cfg.data, log=lambda *_: None)
            assert torch.get_num_threads() == threads
        finally:
            torch.set_num_threads(1)
        built.append((path / "model.safetensors").read_bytes())
    assert built[0] == built[1]


def test_the_warm_start_says_its_rate_and_time_left(tmp_path, monkeypatch):
    """Minutes of warm start on a fresh machine show progress: a line every 100 steps with the loss,
    the rate and an ETA that counts down to 0."""
    monkeypatch.setenv("ENTROPYRL_CACHE", str(tmp_path))
    cfg = compose("train", ["model.warm_start.steps=200", "model.warm_start.batch_size=8"])
    said: list[str] = []
    tiny.embedded_model_dir(cfg.model, cfg.data, log=said.append)
    lines = [s for s in said if s.startswith("warm start ")]
    assert [s.split(":")[0] for s in lines] == ["warm start 100/200", "warm start 200/200"], said
    assert all(" steps/s, ETA " in s for s in lines) and lines[-1].endswith("ETA 0 s")


def test_concurrent_builders_of_one_embedded_model_build_it_once(tmp_path, monkeypatch):
    """Two jobs of a sweep on a fresh machine need the same warm start at once: the second waits for
    the first's build (a lock beside the cache entry) instead of repeating it, then loads it."""
    import threading

    cfg = compose("train", ["model.warm_start.steps=20"])
    monkeypatch.setenv("ENTROPYRL_CACHE", str(tmp_path / "cache"))
    lines: list[str] = []
    building = threading.Event()

    def log(msg):
        lines.append(msg)
        if msg.startswith("building"):
            building.set()
            time.sleep(1.0)  # hold the build open while the other caller arrives

    tiny.build_tokenizer()  # transformers' lazy imports, done before two threads race through them
    paths = []
    first = threading.Thread(target=lambda: paths.append(tiny.embedded_model_dir(cfg.model, cfg.data, log=log)))
    first.start()
    assert building.wait(60)
    paths.append(tiny.embedded_model_dir(cfg.model, cfg.data, log=log))
    first.join(120)
    assert len(paths) == 2 and paths[0] == paths[1] and (paths[0] / "config.json").exists()
    assert sum(m.startswith("building") for m in lines) == 1, lines
    assert any(m.startswith("waiting for another process") for m in lines), lines


# Run by the test below in two processes of one gloo group: rank 1 builds the embedded model (rank 0
# only waits), as a second rank does when it takes the cache's build lock first.
_BUILD_ON_RANK_1 = """
import sys, torch.distributed as dist
from entropyrl.conf import compose
from entropyrl.models import tiny
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
if rank == 1:
    cfg = compose("train", ["model.warm_start.steps=20"])
    print(tiny.embedded_model_dir(cfg.model, cfg.data, log=lambda *_: None))
dist.barrier()
dist.destroy_process_group()
"""


def test_a_second_rank_builds_a_whole_cache_entry(tmp_path):
    """transformers' save_pretrained writes no config or weights but on rank 0 of an initialised
    process group; the embedded model that rank 1 of a torchrun job builds must still be a whole
    folder, not a cache entry that breaks every later run."""
    import os
    import subprocess
    import sys

    from entropyrl.models.folders import is_model_folder

    env = {**os.environ, "ENTROPYRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    store = str(tmp_path / "store")
    procs = [
        subprocess.Popen([sys.executable, "-c", _BUILD_ON_RANK_1, str(r), store], env=env, stdout=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    folder = Path(outs[1].strip().splitlines()[-1])
    assert is_model_folder(folder), sorted(p.name for p in folder.iterdir())
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(folder)


def test_an_incomplete_cache_entry_is_built_again(tmp_path, monkeypatch):
    """A cache entry without config or weights (a builder killed mid-way by an older version, a
    rank that could not save) is replaced by a whole one, not loaded and failing forever; what a
    killed builder left in its staging folder is removed."""
    from entropyrl.models.folders import is_model_folder

    monkeypatch.setenv("ENTROPYRL_CACHE", str(tmp_path / "cache"))
    cfg = compose("train", ["model.warm_start.steps=20"])
    broken = tiny._cache_root() / f"tiny-{tiny._cache_key(cfg.model, cfg.data)}"
    broken.mkdir(parents=True)
    tiny.build_tokenizer().save_pretrained(broken)  # the tokenizer and no model
    killed = broken.parent / f".{broken.name}-tmp-killed"  # the staging folder of a builder killed mid-way
    killed.mkdir()
    lines: list[str] = []
    path = tiny.embedded_model_dir(cfg.model, cfg.data, log=lines.append)
    assert path == broken and is_model_folder(path) and any(m.startswith("building") for m in lines)
    assert not killed.exists() and not list(broken.parent.glob(".*-tmp-*"))
    model, _tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    assert model.config.model_type == "qwen2"
