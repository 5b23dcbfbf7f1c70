"""Prompt templates for evaluation.

- ``boxed``: chain of thought, final answer in ``\\boxed{}`` (the Qwen2.5-Math evaluation prompt).
- ``dapo``: DAPO's instruction, final line ``Answer: $Answer`` (as in verl's DAPO/AIME files).
- ``native``: the data's own chat messages where the file has them (verl parquet), else ``boxed``.

The template fills the *user message*. With a tokenizer that has a chat template (and
``use_chat_template`` not False), the message goes through ``tokenizer.apply_chat_template(...,
add_generation_prompt=True)``; otherwise the filled template text is the prompt itself.
"""

from __future__ import annotations

from ..core.errors import UserError
from ..core.registry import unknown_choice

TEMPLATES: dict[str, str] = {
    "boxed": "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    "dapo": (
        "Solve the following math problem step by step. The last line of your response should "
        "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
        'problem.\n\n{problem}\n\nRemember to put your answer on its own line after "Answer:".'
    ),
}
NATIVE = "native"

__all__ = ["TEMPLATES", "available_templates", "user_message", "build_prompt", "build_prompts"]


def available_templates() -> list[str]:
    return sorted(TEMPLATES) + [NATIVE]


def _fill(template: str, problem: str) -> str:
    # Not str.format on the problem: LaTeX braces in problems must stay as they are.
    return template.replace("{{}}", "{}").replace("{problem}", problem)


def user_message(problem: str, template: str = "boxed") -> str:
    """The user message for ``problem`` with template ``template`` (``boxed`` / ``dapo``)."""
    if template not in TEMPLATES:
        raise UserError(unknown_choice("prompt template", template, available_templates()))
    return _fill(TEMPLATES[template], problem)


def _wants_chat(tokenizer, use_chat_template) -> bool:
    has = bool(getattr(tokenizer, "chat_template", None)) if tokenizer is not None else False
    if use_chat_template in (None, "auto"):
        return has
    if use_chat_template and not has:
        raise UserError("eval.chat_template=true but the tokenizer has no chat template: set eval.chat_template=auto or false")
    return bool(use_chat_template)


def build_prompt(problem, template: str = "boxed", tokenizer=None, use_chat_template="auto") -> str:
    """The text given to the model for ``problem`` (a ``tasks.Problem`` or a string)."""
    text = getattr(problem, "prompt", problem)
    messages = getattr(problem, "messages", None)
    if template == NATIVE and messages:
        msgs = [dict(m) for m in messages]
    else:
        msgs = [{"role": "user", "content": user_message(text, "boxed" if template == NATIVE else template)}]
    if _wants_chat(tokenizer, use_chat_template):
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in msgs)


def build_prompts(problems, template: str = "boxed", tokenizer=None, use_chat_template="auto") -> list[str]:
    return [build_prompt(p, template, tokenizer, use_chat_template) for p in problems]
