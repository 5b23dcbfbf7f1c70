"""A training run's output folder: what it already holds, and whether this run may use it.

``check_output_dir(cfg)`` decides, once per command, before the model is loaded and before anything
is written (it only reads the folder; the trainer then acts on its answer):

- ``trainer.resume=auto`` continues the run in ``output_dir`` only when its saved ``config.yaml``
  matches the requested config in everything but run length and logging options
  (``RESUMABLE_CHANGES``); otherwise it refuses, listing the keys that differ. When config.yaml
  is missing or unreadable, the latest checkpoint's own copy of the config is compared instead
  (none: refused). ``metrics.jsonl`` lines without an integer step and a damaged ``tracking.json``
  are refused naming the file and line, and a changed LoRA rank against the checkpoint's adapter;
- ``trainer.resume=never`` refuses a folder that already holds a run (checkpoints, metrics or an
  MLflow link) instead of silently mixing the two;
- ``trainer.resume=overwrite`` deletes the old run's checkpoints, metrics, summary, plots and MLflow
  link first, then starts fresh (the old MLflow run itself is left as it was).

"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...core.errors import UserError
from ...core.files import atomic_write_text  # noqa: F401  (re-exported for callers of run_dir)
from ...core.folder_lock import FolderLock
from ...core.tracking import check_metrics_file, parse_metrics, read_run_link
from ...core.validation import RENAMED
from ..parallel.process_group import launcher_env
from . import checkpoint as ckpt

#: Keys (or key prefixes ending in '.') that may change between a run and its resumption: how long
#: it runs, how often it validates/saves/logs, where it runs. Anything else would merge two runs.
RESUMABLE_CHANGES = (
    "output_dir",
    "trainer.total_steps",
    "trainer.resume",
    "trainer.progress",
    "trainer.threads",
    "trainer.device",
    "trainer.samples_every",
    "trainer.samples_rows",
    "trainer.val_every",
    "trainer.save_every",
    "trainer.keep_checkpoints",
    "trainer.worker_stall_s",  # how long a stuck rollout worker is waited for: no part of what is trained
    "trainer.reuse_stats_forward",  # the same numbers either way, one forward fewer (trainers/data/first_pass.py)
    "trainer.share_prompt_forward",  # the same numbers up to float rounding, the prompts run once a group
    "trainer.collective_timeout_s",  # how long a rank waits for the others in a collective: likewise
    "val.",
    "diagnostics.",
    "tracking.",
    "launcher.",  # launcher.: configs saved when train had that group
)

#: What runs saved before the ``optim`` section did for the keys that did not exist yet (their
#: ``trainer.lr``/``weight_decay``/``betas`` moved as ``core.validation.RENAMED`` says): AdamW at a
#: constant lr.
FORMER_OPTIM = {"name": "adamw", "scheduler": "constant", "warmup_steps": 0}

#: The figures a finished run draws at the top of its folder (``run_report``), by what they show.
FIGURES = {"curves": "curves.png", "quadrants": "quadrants.png", "attribution": "why_entropy_moved.png"}
FIGURES |= {"reflection": "reflection.png", "tools": "tools.png"}
#: What a run writes at the top of its folder besides ``checkpoints/``: overwrite deletes these, so an
#: overwritten run leaves none of the old run's records or figures beside the new run's.
RUN_RECORDS = ("metrics.jsonl", "tracking.json", "tracking.queue.jsonl", "summary.json", "config.yaml", "samples.jsonl")
RUN_FILES = (*RUN_RECORDS, *FIGURES.values())


@dataclass
class RunFolder:
    """What ``output_dir`` holds from an earlier run."""

    path: Path
    checkpoint_steps: list[int] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # of RUN_FILES, present
    saved_config: dict | None = None
    config_problem: str = "is missing"  # why saved_config is None

    @property
    def holds_run(self) -> bool:
        return bool(self.checkpoint_steps) or any(f in self.files for f in ("metrics.jsonl", "tracking.json"))

    def describe(self) -> str:
        parts = []
        if self.checkpoint_steps:
            parts.append(f"checkpoints up to step {max(self.checkpoint_steps)}")
        if "metrics.jsonl" in self.files:
            parts.append("metrics.jsonl")
        if "tracking.json" in self.files:
            parts.append("an MLflow run link (tracking.json)")
        return ", ".join(parts) or "nothing"


def inspect_folder(output_dir: Path) -> RunFolder:
    out = Path(output_dir)
    folder = RunFolder(out)
    if not out.is_dir():
        return folder
    folder.checkpoint_steps = ckpt.checkpoint_steps(out)
    folder.files = [f for f in RUN_FILES if (out / f).exists()]
    if "config.yaml" in folder.files:
        folder.saved_config, folder.config_problem = read_config(out / "config.yaml")
    return folder


def read_config(path: Path) -> tuple[dict | None, str]:
    """``(config, "")`` of a saved config.yaml, or ``(None, why it cannot be used)``."""
    from omegaconf import OmegaConf

    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as exc:  # noqa: BLE001 - YAML syntax, bad bytes, interpolation: one reason
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        return None, f"cannot be read ({first})"
    if not isinstance(loaded, dict) or not isinstance(loaded.get("trainer"), dict):
        return None, "is not a run's config (no trainer section)"
    return loaded, ""


def checkpoint_config(output_dir: Path) -> tuple[dict | None, Path | None]:
    """The config copy in the latest checkpoint (``save_checkpoint`` writes one into each), or None."""
    latest = ckpt.latest_checkpoint(Path(output_dir))
    copy = latest / ckpt.CONFIG_COPY if latest is not None else None
    if copy is None or not copy.exists():
        return None, copy
    return read_config(copy)[0], copy


def check_adapter(out: Path, cfg, fresh: str) -> None:
    """A changed ``model.lora.rank`` (or LoRA switched on or off) against the latest checkpoint's
    weights: refused as a changed config, before PEFT would fail on mismatched sizes."""
    latest = ckpt.latest_checkpoint(out)
    if latest is None:
        return
    lora = cfg.model.get("lora") if cfg.get("model") is not None else None
    want = lora.get("rank") if lora is not None else None
    adapter = latest / "model" / "adapter_config.json"
    if adapter.exists():
        try:
            have = json.loads(adapter.read_text()).get("r")
        except (OSError, ValueError):
            return  # a damaged checkpoint: load_latest_intact skips it
        if want is None or int(want) != int(have):
            asked = f"model.lora.rank={want}" if want is not None else "full fine-tuning (model.lora.rank=null)"
            raise UserError(
                f"output_dir={out} holds a LoRA run of rank {have} (checkpoint {latest.name}) and this run asks "
                f"for {asked}: run it with model.lora.rank={have} to continue it, or {fresh}"
            )
    elif want is not None and (latest / "model").is_dir():
        raise UserError(
            f"output_dir={out} holds a full fine-tuning run (checkpoint {latest.name}) and this run asks for "
            f"model.lora.rank={want}: run it with model.lora.rank=null to continue it, or {fresh}"
        )


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def _resumable(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE_CHANGES)


def config_differences(saved: dict, requested: dict) -> list[tuple[str, Any, Any]]:
    """``[(key, saved value, requested value)]`` for every key that differs and may not change on
    resume (``RESUMABLE_CHANGES`` are ignored). A key only one side has shows ``<absent>``."""
    a, b = _flat(saved), _flat(requested)
    absent = "<absent>"
    return [
        (k, a.get(k, absent), b.get(k, absent))
        for k in sorted(set(a) | set(b))
        if not _resumable(k) and a.get(k, absent) != b.get(k, absent)
    ]


#: Sections and keys added after runs were saved without them, as those runs ran (the data's verifier,
#: full fine-tuning, float32 sampling); a key of some options only (an engine's) where the request has it.
ADDED_SECTIONS = {
    "reward": {"functions": [], "url": None, "timeout_s": 60, "workers": 0, "fallback": 0.0, "retries": 2, "backoff_s": 0.5},
    "model.lora": {"rank": None, "alpha": None, "dropout": 0.0, "target_modules": "all-linear", "save_merged": False},
    "rollout.weights": "float32",
}


def _with_added_sections(saved: dict, requested: dict) -> dict:
    out = dict(saved)
    for key, value in ADDED_SECTIONS.items():
        head, _, leaf = key.partition(".")
        if not leaf and head not in out:
            out[head] = dict(value)
        elif leaf and isinstance(out.get(head), dict) and leaf not in out[head]:
            if isinstance(value, dict):
                out[head] = {**out[head], leaf: dict(value)}
            elif isinstance(requested.get(head), dict) and leaf in requested[head]:
                out[head] = {**out[head], leaf: value}
    return out


def upgrade_saved_config(saved: dict, requested: dict) -> dict:
    """A saved ``config.yaml`` (plain dict) in today's keys: a run saved before the ``optim``
    section has its ``trainer.lr``/``weight_decay``/``betas`` moved there, and the keys it lacked set
    to what it ran with (AdamW, constant lr, no warmup; ``min_lr_ratio``, unused at a constant lr,
    as requested), so it still resumes with the same settings; so do the ``ADDED_SECTIONS``."""
    saved = _with_added_sections(saved, requested)
    trainer = saved.get("trainer")
    if not isinstance(trainer, dict) or not any(old.split(".", 1)[1] in trainer for old in RENAMED):
        return saved
    upgraded = {**saved, "trainer": dict(trainer)}
    optim = dict(upgraded.get("optim") or {})
    for old, new in RENAMED.items():
        leaf = old.split(".", 1)[1]
        if leaf in upgraded["trainer"]:
            optim.setdefault(new.split(".", 1)[1], upgraded["trainer"].pop(leaf))
    for key, value in FORMER_OPTIM.items():
        optim.setdefault(key, value)
    wanted = requested.get("optim") if isinstance(requested.get("optim"), dict) else {}
    if "min_lr_ratio" in wanted:
        optim.setdefault("min_lr_ratio", wanted["min_lr_ratio"])
    upgraded["optim"] = optim
    return upgraded


def _fmt(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict, bool)) or v is None else str(v)


def check_output_dir(cfg) -> str:
    """What this run does with ``cfg.output_dir`` (see the module doc), without changing it:
    ``"fresh"`` (nothing there to continue), ``"resume"`` (continue the run there) or
    ``"overwrite"`` (delete the old run's files first: ``clear_previous_run``). Raises
    ``UserError`` when the folder holds a run this one may not continue."""
    from omegaconf import OmegaConf

    mode = str(cfg.trainer.resume)
    out = Path(str(cfg.output_dir))
    folder = inspect_folder(out)
    fresh = "start fresh with another output_dir=... or trainer.resume=overwrite (deletes the old run's files)"
    if mode == "overwrite":
        return "overwrite" if folder.holds_run or folder.files else "fresh"
    if not folder.holds_run:
        return "fresh"
    if mode == "never":
        raise UserError(
            f"output_dir={out} already holds a run ({folder.describe()}) and trainer.resume=never does not "
            f"reuse it: pass trainer.resume=auto to continue it, or {fresh}"
        )
    if mode != "auto":
        raise UserError(f"trainer.resume={mode} is not allowed: it must be one of auto, never, overwrite")
    # the records a resume reads back: each checked before it is believed
    check_metrics_file(out / "metrics.jsonl")
    read_run_link(out / "tracking.json")
    saved, against = folder.saved_config, ""
    if saved is None and folder.checkpoint_steps:
        # config.yaml missing or damaged: the checkpoint's own copy says what the run trained with
        saved, copy = checkpoint_config(out)
        if saved is None:
            raise UserError(
                f"{out / 'config.yaml'} {folder.config_problem} and the checkpoint holds no copy of the run's "
                f"config, so this run's settings cannot be checked against it: restore config.yaml, or {fresh}"
            )
        against = f" (config.yaml {folder.config_problem}; compared with the checkpoint's copy {copy})"
    if saved is not None:
        requested = OmegaConf.to_container(cfg, resolve=True)
        diffs = config_differences(upgrade_saved_config(saved, requested), requested)
        if diffs:
            shown = "; ".join(f"{k}: {_fmt(old)} -> {_fmt(new)}" for k, old, new in diffs[:8])
            more = f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""
            raise UserError(
                f"output_dir={out} holds a run with other settings ({shown}{more}){against}; only run length "
                f"and logging options may change on resume: run it with its own settings to "
                f"continue it, or {fresh}"
            )
    check_adapter(out, cfg, fresh)
    return "resume"


def run_lock(cfg):
    """The lock that makes this process ``output_dir``'s only writer (a context manager); other
    ranks of a distributed run write nothing there on their own and take none."""
    if launcher_env()["rank"] != 0:
        return contextlib.nullcontext()
    return FolderLock(
        Path(str(cfg.output_dir)),
        "`entropyrl train`",
        key="output_dir",
        hint="wait for it to end (or stop it), or run this one with another output_dir=...",
    )


@contextlib.contextmanager
def run_folder(cfg):
    """``run_lock(cfg)`` held for the block; when the block fails and leaves a folder this run
    created holding nothing but its lock (a refusal or a stop during set-up), the folder goes:
    an error at set-up leaves no empty run folder behind."""
    folder = Path(str(cfg.output_dir))
    created = not folder.exists()
    with run_lock(cfg):
        try:
            yield
        except BaseException:
            if created and launcher_env()["rank"] == 0:
                with contextlib.suppress(OSError):
                    if [p.name for p in folder.iterdir()] == [".lock"]:
                        (folder / ".lock").unlink()
                        folder.rmdir()
            raise


def prepare_output_dir(cfg, *, is_main: bool = True, log: Callable[[str], None] = print, clear: bool = True) -> str:
    """``check_output_dir`` and, for ``overwrite`` (``clear``), the old run's files deleted by the
    main process; returns ``"fresh"`` or ``"resume"``."""
    mode = check_output_dir(cfg)
    if mode == "overwrite":
        if clear:
            clear_previous_run(Path(str(cfg.output_dir)), is_main=is_main, log=log)
        return "fresh"
    return mode


def clear_previous_run(output_dir: Path, *, is_main: bool = True, log: Callable[[str], None] = print) -> None:
    """``trainer.resume=overwrite``: the main process deletes the previous run's files; said once."""
    folder = inspect_folder(Path(output_dir))
    if is_main:
        clear_run(folder.path)
    log(f"trainer.resume=overwrite: deleted the previous run in {folder.path} ({folder.describe()})")


def settle_output_dir(cfg, run_mode: str | None, is_main: bool, log: Callable[[str], None] = print) -> str:
    """The trainer acting on ``check_output_dir``'s answer (``run_mode``, when the command already
    has it; else asked here): ``"resume"`` or ``"fresh"``, where ``"overwrite"`` first deletes the
    previous run's files (``clear_previous_run``) and then starts fresh."""
    mode = run_mode if run_mode is not None else check_output_dir(cfg)
    if mode == "overwrite":
        clear_previous_run(Path(cfg.output_dir), is_main=is_main, log=log)
        mode = "fresh"
    return mode


def clear_run(output_dir: Path) -> None:
    """Delete an earlier run's checkpoints, metrics, summary, plots and MLflow link in ``output_dir``."""
    out = Path(output_dir)
    shutil.rmtree(ckpt.checkpoint_dir(out), ignore_errors=True)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)


