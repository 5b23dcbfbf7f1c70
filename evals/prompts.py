"""Prompt templates for evaluation.

- ``boxed``: chain of thought, final answer in ``\\boxed{}`` (the Qwen2.5-Math evaluation prompt).
- ``dapo``: DAPO's instruction, final line ``Answer: $Answer`` (as in verl's DAPO/AIME files).
- ``native``: the data's own chat messages where the file has them (verl parquet), else ``boxed``.

The template fills the *user message*. With a tokenizer that has a chat template (and
``use_chat_template`` not False), the message goes through ``tokenizer.apply_chat_template(...,
add_generation_prompt=True)``; otherwise the filled template text is the prompt itself.
``use_chat_template`` takes what ``model.chat_template`` takes (``chat_use``): auto/null, true,
false/none, or a Jinja template string, which ``models.loading.install_chat_template`` has put on
the tokenizer (``load_policy`` does for ``model.chat_template``, the eval for ``eval.chat_template``).
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

__all__ = ["TEMPLATES", "available_templates", "user_message", "chat_use", "build_prompt", "build_prompts"]


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


def chat_use(value):
    """How prompts use a chat-template setting: ``"auto"`` (null, ``auto``: the tokenizer's template
    when it has one), False (``false``, ``none``: raw text) or True (``true``, or a template string:
    the one installed on the tokenizer). A template string is a truthy string, not an off switch:
    ``"none"`` and ``"false"`` written as strings mean off."""
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("auto", "none", "false", "true"):
            return {"auto": "auto", "none": False, "false": False, "true": True}[low]
        return True
    if value is None:
        return "auto"
    return bool(value)


def _wants_chat(tokenizer, use_chat_template) -> bool:
    has = bool(getattr(tokenizer, "chat_template", None)) if tokenizer is not None else False
    use = chat_use(use_chat_template)
    if use == "auto":
        return has
    if use and not has:
        raise UserError(
            "chat_template is set (true or a template) but the tokenizer has no chat template: "
            "set model.chat_template / eval.chat_template to auto, false or a Jinja template string"
        )
    return bool(use)


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
