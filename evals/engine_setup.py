"""The model and rollout engine an evaluation samples from, and what they can read.

- ``make_engine(cfg)``: ``(engine, tokenizer, model_label)`` for ``entropyrl eval``: the engine of
  ``eval.backend`` (its settings from ``eval.*`` and the ``eval.<backend>`` section), the model on
  ``eval.device``, the chat template asked for, and with ``tools.enabled`` the multi-turn tool driver.
- ``_use_chat(tokenizer, chat_template)``: whether prompts go through the chat template.
- ``_unrepresentable(data, settings, tokenizer, mode)``: the benchmarks whose prompts hold characters
  the model cannot represent (``eval.unrepresentable``), those prompts left out.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..conf import to_plain
from ..core.errors import UserError
from ..models.loading import install_chat_template, load_policy, load_tokenizer, model_dir, resolve_model_path, stop_tokens
from ..models.tiny import check_representable, representable
from ..rollout.base import RolloutEngine, rollout_engine
from ..rollout.multi_turn import ToolRollout
from ..rollout.settings import ToolSettings
from .benchmarks import get_spec
from .code.code_eval import is_code_problem
from .code.tool_executor import build_tool_executor
from .grading.answer_extraction import extract_answer
from .prompts import build_prompts, chat_use
from .settings import EvalSettings, _chat_option, _chat_setting

__all__ = ["make_engine"]


def _use_chat(tokenizer, chat_template) -> bool:
    use = chat_use(chat_template)  # "auto" | True | False: a template string is True, "none" False
    if use == "auto":
        return bool(getattr(tokenizer, "chat_template", None))
    return bool(use)


def _device(setting: str):
    import torch

    if setting in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(str(setting))
    except RuntimeError:
        raise UserError(f"eval.device '{setting}' is not a torch device (auto, cpu, cuda, cuda:1...)") from None


def make_engine(cfg, log: Callable[[str], None] = print) -> tuple[RolloutEngine, Any, str]:
    """``(engine, tokenizer, model_label)`` for ``cfg.model`` and ``cfg.eval.backend``.

    An engine that starts from the model's folder (``loads_from_path``: vLLM) gets that folder as
    ``model_path`` and no model; any other gets the model loaded here, on ``eval.device``. Its
    config: ``eval.batch_size``, ``eval.seed``, no top-k, then the ``eval.<backend>`` section."""
    ev = cfg.eval
    backend = str(ev.backend)
    engine_cls = rollout_engine(backend, "eval.backend")
    label = str(cfg.model.get("path") or cfg.model.get("name") or "model")
    if cfg.model.get("path"):  # a checkpoint / run folder -> its model folder (said in the log)
        label = resolve_model_path(label, log=log)
    engine_cfg = {
        "name": backend,
        "option": "eval.backend",
        "batch_size": int(ev.batch_size or 16),
        "top_k": 0,
        "seed": int(ev.seed),
        "dtype": cfg.model.get("dtype") or None,
    }
    engine_cfg.update({k: v for k, v in (to_plain(ev.get(backend, None)) or {}).items() if v is not None})
    if getattr(engine_cls, "loads_from_path", False):
        path = model_dir(cfg.model, log=log)  # the converted GGUF folder, model.path's model, or the embedded one
        model, tokenizer = None, load_tokenizer(path)  # a folder not whole: one line before the engine starts
        engine_cfg["model_path"] = path
        # model.stop_tokens (a chat model's end of turn): the folder's generation_config knows only its EOS
        engine_cfg["extra_stop_ids"] = stop_tokens(cfg.model, tokenizer)
    else:
        model_cfg = {**(to_plain(cfg.model) or {}), "path": label} if cfg.model.get("path") else cfg.model
        model, tokenizer = load_policy(model_cfg, log=log)
        model.to(_device(ev.device))
    # the template asked for (eval's, else the model's) on the tokenizer the prompts are built with
    chat = install_chat_template(tokenizer, _chat_setting(cfg), option=_chat_option(cfg))
    engine_cfg["add_special_tokens"] = not _use_chat(tokenizer, chat)
    engine = engine_cls(engine_cfg, model, tokenizer)
    tools = cfg.get("tools")
    if ToolSettings.from_config(tools).enabled:  # tools=code_interpreter: multi-turn
        engine = ToolRollout(engine, tools, build_tool_executor(tools), engine_cfg, final_answer=extract_answer)
    return engine, tokenizer, label


def _unrepresentable(data: Mapping[str, list], settings: EvalSettings, tokenizer, mode: str) -> list[str]:
    """One counted line per benchmark whose prompts hold characters the model cannot represent
    (``eval.unrepresentable: warn``; ``error``: a ``UserError`` naming the rows, the characters and the
    fix). The embedded model reads digits and a few symbols only: a benchmark with it is a smoke run
    of the pipeline, said so rather than silently scored on prompts it never saw."""
    lines = []
    for source, problems in data.items():
        if not problems or is_code_problem(problems[0]):
            continue
        prompts = build_prompts(problems, settings.prompt, tokenizer, settings.chat_template)
        note = check_representable(
            tokenizer,
            prompts,
            [p.id or str(i) for i, p in enumerate(problems)],
            what=f"eval {get_spec(source).name}",
            option="eval.unrepresentable",
            mode=mode,
        )
        if note:
            lines.append(note)
            kept = representable(tokenizer, prompts)  # a prompt of which nothing is left: out, and counted in the note
            if not kept:
                raise UserError(
                    f"eval {get_spec(source).name}: no prompt keeps a character the model can represent, so there is "
                    "nothing to generate from: use a real model (e.g. model=smollm2-135m)"
                )
            if len(kept) < len(problems):
                data[source][:] = [problems[i] for i in kept]
    return lines