def check_metrics_record(output_dir: Path, resumed: int | None, log: Callable[[str], None] = print) -> None:
    """Before a resumed run appends to metrics.jsonl: if it was deleted or cut short (steps missing
    before the checkpoint), rebuild it from the checkpoint's copy of the record or say what is lost."""
    if resumed is None:
        return
    path = Path(output_dir) / "metrics.jsonl"
    rows = parse_metrics(path.read_text(errors="replace"))[0] if path.exists() else []
    have = {int(r["step"]) for r in rows if isinstance(r.get("step"), (int, float))}
    missing = [s for s in range(1, resumed + 1) if s not in have]
    if not missing:
        return
    saved = ckpt.checkpoint_dir(output_dir) / f"step_{resumed:06d}" / "metrics.jsonl"
    copy = parse_metrics(saved.read_text(errors="replace"))[0] if saved.exists() else []
    if {int(r["step"]) for r in copy} >= set(missing):
        merged = {int(r["step"]): r for r in copy if int(r["step"]) <= resumed}
        merged.update({int(r["step"]): r for r in rows if int(r["step"]) <= resumed})
        atomic_write_text(path, "".join(json.dumps(merged[k]) + "\n" for k in sorted(merged)))
        log(f"warning: {path} lacked steps {_span(missing)}: rebuilt from the checkpoint at step {resumed}")
    else:
        log(
            f"warning: {path} lacks steps {_span(missing)} and the checkpoint holds no copy of them: the "
            f"summary's first-tenth figures cover only the steps still there"
        )


def _span(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])
