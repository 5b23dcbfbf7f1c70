"""Types and ranges of config values, checked before any command has side effects.

Each primary config (``train``, ``eval``, ``sweep``) has a table ``key -> Rule`` below; adding a
key is one line. ``entropyrl.conf.compose`` checks the composed config against its table, so every
command (and every job of a sweep, composed at plan time) rejects a bad value with one line naming
the key, the value and what is allowed, before a folder, a model or an MLflow run exists:

    validate_config(compose("train", ["optim.lr=-1"]), "train")
    # UserError: optim.lr=-1 is not allowed: it must be a number > 0

The schema of a command is its YAML (each default declared once, commented where it is declared)
plus this table (each key's type and range, or ``owned``: the component that reads and checks a
value or a whole ``prefix.*`` section, such as a task's parameters). tests/conf/test_validation.py keeps
them one-to-one: every key a shipped YAML sets has a rule here (or in ``ALGO_KEYS`` / an
intervention's ``Params``), and every rule names a key some shipped YAML sets.

Keys a config does not have are skipped. Paths are checked for being usable folders: not a file,
not under a file, and writable where they will be created. Keys that were renamed (``RENAMED``)
are one-line errors naming the new key, wherever they are set (an override, an experiment or
ablation YAML).

The tables hold what the commands share (trainer, optim, rollout, model, tracking, launcher keys)
and the rule machinery (``Rule``, ``check_value``). A component with its own parameters declares
and checks them once, beside its code, with the same rules: the algorithm's keys in
``trainers/algos/algorithm.py`` (``ALGO_KEYS``), each entropy intervention's in its ``Params``
(``validate``); ``trainers/preflight.py`` runs those checks before a training run creates anything.
"""

# size: one table of rules per command, a line per key, with the checks that read it
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import UserError

_ABSENT = object()


