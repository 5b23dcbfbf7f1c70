"""Training prompts from math datasets (``data.kind: math``): verl parquet, jsonl/json, or the hub.

``conf/data/dapo_math_17k.yaml`` is the reference use: DAPO-Math-17k in verl's parquet layout
(``prompt`` = chat messages, gold answer in ``reward_model.ground_truth``), read from
``<data root>/verl/DAPO-Math-17k.parquet`` where the data root is ``data.data_root``, else
``$ENTROPYRL_DATA`` (training sets are not packaged with entropyrl); without the file, the
hub dataset ``data.hub`` (``BytedTsinghua-SIA/DAPO-Math-17k``) through ``datasets``. Any
jsonl/json/parquet with problem/answer fields works too (``data.fields``), read by the same
loader as the eval harness (``evals.benchmarks.read_rows`` / ``rows_to_problems``; repeated rows
are dropped).

- Prompts: ``data.prompt`` = ``native`` (the file's own chat messages, verl), ``dapo`` (DAPO's
  "Answer: $Answer" instruction) or ``boxed``, through the tokenizer's chat template when it has
  one (``data.chat_template: auto``) -- the same ``evals.prompts.build_prompt`` the evaluation
  uses. Prompts longer than ``data.max_prompt_length`` tokens are dropped (verl's
  ``filter_overlong_prompts``).
- Rewards: 1.0 when the response's final answer (last ``\\boxed{}``, else the text after the last
  ``Answer:``) equals the gold answer under ``evals.grader`` (normalisation + math-verify in
  time-limited worker processes; model text is never executed), else 0.0. ``rewards(items,
  responses)`` grades a whole batch in parallel.
- Order: training prompts are read epoch by epoch, each epoch a fresh permutation seeded by
  (seed, epoch); step ``s`` takes positions ``[s*n, (s+1)*n)`` of that stream, so a resumed run
  sees exactly the prompts it would have seen. Extra dynamic-sampling rounds (``attempt > 0``)
  draw ``n`` prompts at random, seeded by (seed, step, attempt).
- Validation (``val.prompts``): ``data.holdout`` problems are kept out of training and used for
  it; with ``holdout: 0`` validation prompts are a fixed sample of the training set (use
  ``val.benchmarks`` for real held-out benchmarks).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Sequence

from ...conf import cfg_get, to_plain
from ...core.errors import UserError
from ...core.registry import unknown_choice
from ...evals.benchmarks import describe_fields, limit_rows, read_rows, repeated_note, resolve_data_root, rows_to_problems
from ...evals.grading.grader import grade_batch, ungraded_warning
from ...evals.prompts import available_templates, build_prompt
from ...models.tiny import check_representable, representable

__all__ = ["MathDatasetSource", "load_problems", "resolve_data_path"]


def _python(value):
    """numpy arrays / scalars (parquet, datasets) -> lists / Python scalars, recursively."""
    if isinstance(value, dict):
        return {k: _python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_python(v) for v in value]
    tolist = getattr(value, "tolist", None)
    return _python(tolist()) if callable(tolist) else value


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def resolve_data_path(data_cfg) -> Path | None:
    """The file an explicit ``data.path`` names, or None when ``data.path`` is null.

    An absolute path is taken as is; a relative one under the data root (``data.data_root`` /
    ``$ENTROPYRL_DATA``) when it is there, else under the working folder. A path that does not exist,
    or is a folder, is a ``UserError`` naming it: a path the user wrote is never replaced by the hub."""
    raw = data_cfg.path
    if raw is None or str(raw).strip() == "":
        return None
    path = Path(str(raw)).expanduser()
    candidates = [path]
    if not path.is_absolute():
        root = resolve_data_root(data_cfg.data_root)
        candidates = ([root / path] if root is not None else []) + [Path.cwd() / path]
    for c in candidates:
        if c.is_file():
            return c
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is not None:
        raise UserError(
            f"data.path={raw}: {folder} is a folder, not a data file: point data.path at a .jsonl, .json or .parquet file"
        )
    looked = " and ".join(str(c) for c in candidates)
    raise UserError(
        f"data.path={raw}: no such file (looked for {looked}): fix the path "
        f"(a data.path you give is read as written, never replaced by a hub download)"
    )


def load_problems(data_cfg) -> tuple[list, str]:
    """``(problems, where)``: ``tasks.Problem`` items of ``data_cfg`` and where they came from.

    ``data.path`` given: that file or an error (``resolve_data_path``). ``data.path`` null: the
    preset's ``data.default_path`` under the data root when it is there, else the hub dataset
    ``data.hub``. ``problems`` is a list with ``skipped`` (rows over ``data.max_row_bytes``) and
    ``columns`` (which columns were read, in words) attributes."""
    name = str(data_cfg.name)
    fields = to_plain(cfg_get(data_cfg, "fields", {})) or {}
    max_bytes = cfg_get(data_cfg, "max_row_bytes", None)
    max_bytes = int(max_bytes) if max_bytes else None
    found = resolve_data_path(data_cfg)
    default = cfg_get(data_cfg, "default_path", None)
    if found is None and default:
        root = resolve_data_root(data_cfg.data_root)
        path = Path(str(default)).expanduser()
        path = path if path.is_absolute() else (root / path if root is not None else None)
        found = path if path is not None and path.is_file() else None
    if found is not None:
        rows = read_rows(found, max_row_bytes=max_bytes)
        return _Problems(
            rows_to_problems(rows, fields, source=str(found)), getattr(rows, "skipped", 0), describe_fields(rows, fields)
        ), str(found)
    hub = cfg_get(data_cfg, "hub", None)
    looked = (f"{default} under the data root (data.data_root or $ENTROPYRL_DATA)") if default else "no data.path"
    if not hub:
        raise UserError(f"data={name}: no data file ({looked}) and no data.hub: set data.path=FILE or ENTROPYRL_DATA=<data dir>")
    if _hub_offline():
        raise UserError(
            f"data={name}: no data file ({looked}) and the hub is off (HF_HUB_OFFLINE): "
            f"set data.path=FILE, ENTROPYRL_DATA=<data dir> or data.data_root=<data dir>"
        )
    try:
        import datasets

        ds = datasets.load_dataset(
            str(hub), cfg_get(data_cfg, "hub_name", None), split=str(cfg_get(data_cfg, "hub_split", "train"))
        )
    except Exception as exc:  # noqa: BLE001 - network, auth, missing dataset: one actionable line
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise UserError(
            f"data={name}: no data file ({looked}) and hub dataset '{hub}' failed to load "
            f"({first[:160]}): set ENTROPYRL_DATA=<data dir> or data.path"
        ) from None
    rows = limit_rows([_python(dict(r)) for r in ds], max_bytes)
    return _Problems(rows_to_problems(rows, fields, source=str(hub)), rows.skipped, describe_fields(rows, fields)), f"hub:{hub}"


class _Problems(list):
    """Problems, with how many rows were over the size limit or repeats, and which columns were read."""

    def __init__(self, items, skipped: int = 0, columns: str = ""):
        super().__init__(items)
        self.skipped = int(skipped)
        self.repeated = getattr(items, "repeated", 0)  # rows repeating an earlier (problem, answer)
        self.columns = columns


def first_problems(problems: list, limit) -> list:
    """The first ``data.limit`` problems (null: all); a limit below 1 is a ``UserError`` (it read as
    "all but the last N" or as no limit)."""
    if limit is None:
        return problems
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UserError(f"data.limit={limit} is not allowed: it must be a positive number of problems, or null for all")
    return problems[:limit]


def split_holdout(problems: list, data_cfg) -> tuple[list, list]:
    """``(train, validation)``: ``data.holdout`` problems (at least one left to train on) drawn
    with ``data.val_seed`` are held out for validation; with no holdout, validation uses every
    problem in that seeded order."""
    order = list(range(len(problems)))
    random.Random(int(data_cfg.val_seed)).shuffle(order)
    holdout = int(cfg_get(data_cfg, "holdout", 0) or 0)
    if holdout < 0 or (holdout and holdout >= len(problems)):
        raise UserError(
            f"data.holdout={holdout} is not allowed: the data has {len(problems)} problem(s), so hold out "
            f"0 to {len(problems) - 1} (one at least left to train on; 0 validates on a sample of the training set)"
        )
    held = set(order[:holdout])
    val = [problems[i] for i in order[:holdout]] or [problems[i] for i in order]
    return [p for i, p in enumerate(problems) if i not in held], val


class MathDatasetSource:
    """A ``PROMPT_SOURCES`` entry (``data.kind: math``); see the module docstring."""

    log = staticmethod(print)  # where a step's grading warnings go (the trainer's log: components.build_source)

    def __init__(self, data_cfg, seed: int, tokenizer=None):
        self.cfg = data_cfg
        self.seed = int(seed)
        self.tokenizer = tokenizer
        self.name = str(data_cfg.name)
        self.template = str(data_cfg.prompt)
        self.chat_template = data_cfg.chat_template
        self.timeout = float(data_cfg.grade_timeout)
        self.workers = data_cfg.get("grade_workers", None) if data_cfg is not None else None

        if self.template not in available_templates():
            raise UserError(unknown_choice("data.prompt", self.template, available_templates()))
        loaded, self.where = load_problems(data_cfg)
        # said once at start by whoever builds the source (components.build_source): the columns
        # read, the rows left out and why
        self.notes = [f"data: {self.where}: {loaded.columns}"]
        repeated = repeated_note("data", loaded)
        if repeated:
            self.notes.append(repeated)
        if loaded.skipped:
            self.notes.append(
                f"data: skipped {loaded.skipped} row(s) over data.max_row_bytes="
                f"{cfg_get(data_cfg, 'max_row_bytes', None)} bytes (not tokenised)"
            )
        problems = first_problems(list(loaded), data_cfg.limit)
        max_len = cfg_get(data_cfg, "max_prompt_length", None)
        if tokenizer is not None and problems:  # a prompt the model cannot read: refused or counted, never rewritten
            texts = [self.prompt(p) for p in problems]
            note = check_representable(
                tokenizer,
                texts,
                [p.id or str(i + 1) for i, p in enumerate(problems)],
                what=f"data={self.name} ({self.where})",
                option="data.unrepresentable",
                mode=str(data_cfg.unrepresentable),
            )
            if note:
                self.notes.append(f"data: warning: {note}")
                kept = [problems[i] for i in representable(tokenizer, texts)]  # nothing left: out, counted above
                if not kept:
                    raise UserError(
                        f"data={self.name}: no prompt of {self.where} keeps a character the model can represent: "
                        "use a real model (e.g. model=smollm2-135m)"
                    )
                problems = kept
        if not problems:
            raise UserError(
                f"data={self.name}: no problems in {self.where}"
                + (
                    f" ({loaded.skipped} row(s) over data.max_row_bytes)"
                    if loaded.skipped
                    else " (no row has the problem and answer columns)"
                )
            )
        #: ``(row id, prompt tokens)`` of each problem kept: what ``components.check_context`` reads
        self.prompt_tokens: list[tuple[str, int]] | None = None
        if tokenizer is not None:
            lengths = [len(tokenizer(self.prompt(p), add_special_tokens=False)["input_ids"]) for p in problems]
            fits = [not max_len or n <= int(max_len) for n in lengths]
            ids = [p.id or str(i + 1) for i, p in enumerate(problems)]
            self.prompt_tokens = [(r, n) for r, n, ok in zip(ids, lengths, fits) if ok]
        if max_len and tokenizer is not None:
            kept = [p for p, ok in zip(problems, fits) if ok]
            if len(kept) < len(problems):
                self.notes.append(
                    f"data: dropped {len(problems) - len(kept)} of {len(problems)} prompt(s) longer than "
                    f"data.max_prompt_length={max_len} tokens"
                )
            if not kept:
                raise UserError(
                    f"data={self.name}: all {len(problems)} prompt(s) in {self.where} are longer than "
                    f"data.max_prompt_length={max_len} tokens: raise data.max_prompt_length or shorten them"
                )
            problems = kept
        self.train_items, self.val_items = split_holdout(problems, data_cfg)
        self._perms: dict[int, list[int]] = {}

    @property
    def validates_on_training(self) -> bool:
        """``data.holdout=0``: nothing is held out, so validation samples the training problems
        (``split_holdout``); said at start by ``components.build_source``."""
        return not int(cfg_get(self.cfg, "holdout", 0) or 0)

    def __len__(self) -> int:
        return len(self.train_items)

    # -- prompts ------------------------------------------------------------------------------
    def _epoch(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            perm = list(range(len(self.train_items)))
            random.Random(f"{self.seed}/epoch/{epoch}").shuffle(perm)
            self._perms[epoch] = perm
        return self._perms[epoch]

    def sample(self, n: int, step: int, attempt: int = 0) -> list:
        size = len(self.train_items)
        if attempt == 0:
            out = []
            for pos in range(step * n, step * n + n):
                epoch, k = divmod(pos, size)
                out.append(self.train_items[self._epoch(epoch)[k]])
            return out
        rng = random.Random(f"{self.seed}/{step}/{attempt}")
        picks = rng.sample(range(size), n) if n <= size else [rng.randrange(size) for _ in range(n)]
        return [self.train_items[i] for i in picks]

    def validation(self, n: int) -> list:
        return list(self.val_items[: int(n)])

    def prompt(self, problem) -> str:
        return build_prompt(problem, self.template, self.tokenizer, self.chat_template)

    # -- rewards ------------------------------------------------------------------------------
    def rewards(self, problems: Sequence, responses: Sequence[str]) -> list[float]:
        results = grade_batch(list(responses), [p.answer for p in problems], workers=self.workers, timeout=self.timeout)
        undecided = ungraded_warning([r.reason for r in results], self.timeout)
        if undecided:
            self.log(undecided)
        return [1.0 if r.correct else 0.0 for r in results]

    def reward(self, problem, response: str) -> float:
        return self.rewards([problem], [response])[0]

    def group(self, problem: Any) -> str:
        return self.name
