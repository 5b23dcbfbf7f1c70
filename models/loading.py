"""The one entry point that training and evaluation load a policy through: ``load_policy(model_cfg)``
returns ``(model, tokenizer)`` for the embedded tiny model (``models/tiny.py``), a GGUF file
(``model.gguf_file``, converted once by ``models/gguf.py``) or any local Hugging Face folder / hub id
(``model.path``). ``model_dir(model_cfg)`` is the folder itself, for engines that load it (vLLM).
``install_chat_template`` puts ``model.chat_template`` (or ``eval.chat_template``) on the tokenizer,
so that every prompt built from it, in training and in evaluation, uses the template asked for."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ..core.errors import UserError
from .folders import loadable_folder_damage
from .gguf import converted_dir, gguf_path
from .hf_imports import skip_unused_backends
from .tiny import embedded_model_dir

_STEP = re.compile(r"^step_(\d+)$")


def resolve_model_path(path: str, log=print) -> str:
    """The Hugging Face folder ``path`` stands for. An entropyrl checkpoint folder
    (``<run>/checkpoints/step_N``) holds the model in ``model/`` (with LoRA the adapter there, and
    the merged model in ``merged/`` when saved: that one is used); a run folder (``<run>``, holding
    ``checkpoints/``) stands for its latest checkpoint. Anything else (a model folder, a hub id) is
    returned unchanged. The choice is logged, so the folder that was loaded is on record."""
    p = Path(str(path)).expanduser()
    if not p.is_dir() or (p / "config.json").exists() or (p / "adapter_config.json").exists():
        return str(path)
    if (p / "checkpoints").is_dir():
        steps = sorted(
            (int(m.group(1)), c) for c in (p / "checkpoints").iterdir() if (m := _STEP.match(c.name)) and (c / "model").is_dir()
        )
        if not steps:
            raise UserError(
                f"model.path={path}: a run folder without a checkpoint (no checkpoints/step_N/model): "
                f"point model.path at a model folder"
            )
        p = steps[-1][1]
        kind = f"a run folder; its latest checkpoint {p.name}"
    else:
        kind = "a checkpoint folder"
    if (p / "model").is_dir():
        inner = p / "model"
        if (inner / "adapter_config.json").exists() and (p / "merged" / "config.json").exists():
            inner = p / "merged"
        log(f"model.path={path}: {kind}; loading {inner}")
        return str(inner)
    return str(path)


def checkpoint_label(path: str) -> str:
    """``<run>-step<N>`` for a folder inside ``<run>/checkpoints/step_N``, else the folder's name:
    what names an evaluation run, so that runs of several checkpoints are told apart."""
    parts = Path(str(path)).expanduser().parts
    for i in range(len(parts) - 1, 0, -1):
        m = _STEP.match(parts[i])
        if m and parts[i - 1] == "checkpoints":
            run = parts[i - 2] if i >= 2 else "run"
            return f"{run}-step{int(m.group(1))}"
    return Path(str(path)).name or str(path)


def model_dir(model_cfg, task_cfg=None, log=print) -> str:
    """The folder (or hub id) the model loads from: the GGUF file's converted folder, ``model.path``,
    or the embedded model's cached folder."""
    gguf = gguf_path(model_cfg)
    if gguf is not None:
        return str(converted_dir(gguf, log=log))
    path = model_cfg.get("path")
    if path:
        path = resolve_model_path(str(path), log=log)
    if not path:
        return str(embedded_model_dir(model_cfg, task_cfg, log=log))
    if not Path(str(path)).expanduser().exists():
        if looks_local(str(path)):
            raise UserError(
                f"model.path={path}: no such folder{_nearest_folder(str(path))}: point model.path at a Hugging Face "
                f"model folder, a run or checkpoint folder, or a hub id (namespace/name)"
            )
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise UserError(
                f"model path '{path}' does not exist and HF_HUB_OFFLINE=1: point model.path at a local Hugging Face folder"
            )
        if not _in_hub_cache(str(path)):
            log(f"model.path={path}: not in the Hugging Face cache yet: downloading it from the hub (its progress below)")
    return str(path)


