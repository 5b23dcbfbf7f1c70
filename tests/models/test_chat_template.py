"""``model.chat_template`` is read: the template asked for is the one training and evaluation prompts
go through (a Jinja string, the tokenizer's own, or none), and a value that is none of these is refused."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf, open_dict

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.evals.prompts import build_prompt, chat_use, user_message
from entropyrl.models.loading import install_chat_template, load_policy

TEMPLATE = "{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"


class Tok:
    """The one attribute and method of a tokenizer a chat template needs (no model to load)."""

    def __init__(self, chat_template=None):
        self.chat_template = chat_template

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment()
        return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt)


def test_a_template_string_is_installed_and_the_off_values_remove_one():
    tok = Tok()
    assert install_chat_template(tok, TEMPLATE) is True and tok.chat_template == TEMPLATE
    assert build_prompt("2+2?", "boxed", tok, "auto") == f"<u>{user_message('2+2?')}</u><a>"
    for off in (False, "none", "false"):
        tok = Tok(TEMPLATE)
        assert install_chat_template(tok, off) is False and tok.chat_template is None
    for auto in (None, "auto"):
        tok = Tok(TEMPLATE)
        assert install_chat_template(tok, auto) == "auto" and tok.chat_template == TEMPLATE


@pytest.mark.parametrize(
    "value, match",
    [("chatml", "is not a chat template"), (3, "is not a chat template"), ("{% for m in messages %}", "does not render")],
)
def test_a_value_that_is_no_template_is_refused_naming_the_key(value, match):
    with pytest.raises(UserError, match=match) as err:
        install_chat_template(Tok(), value, option="eval.chat_template")
    assert "eval.chat_template" in str(err.value)


def test_true_needs_a_template():
    with pytest.raises(UserError, match="model.chat_template=true"):
        install_chat_template(Tok(), True)
    assert install_chat_template(Tok(TEMPLATE), True) is True


def test_prompts_read_a_template_string_as_on_and_none_as_off():
    assert chat_use(TEMPLATE) is True and chat_use("none") is False and chat_use(None) == "auto"
    tok = Tok(TEMPLATE)
    assert build_prompt("2+2?", "boxed", tok, "none") == user_message("2+2?")  # "none" is not a truthy template
    assert build_prompt("2+2?", "boxed", tok, TEMPLATE).startswith("<u>")


def _tiny_model_cfg(template):
    cfg = compose("train", ["tracking.enabled=false"])
    with open_dict(cfg):
        cfg.model.chat_template = template
    return cfg


def test_training_prompts_go_through_model_chat_template():
    """The policy's tokenizer carries the template, so the training sources (``data.chat_template:
    auto``, ``build_prompt``) and validation use it; before, training ignored the key."""
    cfg = _tiny_model_cfg(TEMPLATE)
    _, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    assert tok.chat_template == TEMPLATE
    assert build_prompt("2+2?", "boxed", tok, "auto") == f"<u>{user_message('2+2?')}</u><a>"
    cfg = _tiny_model_cfg(False)
    _, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    assert build_prompt("2+2?", "boxed", tok, "auto") == user_message("2+2?")


def test_evaluation_with_a_template_string_builds_templated_prompts():
    """``entropyrl eval model.chat_template=<template>`` (and ``eval.chat_template=<template>``) gives
    templated prompts, not raw ones, and the engine then adds no special tokens of its own."""
    from entropyrl.evals.runner import _chat_setting, make_engine

    for key in ("model", "eval"):
        cfg = compose("eval", ["tracking.enabled=false"])
        with open_dict(cfg):
            OmegaConf.update(cfg, f"{key}.chat_template", TEMPLATE, merge=False)
        engine, tok, _ = make_engine(cfg, log=lambda *_: None)
        try:
            prompt = build_prompt("2+2?", "boxed", tok, _chat_setting(cfg))
            assert prompt == f"<u>{user_message('2+2?')}</u><a>", key
            assert engine.cfg["add_special_tokens"] is False, key
        finally:
            engine.close()
