"""The embedded default policy: a tiny Qwen2-architecture causal LM over a character tokenizer.

Nothing is downloaded. The model is created from ``model=tiny`` (its keys: ``core/schema/model.py``), then a short
supervised *warm start* on the built-in tasks brings it to a non-zero, non-saturated reward:
targets are drawn uniformly from *all* correct answers (so the many-answer task starts diverse)
and a share of them is replaced by plausible wrong answers (so the policy starts uncertain).
The result is cached on disk, keyed by every setting that shapes it, so it runs once per machine.

``load_policy(model_cfg)`` is the one entry point used by training and evaluation alike: it
returns ``(model, tokenizer)`` for the embedded model or for any local path / hub id.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ..core.errors import UserError
from ..tasks import builtin as tasks
from .folders import build_cached_folder, save_model_folder
from .hf_imports import skip_unused_backends

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, UNK]
# Bump when the warm-start recipe or tokenizer changes, so stale caches are not reused.
# 4: the warm start runs on one torch thread (WARM_START_THREADS).
RECIPE_VERSION = 4
# The warm start is chaotic in float rounding: other reduction orders (more threads) build a
# visibly different model, enough to change how deep GRPO's collapse goes (docs/performance.md).
# One thread makes the embedded model
# the same whatever the machine's load or core count (on the same CPU kind and torch build).
WARM_START_THREADS = 1


def build_tokenizer():
    """A character-level ``PreTrainedTokenizerFast``: one token per character of ``tasks.ALPHABET``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(tasks.ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=64,
    )


UNREPRESENTABLE = ("error", "warn")  # data.unrepresentable / eval.unrepresentable


def unknown_characters(tokenizer, text: str) -> str:
    """The characters of ``text`` that ``tokenizer`` reads as its unknown token, each once, in order:
    what the model would never see. The embedded character tokenizer has a token for each character
    of ``tasks.ALPHABET`` only, so an English word problem reaches it as its digits. "" for a tokenizer
    with no unknown token (byte-level BPE reads every text) or without offsets (a slow tokenizer)."""
    if not getattr(tokenizer, "is_fast", False):
        return ""
    unk = getattr(tokenizer, "unk_token_id", None)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    covered = [False] * len(text)
    unknown = []
    for tok, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]):
        if unk is not None and tok == unk:
            unknown += list(text[a:b])
        for i in range(a, b):
            covered[i] = True
    # a character no token stands for was dropped (the embedded tokenizer reloaded as a BPE one drops
    # what it has no token for); a plain space is left out: byte-level BPE offsets leave it to the next word
    unknown += [ch for ch, c in zip(text, covered) if not c and ch != " "]
    return "".join(sorted(set(unknown), key=text.index))


def nothing_left(tokenizer, text: str) -> bool:
    """True when no character of ``text`` but white space reaches the model: a prompt the embedded
    tokenizer reads as nothing at all (a word problem without a digit), which no engine can generate
    from. Such rows are left out, and counted, under ``unrepresentable=warn`` (``representable``)."""
    unknown = set(unknown_characters(tokenizer, text))
    return not any(ch not in unknown and not ch.isspace() for ch in text)


def representable(tokenizer, texts) -> list[int]:
    """The indices of ``texts`` of which something reaches the model (``nothing_left`` is false)."""
    return [i for i, text in enumerate(texts) if not nothing_left(tokenizer, text)]


def check_representable(tokenizer, texts, rows, *, what: str, option: str, mode: str) -> str | None:
    """Refuse (``mode`` error: ``UserError``) or count (``mode`` warn: the returned line) the texts
    that ``tokenizer`` cannot represent, naming their ``rows`` (one label per text), the characters
    and the fix. None when every text is read as written: a prompt is never silently rewritten. Under
    warn the line also names the rows of which nothing is left: the caller leaves those out
    (``representable``), since there is no prompt left to generate from."""
    if mode not in UNREPRESENTABLE:
        raise UserError(f"{option}={mode} is not allowed: it must be one of {', '.join(UNREPRESENTABLE)}")
    bad = [(row, unknown_characters(tokenizer, text)) for row, text in zip(rows, texts)]
    bad = [(row, chars) for row, chars in bad if chars]
    if not bad:
        return None
    chars = "".join(dict.fromkeys(ch for _, c in bad for ch in c))
    shown = ", ".join(str(row) for row, _ in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    vocab = set(tokenizer.get_vocab()) if hasattr(tokenizer, "get_vocab") else set()
    embedded = vocab == set(SPECIAL_TOKENS) | set(tasks.ALPHABET)
    reads = f"the embedded model reads only {tasks.ALPHABET!r}" if embedded else "its tokenizer reads them as <unk> or drops them"
    head = (
        f"{what}: {len(bad)} of {len(texts)} prompt(s) hold characters the model cannot represent "
        f"(rows {shown}; characters {chars[:40]!r}{'...' if len(chars) > 40 else ''}): {reads}"
    )
    if mode == "error":
        raise UserError(
            f"{head}: use a real model (e.g. model=smollm2-135m), or {option}=warn to go on with those characters lost (read as <unk> or dropped)"
        )
    void = [row for row, text in zip(rows, texts) if nothing_left(tokenizer, text)]
    left_out = ""
    if void:
        named = ", ".join(str(row) for row in void[:5]) + (f" and {len(void) - 5} more" if len(void) > 5 else "")
        left_out = f"; {len(void)} of them keep no character at all and are left out (rows {named})"
    return (
        f"{head}; going on with those characters lost ({option}=warn; a real model, e.g. model=smollm2-135m, "
        f"reads them){left_out}"
    )


def build_model(arch_cfg, tokenizer, seed: int):
    """A randomly initialised ``Qwen2ForCausalLM`` sized by ``arch_cfg`` (``model.arch``: conf/model/tiny.yaml)."""
    skip_unused_backends()  # the warm start imports no sklearn, pandas or SciPy either (hf_imports.py)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    arch = OmegaConf.to_container(arch_cfg, resolve=True) if not isinstance(arch_cfg, dict) else dict(arch_cfg)
    if arch["hidden_size"] // arch["num_attention_heads"] < 32:
        raise UserError(
            "model.arch: head_dim (hidden_size/num_attention_heads) must be >= 32 (vLLM's CPU backend rejects smaller heads)"
        )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **arch,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def _cache_root() -> Path:
    return Path(os.environ.get("ENTROPYRL_CACHE", Path.home() / ".cache" / "entropyrl"))


def _default_task_cfg():
    return OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "data" / "toy.yaml")


