"""Where training prompts come from, chosen by ``data.kind``.

Every source offers ``sample(n, step, attempt) -> items``, ``validation(n) -> items``,
``prompt(item) -> str``, ``reward(item, response) -> float`` and ``group(item) -> str`` (a label
for per-group metrics). New kinds register in ``PROMPT_SOURCES``.
"""

from __future__ import annotations

from ...core.registry import Registry
from ...tasks.builtin import BuiltinTaskSource
from .code_datasets import CodeTaskSource
from .datasets import MathDatasetSource
from .word_problems import WordProblemSource

PROMPT_SOURCES: Registry = Registry(
    "data.kind",
    {"builtin": BuiltinTaskSource, "math": MathDatasetSource, "code": CodeTaskSource, "word_problems": WordProblemSource},
)


def build_prompt_source(data_cfg, seed: int, tokenizer=None):
    kind = data_cfg.kind
    return PROMPT_SOURCES.lookup(kind)(data_cfg, seed, tokenizer=tokenizer)