@dataclass(frozen=True)
class Rule:
    """What one config value may be. ``kind``: int, float, bool, choice, str, path, int_list,
    float_list, str_list, mapping, or owned (a value its component reads and checks itself:
    ``owner`` names where, e.g. a task's parameters or a reward function list).

    ``low``/``high`` bound numbers (``open_low``/``open_high`` exclude the bound); ``choices`` are
    the values of a choice; ``length`` fixes the length of a list; ``nullable`` also allows null.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple = ()
    nullable: bool = False
    length: int | None = None
    owner: str = ""

    def allowed(self) -> str:
        """What is allowed, in words (the end of the error line)."""
        if self.kind == "owned":
            text = f"what {self.owner} accepts"
        elif self.kind == "threads":
            text = "a positive integer (torch threads), or 0 / auto for the CPUs left to the run"
        elif self.kind == "str_list":
            text = "a list of non-empty strings"
        elif self.kind == "mapping":
            text = "a mapping of keys to values"
        elif self.kind == "choice":
            text = "one of " + ", ".join(_show(c) for c in self.choices)
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "str":
            text = "a non-empty string"
        elif self.kind == "path":
            text = "a folder path that can be created (not a file, not under a file, writable)"
        else:
            noun = {
                "int": "an integer",
                "float": "a number",
                "int_list": "a list of integers",
                "float_list": "a list of numbers",
            }[self.kind]
            if self.length is not None:
                noun = f"a list of {self.length} {'integers' if self.kind == 'int_list' else 'numbers'}"
            if self.kind == "int" and self.low == 1 and self.high is None:
                noun = "a positive integer"
            elif self.kind == "int" and self.low == 0 and self.high is None:
                noun = "an integer >= 0"
            else:
                bounds = []
                if self.low is not None:
                    bounds.append(f"{'>' if self.open_low else '>='} {_show(self.low)}")
                if self.high is not None:
                    bounds.append(f"{'<' if self.open_high else '<='} {_show(self.high)}")
                if self.low is not None and self.high is not None:
                    lo, hi = ("(" if self.open_low else "["), (")" if self.open_high else "]")
                    bounds = [f"in {lo}{_show(self.low)}, {_show(self.high)}{hi}"]
                if bounds:
                    listed = self.kind.endswith("_list")
                    noun += (" (each " if listed else " ") + " and ".join(bounds) + (")" if listed else "")
            text = noun
        return text + (", or null" if self.nullable else "")

    def ok(self, value: Any) -> bool:
        if self.kind == "owned":
            return True  # its component checks it (``owner``)
        if self.kind == "threads":
            return value in (0, "auto") and not isinstance(value, bool) or self._number_ok(value, integer=True) and value >= 1
        if value is None:
            return self.nullable
        if self.kind == "str_list":
            return isinstance(value, (list, tuple)) and all(isinstance(v, str) and v.strip() for v in value)
        if self.kind == "mapping":
            return isinstance(value, dict)
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "choice":
            return any(value == c and type(value) is type(c) for c in self.choices)
        if self.kind == "str":
            return isinstance(value, str) and value.strip() != ""
        if self.kind == "path":
            return isinstance(value, (str, Path)) and str(value).strip() != "" and folder_problem(value) is None
        if self.kind in ("int_list", "float_list"):
            items = list(value) if isinstance(value, (list, tuple)) else []
            if self.length is not None and len(items) != self.length:
                return False
            return bool(items) and all(self._number_ok(v, integer=self.kind == "int_list") for v in items)
        return self._number_ok(value, integer=self.kind == "int")

    def _number_ok(self, value: Any, *, integer: bool) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if integer and not (isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
            return False
        if self.high is not None and (value > self.high or (self.open_high and value == self.high)):
            return False
        return True


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_show(x) for x in v) + "]"
    return str(v)


# -- rule shorthands ---------------------------------------------------------------------------
def integer(low: int | None = None, high: int | None = None, nullable: bool = False) -> Rule:
    return Rule("int", low=low, high=high, nullable=nullable)


def number(
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    open_high: bool = False,
    nullable: bool = False,
) -> Rule:
    return Rule("float", low=low, high=high, open_low=open_low, open_high=open_high, nullable=nullable)


def choice(*choices: Any, nullable: bool = False) -> Rule:
    return Rule("choice", choices=tuple(choices), nullable=nullable)


POS_INT = integer(1)
NONNEG_INT = integer(0)
POS = number(0, open_low=True)
NONNEG = number(0)
PROB = number(0, 1)  # a probability / fraction in [0, 1]
OPEN_PROB = number(0, 1, open_low=True)  # (0, 1]: top-p, fractions that must select something
BOOL = Rule("bool")
STR = Rule("str")
OPT_STR = Rule("str", nullable=True)
STR_LIST = Rule("str_list")
MAPPING = Rule("mapping")
FOLDER = Rule("path")
THREADS = Rule("threads")  # 0 / auto: the CPUs left to the run (core/resources.py); N >= 1: N threads


def owned(owner: str) -> Rule:
    """A value (or, as a ``prefix.*`` key, a whole section) read and checked by ``owner``."""
    return Rule("owned", owner=owner)


# -- the tables --------------------------------------------------------------------------------
MODEL = {
    "model.name": STR,
    "model.path": OPT_STR,
    "model.gguf_file": OPT_STR,
    "model.embedded": BOOL,
    "model.chat_template": owned("models/loading.py (false, auto, or a template)"),
    "model.stop_tokens": STR_LIST,
    "model.arch.tie_word_embeddings": BOOL,
    "model.arch.vocab_size": POS_INT,
    "model.gguf_package": OPT_STR,
    "model.install": OPT_STR,
    "model.dtype": choice("float32", "bfloat16", "float16"),
    "model.arch.hidden_size": POS_INT,
    "model.arch.intermediate_size": POS_INT,
    "model.arch.num_hidden_layers": POS_INT,
    "model.arch.num_attention_heads": POS_INT,
    "model.arch.num_key_value_heads": POS_INT,
    "model.arch.max_position_embeddings": POS_INT,
    "model.arch.rope_theta": POS,
    "model.warm_start.steps": NONNEG_INT,
    "model.eval.n_samples": integer(1, nullable=True),
    "model.eval.max_new_tokens": integer(1, nullable=True),
    "model.warm_start.batch_size": POS_INT,
    "model.warm_start.lr": POS,
    "model.warm_start.label_noise": PROB,
    "model.warm_start.seed": NONNEG_INT,
}

TRACKING = {
    "tracking.name": STR,
    "tracking.enabled": BOOL,
    "tracking.experiment": STR,
    "tracking.uri": OPT_STR,
    "tracking.run_name": OPT_STR,
    "tracking.parent_run_id": OPT_STR,
    "tracking.tags": MAPPING,
    "tracking.retry_s": NONNEG,
    "tracking.flush_wait_s": NONNEG,
}

#: ``trainer.resume``: auto continues a matching run, never refuses a folder that holds one,
#: overwrite deletes the old run's checkpoints, metrics and tracking link and starts fresh.
RESUME_MODES = ("auto", "never", "overwrite")

#: ``optim``: the optimizer and its schedule (``trainers/optim.py``). ``optim.name`` and
#: ``optim.scheduler`` are names in that module's registries; ``check_optim`` there lists the valid ones.
OPTIM = {
    "optim.name": STR,
    "optim.lr": POS,
    "optim.weight_decay": NONNEG,
    "optim.betas": Rule("float_list", low=0, high=1, open_high=True, length=2),
    "optim.scheduler": STR,
    "optim.warmup_steps": NONNEG_INT,
    "optim.min_lr_ratio": PROB,
}

#: ``tools``: multi-turn rollouts with a code interpreter (``conf/tools/none.yaml`` declares them);
#: the format's name and tags and the executor's limits are checked by ``evals/code/tool_executor.check_tools``.
TOOLS = {
    "tools.enabled": BOOL,
    "tools.name": STR,
    "tools.format": STR,
    "tools.max_turns": POS_INT,
    "tools.max_calls": NONNEG_INT,
    "tools.max_output_chars": integer(16),
    "tools.session": choice("stateless", "trajectory"),
    "tools.tool_turn": choice("inline", "chat"),
    "tools.show_last_expression": BOOL,
    "tools.tags.*": owned("rollout/tool_formats.py (a tag string, or null for the format's own)"),
    "tools.executor.isolation": owned("evals/code/sandbox.py (auto, bwrap, unshare or none)"),
    "tools.mask_invalid_calls": BOOL,
    "tools.mask_repeated": BOOL,
    "tools.drop_void_turns": BOOL,
    "tools.answer_pattern": Rule("str", nullable=True),
    "tools.executor.wall_seconds": POS,
    "tools.executor.cpu_seconds": POS_INT,
    "tools.executor.memory_mb": integer(64),
    "tools.executor.processes": POS_INT,
    "tools.executor.max_output_bytes": integer(256),
    "tools.executor.workers": NONNEG_INT,
    "tools.executor.launch": choice("zygote", "fresh"),
    "tools.shaping.call_bonus": number(),
    "tools.shaping.error_penalty": NONNEG,
}

#: Keys that moved: ``{old key: new key}``. Setting an old one is an error naming the new one.
RENAMED = {"trainer.lr": "optim.lr", "trainer.weight_decay": "optim.weight_decay", "trainer.betas": "optim.betas"}

TRAIN = {
    "output_dir": FOLDER,
    "trainer.total_steps": POS_INT,
    "trainer.seed": NONNEG_INT,
    "trainer.prompts_per_step": POS_INT,
    "trainer.mini_batch_prompts": POS_INT,
    "trainer.micro_batch_responses": POS_INT,
    "trainer.ppo_epochs": POS_INT,
    "trainer.micro_batch_tokens": integer(1, nullable=True),
    "trainer.grad_clip": POS,
    "trainer.val_every": NONNEG_INT,
    "trainer.save_every": NONNEG_INT,
    "trainer.keep_checkpoints": NONNEG_INT,
    "trainer.resume": choice(*RESUME_MODES),
    "trainer.dtype": choice("float32", "bfloat16"),
    "trainer.fsdp": choice("auto", True, False),
    "trainer.gradient_checkpointing": BOOL,
    "trainer.token_chunk_size": POS_INT,
    "trainer.progress": BOOL,
    "trainer.samples_every": NONNEG_INT,
    "trainer.samples_rows": POS_INT,
    "trainer.staleness": NONNEG_INT,
    "trainer.rollout_gpus": NONNEG_INT,
    "trainer.worker_stall_s": number(0, open_low=True, nullable=True),
    "trainer.collective_timeout_s": number(0, open_low=True),
    "trainer.device": STR,
    "trainer.threads": THREADS,
    "rollout.name": STR,
    "data.*": owned("the task (tasks/, trainers/data/): each data= option declares its own keys"),
    "reward.functions": owned("rewards/ (a list of {fn, weight, ...} entries or function names)"),
    "reward.url": OPT_STR,
    "val.benchmarks": STR_LIST,
    "diagnostics.reflection.words": owned("trainers/stats/reflection.py (default, orz, oat_zero, or a list of words)"),
    "diagnostics.reflection.repetition_n": POS_INT,
    "diagnostics.reflection.entropy": BOOL,
    "diagnostics.reflection.workers": NONNEG_INT,
    "val.prompts": NONNEG_INT,
    "val.temperature": NONNEG,
    "val.top_p": OPEN_PROB,
    "val.max_new_tokens": integer(1, nullable=True),
    "val.n_samples": POS_INT,
    "val.limit": integer(1, nullable=True),
    "diagnostics.quadrants": BOOL,
    "diagnostics.entropy_change": BOOL,
    "diagnostics.probe_prompts": POS_INT,
    "diagnostics.probe_responses": POS_INT,
    "diagnostics.attribution": BOOL,
    "diagnostics.attribution_every": POS_INT,
    "diagnostics.entropy_quantiles": Rule("float_list", low=0, high=1, open_low=True, open_high=True, nullable=True),
    "val.pass_k": NONNEG_INT,
    "rollout.n": POS_INT,
    "rollout.temperature": POS,
    "rollout.top_p": OPEN_PROB,
    "rollout.top_k": NONNEG_INT,
    "rollout.max_new_tokens": POS_INT,
    "rollout.batch_size": POS_INT,
    "rollout.seed_scope": choice("call", "group"),
    "rollout.share_prefill": BOOL,  # the hf engine's (conf/rollout/hf.yaml)
    # the vllm engine's own keys (conf/rollout/vllm.yaml; null: the engine's choice for the device)
    "rollout.dtype": choice("float32", "bfloat16", "float16", nullable=True),
    "rollout.gpu_memory_utilization": number(0, 1, open_low=True, nullable=True),
    "rollout.cpu_kvcache_space": POS,
    "rollout.tensor_parallel_size": POS_INT,
    "rollout.max_model_len": integer(1, nullable=True),
    "rollout.max_num_seqs": integer(1, nullable=True),
    "rollout.enforce_eager": Rule("bool", nullable=True),
    "rollout.inprocess": choice("auto", True, False),
    "rollout.seed": NONNEG_INT,
    "rollout.sync_bucket_mb": POS,
    "rollout.engine_kwargs.*": owned("rollout/vllm_engine.py (any other vllm.LLM argument)"),
    "rollout.tis.*": owned("trainers/interventions/tis.py (its Params: enabled, cap, mode)"),
    "model.lora.rank": integer(1, nullable=True),
    "model.lora.alpha": number(0, open_low=True, nullable=True),
    "model.lora.dropout": number(0, 1, open_high=True),
    "model.lora.save_merged": BOOL,
    "model.lora.target_modules": owned("models/lora.py (all-linear, or a list of module names)"),
    "reward.timeout_s": number(0, open_low=True, nullable=True),
    "reward.workers": NONNEG_INT,
    "reward.fallback": number(),
    "reward.retries": NONNEG_INT,
    "reward.backoff_s": NONNEG,
    **OPTIM,
    **MODEL,
    **TRACKING,
    **TOOLS,
}

EVAL = {
    "output_dir": FOLDER,
    "eval.n_samples": integer(1, nullable=True),
    "eval.limit": integer(1, nullable=True),
    "eval.temperature": number(0, nullable=True),
    "eval.top_p": number(0, 1, open_low=True, nullable=True),
    "eval.max_new_tokens": integer(1, nullable=True),
    "eval.heartbeat_s": POS,
    "eval.unrepresentable": choice("error", "warn"),
    "eval.batch_size": POS_INT,
    "eval.backend": STR,  # a registered rollout engine name: checked against rollout.ROLLOUT_ENGINES
    "eval.seed": NONNEG_INT,
    "eval.workers": integer(1, nullable=True),
    "eval.grade_timeout": POS,
    "benchmarks": STR_LIST,
    "eval.prompt": STR,
    "eval.chat_template": owned("evals/ (auto, or what model.chat_template accepts)"),
    "eval.device": STR,
    "eval.threads": THREADS,
    "eval.reflection_words": owned("trainers/stats/reflection.py (default, orz, oat_zero, or a list of words)"),
    "eval.data_root": OPT_STR,
    "eval.sandbox.*": owned("evals/code/sandbox.py (SandboxLimits: null keeps the benchmark's own limit)"),
    "eval.vllm.*": owned("rollout/vllm_engine.py (vLLM engine arguments; null: vLLM's default)"),
    **MODEL,
    **TRACKING,
    **TOOLS,
}

SWEEP = {
    "sweep_dir": FOLDER,
    "seeds": Rule("int_list", low=0),
    "poll_seconds": POS,
    "report.entropy_threshold": NONNEG,
    "report.tail_frac": OPEN_PROB,
    "launcher.max_parallel": POS_INT,
    "launcher.timeout_min": POS_INT,
    "launcher.max_num_timeout": NONNEG_INT,
    "launcher.signal_delay_s": NONNEG_INT,
    "launcher.warm_start": BOOL,
    "launcher.nodes": POS_INT,
    "launcher.gpus_per_node": NONNEG_INT,
    "launcher.tasks_per_node": integer(1, nullable=True),
    "launcher.cpus_per_task": POS_INT,
    "launcher.mem_gb": number(0, open_low=True, nullable=True),
    "launcher.array_parallelism": POS_INT,
    "launcher.name": STR,
    # the slurm launcher's own keys (conf/launcher/slurm.yaml)
    "launcher.partition": OPT_STR,
    "launcher.account": OPT_STR,
    "launcher.qos": OPT_STR,
    "launcher.job_name": STR,
    "launcher.setup": Rule("str_list"),
    "launcher.additional_parameters.*": owned("submitit (any other sbatch option)"),
    "launcher.python": OPT_STR,
    "launcher.use_srun": BOOL,
    "launcher.check_request": BOOL,
    "launcher.stuck_after_s": POS,
    "launcher.post_mortem": BOOL,
    "launcher.threads_per_job": owned("sweeps/ (auto, 0: each job picks its own, or N threads)"),
    "ablation.*": owned("sweeps/planning.py (name, description, base, variants, report)"),
    "variants": Rule("str_list", nullable=True),
    "budget": STR_LIST,
    **TRACKING,
}

SCHEMAS: dict[str, dict[str, Rule]] = {"train": TRAIN, "eval": EVAL, "sweep": SWEEP}


def rule_for(config_name: str, key: str) -> Rule | None:
    """The rule of ``key`` in ``config_name``'s table: its own entry, else the nearest ``prefix.*``
    section that holds it; None when the table does not know the key."""
    table = SCHEMAS.get(config_name, {})
    if key in table:
        return table[key]
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        section = ".".join(parts[:n]) + ".*"
        if section in table:
            return table[section]
    return None


def _divisible(cfg) -> str | None:
    p, m = _get(cfg, "trainer.prompts_per_step"), _get(cfg, "trainer.mini_batch_prompts")
    if isinstance(p, int) and isinstance(m, int) and p % m:
        return (
            f"trainer.prompts_per_step={p} must be a multiple of trainer.mini_batch_prompts={m} "
            f"(prompts_per_step / mini_batch_prompts optimizer steps per epoch)"
        )
    return None


#: Checks that involve several keys: each returns a problem (one line) or None. (``_divisible`` is
#: also enforced by the trainer at start; tests/sweeps/test_sweeps.py uses it as a job that fails at run
#: time, so it is not in this list yet.)
CROSS_CHECKS: dict[str, list[Callable[[Any], str | None]]] = {}


# -- checking ----------------------------------------------------------------------------------
def _get(cfg, key: str) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        return value
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def renamed_problem(key: str, value: Any = _ABSENT) -> str | None:
    """The error line for setting renamed key ``key`` (to ``value``, when known), or None."""
    new = RENAMED.get(key)
    if new is None:
        return None
    shown = "..." if value is _ABSENT else _show(value)
    return f"{key} was renamed {new}; use {new}={shown}"


def check_value(key: str, value: Any, rule: Rule) -> None:
    """Raise ``UserError`` when ``value`` breaks ``rule`` (the message names key, value, allowed)."""
    if rule.ok(value):
        return
    if rule.kind == "path" and isinstance(value, (str, Path)) and str(value).strip():
        raise UserError(f"{key}={value}: {folder_problem(value)}; choose another {key}=...")
    raise UserError(f"{key}={_show(value)} is not allowed: it must be {rule.allowed()}")


def validate_config(cfg, config_name: str) -> None:
    """Check every value of a composed ``config_name`` config against its table (see module doc)."""
    if config_name == "train":
        for old in RENAMED:
            value = _get(cfg, old)
            if value is not _ABSENT:
                raise UserError(renamed_problem(old, value))
    for key, rule in SCHEMAS.get(config_name, {}).items():
        if key.endswith(".*"):
            continue  # a section its component checks
        value = _get(cfg, key)
        if value is not _ABSENT:
            check_value(key, value, rule)
    for check in CROSS_CHECKS.get(config_name, []):
        problem = check(cfg)
        if problem:
            raise UserError(problem)


# -- paths -------------------------------------------------------------------------------------
def _first_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return p
    return Path(".")


def folder_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be (or become) a writable folder, or None when it can."""
    p = Path(os.path.expanduser(str(path))).absolute()
    if p.exists() and not p.is_dir():
        return f"{p} is a file, not a folder"
    base = _first_existing(p)
    if not base.is_dir():
        return f"{p} lies under {base}, which is a file, not a folder"
    if p.parts[1:2] in (("proc",), ("sys",)):  # the kernel's own files: root may "write", mkdir fails
        return f"{p} lies under /{p.parts[1]}, the kernel's pseudo file system, where no folder can be made"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base} is not writable"
    return None