def _in_hub_cache(repo: str) -> bool:
    """Whether hub model ``repo``'s config.json is in the local Hugging Face cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # noqa: BLE001 - not a valid repo id: the loader says so
        return True


def looks_local(path: str) -> bool:
    """Whether ``path`` can only be meant as a folder on this machine, not a hub id (``namespace/name``):
    absolute, ``./``, ``../`` or ``~``, more than one ``/``, or a first part that is a local folder."""
    if path.startswith(("/", "./", "../", "~", ".\\")) or path.count("/") > 1 or path.endswith("/"):
        return True
    head = path.split("/", 1)[0]
    return "/" in path and Path(head).is_dir()


def _nearest_folder(path: str) -> str:
    """`` (the nearest folder that exists: P)`` for a missing ``path``, or nothing."""
    p = Path(path).expanduser()
    for parent in p.parents:
        if parent.is_dir() and str(parent) not in (".", "/"):
            return f" (the nearest folder that exists: {parent})"
    return ""


def stop_tokens(model_cfg, tokenizer) -> list[int]:
    """Ids of ``model.stop_tokens`` (token strings that end a response besides the tokenizer's EOS,
    e.g. a chat model's end-of-turn); a string the tokenizer does not know is a ``UserError``."""
    ids = []
    for text in list(model_cfg.get("stop_tokens") or []):  # a preset may list none
        tid = tokenizer.convert_tokens_to_ids(str(text))
        if tid is None or (tid == tokenizer.unk_token_id and str(text) != tokenizer.unk_token):
            raise UserError(f"model.stop_tokens: {text!r} is not a token of this tokenizer: list single special tokens")
        ids.append(int(tid))
    return ids


#: ``model.chat_template`` values that name no template: the tokenizer's own (auto) or none (raw text)
CHAT_TEMPLATE_AUTO = (None, "auto")
CHAT_TEMPLATE_OFF = (False, "none", "false")


def install_chat_template(tokenizer, value, option: str = "model.chat_template"):
    """Put the chat template ``value`` on ``tokenizer`` and say how prompts use it.

    ``value``: null or ``auto`` (the tokenizer's own template, used when it has one: returns
    ``"auto"``); ``true`` (its own, required: returns True); ``false`` or ``none`` (no template:
    the tokenizer's is removed, prompts are raw text: returns False); or a Jinja chat template
    string (it replaces the tokenizer's: returns True). Every prompt built from this tokenizer
    (``evals.prompts.build_prompt`` with ``auto``, the training sources, validation) then follows it.
    A value that is none of these, or a template that does not render, is a ``UserError`` naming ``option``."""
    if isinstance(value, str) and value.strip().lower() in ("auto", "none", "false", "true"):
        value = {"auto": "auto", "none": "none", "false": False, "true": True}[value.strip().lower()]
    if value in CHAT_TEMPLATE_AUTO:
        return "auto"
    if value is True:
        if not getattr(tokenizer, "chat_template", None):
            raise UserError(
                f"{option}=true but the tokenizer has no chat template: set {option}=auto, false, or a Jinja template string"
            )
        return True
    if value in CHAT_TEMPLATE_OFF:
        tokenizer.chat_template = None
        return False
    if not isinstance(value, str) or ("{{" not in value and "{%" not in value):
        raise UserError(
            f"{option}={value!r} is not a chat template: use auto (the tokenizer's own), false (raw text prompts) "
            f"or a Jinja template string (with {{% ... %}} or {{{{ ... }}}})"
        )
    tokenizer.chat_template = value
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja2's TemplateError and what a template raises while rendering
        raise UserError(f"{option}: the Jinja template does not render a user message: {exc}") from None
    return True


# text every tokenizer of a math model encodes to something: a tokenizer that turns it into nothing has
# lost its vocabulary (its tokenizer.json missing: transformers then builds one of special tokens only)
_PROBE_TEXT = "0123456789"


def _check_folder(path: str) -> None:
    """One ``UserError`` naming what is wrong when the local model folder ``path`` would not load
    whole (``folders.loadable_folder_damage``); nothing for a whole folder or a hub id."""
    damage = loadable_folder_damage(Path(str(path)))
    if damage:
        raise UserError(
            f"cannot load model '{path}': {damage}: a file of the model folder is missing, cut short or damaged "
            f"(an interrupted copy or save, a full disk, a file left out): copy or save the model again"
        )


def _check_tokenizer(tokenizer, path: str) -> None:
    """A ``UserError`` when ``tokenizer`` encodes no text: every prompt would reach the model empty."""
    ids = tokenizer(_PROBE_TEXT, add_special_tokens=False)["input_ids"]
    if not ids or all(i == tokenizer.unk_token_id for i in ids):
        raise UserError(
            f"cannot load model '{path}': its tokenizer encodes no text ({_PROBE_TEXT!r} comes out as "
            f"{ids}): the tokenizer's vocabulary file (tokenizer.json, or vocab.json with merges.txt, or "
            f"tokenizer.model) is missing: copy the tokenizer files from where the model came from"
        )


def _check_vocabulary_fits(tokenizer, model, path: str) -> None:
    """A ``UserError`` when the tokenizer can give ids the model's embedding table does not hold (its
    files are another model's): the first forward would fail on an index out of range."""
    rows = model.get_input_embeddings().num_embeddings
    largest = max(
        [tokenizer.vocab_size - 1] + [i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if isinstance(i, int)]
    )
    if largest >= rows:
        raise UserError(
            f"cannot load model '{path}': its tokenizer gives token ids up to {largest} but the model's embedding "
            f"table holds {rows} rows: the tokenizer files are another model's: copy the tokenizer files that "
            f"came with these weights"
        )


def load_tokenizer(path: str):
    """The checked tokenizer of the model folder (or hub id) ``path``: a folder file missing or not whole
    and a tokenizer that encodes no text are one ``UserError`` each, never a loader's traceback or an
    empty prompt."""
    from transformers import AutoTokenizer

    _check_folder(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise _load_error(path, exc) from None
    except Exception as exc:  # the tokenizers library's own errors on files that parse but are not a tokenizer
        raise UserError(
            f"cannot load model '{path}': its tokenizer files do not load ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else '-'}): copy the tokenizer files that came with the model again"
        ) from None
    _check_tokenizer(tokenizer, path)
    return tokenizer


def _load_error(path: str, exc: Exception) -> UserError:
    """The one line for a loader's own refusal (a hub id not found, a config without a model type)."""
    return UserError(
        f"cannot load model '{path}': {str(exc).splitlines()[0]} "
        f"(set model.path to a local Hugging Face folder or a reachable hub id)"
    )


def load_policy(model_cfg, task_cfg=None, log=print):
    """``(model, tokenizer)`` for ``model_cfg`` (see ``model_dir``). The tokenizer pads on the left
    (generation) with its pad token, or its EOS when it has none; ``model.stop_tokens`` join the
    model's ``generation_config.eos_token_id``, so every engine stops at them; ``model.chat_template``
    is installed on the tokenizer (``install_chat_template``). A folder that would not load whole, a
    tokenizer that encodes no text and one whose ids the model's embeddings do not hold are one
    ``UserError`` each (``load_tokenizer``)."""
    skip_unused_backends()  # before the first model class: no sklearn, pandas or SciPy import (hf_imports.py)
    from transformers import AutoModelForCausalLM

    path = model_dir(model_cfg, task_cfg, log=log)
    dtype = getattr(torch, str(model_cfg["dtype"]))
    tokenizer = load_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except (OSError, ValueError) as exc:
        raise _load_error(path, exc) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    _check_vocabulary_fits(tokenizer, model, path)
    tokenizer.padding_side = "left"
    install_chat_template(tokenizer, model_cfg["chat_template"])
    extra = stop_tokens(model_cfg, tokenizer)
    if extra:
        eos = model.generation_config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
        model.generation_config.eos_token_id = eos + [t for t in extra if t not in eos]
    return model, tokenizer