def _plain(value):
    """A config value as plain data (a mapping or list node becomes a dict or list)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _cache_key(model_cfg, task_cfg) -> str:
    payload = {
        "version": RECIPE_VERSION,
        "alphabet": tasks.ALPHABET,
        "arch": OmegaConf.to_container(model_cfg.arch, resolve=True),
        "warm_start": OmegaConf.to_container(model_cfg.warm_start, resolve=True),
        "tasks": {k: OmegaConf.to_container(task_cfg, resolve=True).get(k) for k in ("tasks", "max_operand", "divisors")},
        # keys only some tasks have join the key only when set, so existing caches stay valid
        **{f"task_{k}": _plain(task_cfg.get(k)) for k in tasks.EXTRA_TASK_KEYS if task_cfg.get(k) is not None},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _noisy_answer(problem: tasks.Problem, rng: random.Random, task_cfg=None) -> str:
    """A plausible but wrong answer: a near miss of the right one, or a random 1-2 digit number."""
    task_specific = tasks.wrong_answer(problem, rng, task_cfg)
    if task_specific is not None:
        return task_specific
    for _ in range(20):
        if rng.random() < 0.5:
            guess = str(max(0, int(problem.answer) + rng.choice([-11, -10, -2, -1, 1, 2, 10, 11])))
        else:
            guess = str(rng.randint(0, 199))
        if tasks.reward(problem, guess) == 0.0:
            return guess
    return "0"


def warm_start_examples(task_cfg, n: int, label_noise: float, rng: random.Random) -> list[tuple[str, str]]:
    """``n`` (prompt, target) pairs for the supervised warm start."""
    examples = []
    for problem in tasks.sample_problems(task_cfg, n, rng):
        if rng.random() < label_noise:
            target = _noisy_answer(problem, rng, task_cfg)
        else:
            target = rng.choice(tasks.correct_answers(problem, task_cfg))
        examples.append((problem.prompt, target))
    return examples


def sft_batch(tokenizer, pairs: list[tuple[str, str]]):
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 outside the target + EOS)."""
    rows, label_rows = [], []
    for prompt, target in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        t = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + t)
        label_rows.append([-100] * len(p) + t)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, label_rows)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(r)] = 1
    return ids, mask, labels


def warm_start(model, tokenizer, model_cfg, task_cfg, log=print) -> dict:
    """Supervised warm start in place. Returns {"loss": final loss}."""
    ws = model_cfg.warm_start
    rng = random.Random(ws.seed)
    torch.manual_seed(ws.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=ws.lr, total_steps=ws.steps, pct_start=0.1)
    model.train()
    loss = torch.tensor(float("nan"))
    started = time.perf_counter()
    for step in range(ws.steps):
        ids, mask, labels = sft_batch(tokenizer, warm_start_examples(task_cfg, ws.batch_size, ws.label_noise, rng))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % 100 == 0:  # a line every 100 steps: its rate and the time left
            rate = (step + 1) / max(time.perf_counter() - started, 1e-9)
            log(
                f"warm start {step + 1}/{ws.steps}: loss {loss.item():.3f}, {rate:.1f} steps/s, "
                f"ETA {(ws.steps - step - 1) / rate:.0f} s"
            )
    model.eval()
    return {"loss": float(loss.item())}


def embedded_model_dir(model_cfg, task_cfg=None, log=print) -> Path:
    """Path of the warm-started embedded model, building and caching it on first use."""
    task_cfg = task_cfg if task_cfg is not None and task_cfg.get("kind") == "builtin" else _default_task_cfg()
    target = _cache_root() / f"tiny-{_cache_key(model_cfg, task_cfg)}"

    def build(staging: Path) -> None:
        log(f"building the embedded tiny model (one-time warm start, cached in {target})")
        _build_into(staging, model_cfg, task_cfg, log)

    try:  # the cache folder must take the result before minutes of warm start, not after
        return build_cached_folder(
            target, build, waiting=f"waiting for another process building the embedded tiny model ({target})", log=log
        )
    except OSError as exc:
        raise _uncacheable(target, exc) from None


def _uncacheable(target: Path, exc: OSError) -> UserError:
    return UserError(
        f"cannot cache the embedded tiny model in {target.parent}: {exc.strerror or exc} "
        f"(a read-only or missing HOME?): set ENTROPYRL_CACHE=<a writable folder>"
    )


def _build_into(staging: Path, model_cfg, task_cfg, log) -> None:
    """Warm-start the tiny model and write it into ``staging``."""
    tokenizer = build_tokenizer()
    model = build_model(model_cfg.arch, tokenizer, seed=model_cfg.warm_start.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(WARM_START_THREADS)
    try:
        with torch.random.fork_rng():
            info = warm_start(model, tokenizer, model_cfg, task_cfg, log=log)
    finally:
        torch.set_num_threads(threads)
    save_model_folder(model, staging, tokenizer)
    (staging / "warm_start.json").write_text(json.dumps(info))