def file_problem(path: str | Path) -> str | None:
    """Why a file cannot be written at ``path`` (a folder there, a parent that is a file, no
    permission), or None when it can."""
    p = Path(os.path.expanduser(str(path))).absolute()
    long = _name_too_long(p)
    if long:
        return long
    if p.is_dir():
        return f"{p} is a folder, not a file"
    if p.exists():
        return None if os.access(p, os.W_OK) else f"{p} is not writable"
    base = _first_existing(p.parent)
    if not base.is_dir():
        return f"{p} lies under {base}, which is a file, not a folder"
    return None if os.access(base, os.W_OK | os.X_OK) else f"{base} is not writable"


def _name_too_long(p: Path) -> str | None:
    """A part of ``p`` longer than its file system takes (NAME_MAX bytes, usually 255), said before
    minutes of work rather than when the file is written."""
    limit = 255
    for folder in reversed(p.parents):  # "/", "/a", "/a/b", ...: the deepest existing folder's limit
        try:
            if not folder.is_dir():
                break
            limit = os.pathconf(folder, "PC_NAME_MAX")
        except (OSError, ValueError):  # a part too long to even look up ends the walk
            break
    for part in p.parts[1:]:
        size = len(part.encode("utf-8", errors="surrogateescape"))
        if size > limit:
            return f"the name {part[:24]}... is {size} bytes, over the {limit} this file system takes"
    return None


def check_output_file(path: str | Path, option: str) -> None:
    """Raise ``UserError`` unless a file can be written at ``path`` (``option`` names the flag)."""
    problem = file_problem(path)
    if problem:
        raise UserError(f"{option} {path}: {problem}; choose another {option}")
