"""The decoding and grading settings of an evaluation (``EvalSettings``), and where ``entropyrl eval``
takes them from: ``eval.*``, the model preset's ``model.eval.*``, the benchmark's reference values
(``eval_settings``); the chat template asked for, ``eval.chat_template`` else
``model.chat_template`` (``_chat_setting``, ``_chat_option``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..conf import to_plain
from ..core.errors import UserError
from .grading.grader import DEFAULT_TIMEOUT

__all__ = ["EvalSettings", "eval_settings"]


@dataclass
class EvalSettings:
    """Decoding and grading settings; None = the benchmark's reference value."""

    n_samples: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int = 1024
    seed: int = 0
    prompt: str = "boxed"
    chat_template: Any = "auto"
    workers: int | None = None
    grade_timeout: float = DEFAULT_TIMEOUT
    sandbox: Any = None  # code benchmarks: SandboxLimits keys over the benchmark's (eval.sandbox)
    reflection_words: Any = "default"  # evals/reflection.py: a list name, a list of words, or [] (no reflection block)

    @classmethod
    def from_cfg(cls, cfg: Mapping, **fallback) -> EvalSettings:
        get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: d)

        def pick(key, default):
            value = get(key, None)
            return default if value is None else value

        s = cls(
            n_samples=pick("n_samples", fallback.get("n_samples")),
            temperature=pick("temperature", fallback.get("temperature")),
            top_p=pick("top_p", fallback.get("top_p")),
            max_new_tokens=int(pick("max_new_tokens", fallback.get("max_new_tokens", 1024))),
            seed=int(pick("seed", fallback.get("seed", 0))),
            prompt=str(pick("prompt", fallback.get("prompt", "boxed"))),
            chat_template=pick("chat_template", fallback.get("chat_template", "auto")),
            workers=pick("workers", fallback.get("workers")),
            grade_timeout=float(pick("grade_timeout", fallback.get("grade_timeout", DEFAULT_TIMEOUT))),
            sandbox=pick("sandbox", fallback.get("sandbox")),
            reflection_words=to_plain(get("reflection_words", fallback.get("reflection_words", "default"))),
        )
        if s.n_samples is not None and int(s.n_samples) < 1:
            raise UserError(f"eval.n_samples must be >= 1 (or null for the benchmark default), got {s.n_samples}")
        if s.grade_timeout <= 0:
            raise UserError(f"eval.grade_timeout must be > 0 seconds, got {s.grade_timeout}")
        return s


def eval_settings(cfg) -> EvalSettings:
    """The settings of ``entropyrl eval`` from a composed ``conf/eval.yaml``: ``eval.*``, where null the
    model preset's ``model.eval.*`` (a 135M model needs neither 1024 tokens nor many samples to
    start), where null too the benchmark's reference values (``evaluate``)."""
    preset = {k: v for k, v in (to_plain(cfg.model.get("eval")) or {}).items() if v is not None}
    settings = EvalSettings.from_cfg(cfg.eval, **preset)
    settings.chat_template = _chat_setting(cfg)
    return settings


def _chat_setting(cfg) -> Any:
    """eval.chat_template, falling back to model.chat_template (false for the embedded model): what
    ``install_chat_template`` takes (auto, true, false/none, or a Jinja template string)."""
    ev = cfg.eval.chat_template
    if ev not in (None, "auto"):
        return ev
    return cfg.model.chat_template if "model" in cfg else None


def _chat_option(cfg) -> str:
    """The key ``_chat_setting`` read, for its error messages."""
    return "eval.chat_template" if cfg.eval.chat_template not in (None, "auto") else "model.chat_template"
