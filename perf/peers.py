"""``make bench-peers`` (key ``peers``): ``entropyrl train data=toy`` against TRL's ``GRPOTrainer`` on
the same workload, measured in the same run.

The workload is ours, composed from ``data=toy`` (``OVERRIDES``: the bench's harness settings, and
the dual clip off because TRL has none), and handed to TRL through ``perf/_peer_workload.py``: the
same embedded model folder (the warm-started tiny model and its character tokenizer, which TRL
loads as any Hugging Face folder), the prompts of every step in our order, the batch, sampling,
optimizer and loss settings, and our verifier as the reward. Each side reports the settings it
actually trained with (ours from the composed config, TRL's from its ``GRPOConfig``);
``workload_equal`` says whether they agree field by field, ``workload_differences`` lists any that
do not.

The two sides take turns, ``REPEATS`` runs each, every run a fresh process on the same torch thread
count; each figure is its median over a side's runs, the curves are the first runs':

- ``step_s``: min and median seconds per step after the first ``WARMUP`` steps (ours: the run's
  ``time/step``; TRL: the time between the ends of consecutive steps of ours, i.e. of every
  ``updates_per_step``-th optimizer step);
  ``step_s_outside``: the mean seen from outside, from when the rows appear in the metrics files
  (each side's logging included);
- ``startup_s``: from the process's launch to its first finished step (the first row of its
  metrics file, polled the same way for both);
- ``peak_rss_mb``: the process's peak resident memory (``wait4``'s ``ru_maxrss``);
- ``response_tokens_mean`` and ``step_s_per_response_token`` (ratio ``step_ratio_per_token``): the
  steady steps' mean response length and seconds per response token, since equal settings are not
  equal work when one side's responses end sooner;
- ``curves``: the batch's mean reward and mean response length per step, side by side;
- ``same_batch``: both sides' gradient on one batch our trainer collected (``perf/_peer_batch.py``).

Ratios are ours over TRL's: below 1 is better for us. Where SmolLM2-135M-Instruct is installed (``make
install-smollm2``) the same comparison runs on the real model too (key ``real_model``: the real-model
study's step, ``REAL_MODEL_OVERRIDES``, ``ENTROPYRL_PEER_REAL_STEPS`` steps, 0 to leave it out): the
prompts are the literal text our policy is given (its chat template applied), both sides end a response
at the same token ids, and TRL grades with our word-problem verifier served from the product venv
(``perf/_peer_reward.py``). Without the peer venv (``make bench-peers``
makes it; ``ENTROPYRL_PEERS_PYTHON`` names another interpreter) ``make bench`` leaves this suite out.
Its section of ``docs/performance.md`` (between ``<!-- bench:peers:begin -->`` and
``<!-- bench:peers:end -->``) is ``render``'s, written by ``perf/run.py`` with the result; no other
section is touched.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PAGE = REPO / "docs" / "performance.md"
STEPS = int(os.environ.get("ENTROPYRL_PEER_STEPS", "12"))
REPEATS = int(os.environ.get("ENTROPYRL_PEER_REPEATS", "3"))  # runs of each side, taking turns; figures: medians
THREADS = 1  # torch threads of each side: the same for both, and whatever cores other work leaves free
#: The harness's own settings (no validation, checkpoints, samples, progress bar or tracking), both workloads.
HARNESS = [
    "trainer.val_every=0",
    "trainer.save_every=0",
    "trainer.samples_every=0",
    "trainer.progress=false",
    "val.prompts=0",
    "tracking.enabled=false",
]
OVERRIDES = [
    "data=toy",
    "algo.clip.dual_c=null",  # TRL's clipped surrogate has no dual clip
    f"trainer.threads={THREADS}",
    *HARNESS,
]
# The real model: the real-model study's step (SmolLM2-135M-Instruct on word problems, 4 x 4 responses of
# up to 64 tokens, lr 2e-5, one update a step), where the package is installed (`make install-smollm2`).
REAL_MODEL_THREADS = 2  # the study's: a step of this model takes tens of seconds, the sides never overlap
REAL_MODEL_OVERRIDES = [
    "experiment=smollm2_word_problems",
    "algo.clip.dual_c=null",
    f"trainer.threads={REAL_MODEL_THREADS}",
    *HARNESS,
    "val.benchmarks=[]",
]
REAL_MODEL_STEPS = int(os.environ.get("ENTROPYRL_PEER_REAL_STEPS", "5"))  # 0: leave the real model out
REAL_MODEL_REPEATS = int(os.environ.get("ENTROPYRL_PEER_REAL_REPEATS", "1"))


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"perf_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


workload_mod = _sibling("_peer_workload")
measure = _sibling("_peer_measure")  # one side's run measured
batch_check = _sibling("_peer_batch")  # both sides' gradient on one batch


def peer_python() -> Path:
    """The peer venv's interpreter: ``ENTROPYRL_PEERS_PYTHON``, else ``.venv-peers`` in the checkout."""
    # absolute but not resolved: a venv's python is a link, and resolving it leaves the venv
    return Path(os.path.abspath(os.environ.get("ENTROPYRL_PEERS_PYTHON") or REPO / ".venv-peers" / "bin" / "python"))


def available() -> bool:
    return peer_python().exists()


def plan(steps: int, base: list[str] = OVERRIDES, threads: int = THREADS) -> tuple[list[str], dict, list[list], dict]:
    """Our overrides for ``steps`` steps of the workload ``base``, our workload, the problems of every
    step in our order (each prompt the literal text our policy is given: the chat template applied
    where the model has one) and how TRL's side grades them (``reward``: None, our standard-library
    verifier in its own process; else our source's verifier served from this venv by
    ``perf/_peer_reward.py``, with the overrides that compose it)."""
    from entropyrl.conf import compose
    from entropyrl.models.loading import load_policy
    from entropyrl.rollout.base import stop_token_ids
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    overrides = [*base, f"trainer.total_steps={steps}"]
    cfg = compose("train", overrides)
    model, tokenizer = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    stop_ids = stop_token_ids(model, tokenizer)  # what our engines end a response at
    source = build_prompt_source(cfg.data, int(cfg.trainer.seed), tokenizer=tokenizer)
    per_step = int(cfg.trainer.prompts_per_step)
    problems = [p for step in range(steps) for p in source.sample(per_step, step, 0)]
    prompts = [source.prompt(p) for p in problems]
    trl_side = _sibling("_peer_trl")
    workload = workload_mod.ours(
        cfg,
        model_dir=str(model.config._name_or_path),
        threads=threads,
        prompts_sha256=trl_side.prompts_sha256(prompts),
        stop_token_ids=stop_ids,
    )
    builtin = str(cfg.data.kind) == "builtin"
    reward = None if builtin else {"python": sys.executable, "overrides": overrides}
    rows = [[p.task, text, p.answer, list(p.params)] for p, text in zip(problems, prompts)]
    return overrides, workload, rows, reward


def _run_ours(folder: Path, overrides: list[str], threads: int) -> tuple[dict, list[dict]]:
    out = folder / "ours"
    cmd = [sys.executable, "-m", "entropyrl.cli.main", "train", f"output_dir={out}", *overrides]
    measured = measure.run(cmd, out / "metrics.jsonl", folder, threads)
    rows = measure.read_rows(out / "metrics.jsonl")
    return measure.figures(measured, rows), rows


def _run_trl(folder: Path, job: Path, threads: int) -> tuple[dict, list[dict], dict]:
    out = folder / "trl"
    cmd = [str(peer_python()), str(HERE / "_peer_trl.py"), str(job), str(out)]
    measured = measure.run(cmd, out / "rows.jsonl", folder, threads)
    rows = measure.read_rows(out / "rows.jsonl")
    return measure.figures(measured, rows), rows, json.loads((out / "result.json").read_text())


def same_batch(base: list[str], threads: int, flip: bool = False) -> dict:
    """Both sides' gradient on one batch our trainer collected, compared (``perf/_peer_batch.py``)."""
    overrides = batch_check.one_update(base)
    _, workload, problems, reward = plan(1, overrides, threads)
    job = {"workload": workload, "problems": problems, "reward": reward}
    return batch_check.same_batch(overrides, threads, job, peer_python(), flip=flip)


def compare(base: list[str], threads: int, steps: int, repeats: int) -> dict:
    """Both sides on the workload ``base`` for ``steps`` steps, ``repeats`` runs each taking turns:
    the ratios (``trl``), each side's median figures, the workload and whether TRL's equals ours."""
    if steps <= measure.WARMUP or repeats < 1:
        raise ValueError(f"{steps} steps / {repeats} runs: need more than {measure.WARMUP} steps and one run")
    overrides, ours_workload, problems, reward = plan(steps, base, threads)
    load_before = os.getloadavg()[0]
    ours_runs, trl_runs, curves, differences = [], [], {}, []
    for _ in range(repeats):  # the two sides take turns, each in a fresh folder
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
            folder = Path(tmp)
            job = folder / "job.json"
            job.write_text(json.dumps({"workload": ours_workload, "problems": problems, "reward": reward}))
            figures, rows = _run_ours(folder, overrides, threads)
            ours_runs.append(figures)
            curves.setdefault("ours", [round(r["reward/mean"], 4) for r in rows])
            curves.setdefault("ours_length", [round(r["response_length/mean"], 2) for r in rows])
            figures, rows, trl_result = _run_trl(folder, job, threads)
            trl_runs.append(figures)
            curves.setdefault("trl", [round(r["reward/mean"], 4) for r in rows])
            curves.setdefault("trl_length", [round(r["response_length/mean"], 2) for r in rows])
            differences += [d for d in workload_mod.differences(ours_workload, trl_result["workload"]) if d not in differences]
    ours, peer = measure.median_figures(ours_runs), measure.median_figures(trl_runs)
    return {
        "trl": {
            "version": trl_result["trl"],
            "step_ratio": round(ours["step_s_median"] / peer["step_s_median"], 3),
            "step_ratio_min": round(ours["step_s_min"] / peer["step_s_min"], 3),
            "step_ratio_outside": round(ours["step_s_outside"] / peer["step_s_outside"], 3),
            "step_ratio_per_token": round(ours["step_s_per_response_token"] / peer["step_s_per_response_token"], 3),
            "startup_ratio": round(ours["startup_s"] / peer["startup_s"], 3),
            "memory_ratio": round(ours["peak_rss_mb"] / peer["peak_rss_mb"], 3),
            "ours": ours,
            "peer": peer,
        },
        "steps": steps,
        "warmup_steps": measure.WARMUP,
        "repeats": repeats,
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # 1-minute load at the start and the end
        "workload_equal": not differences,
        "workload_differences": differences,
        "workload": ours_workload,
        "curves": curves,
    }


def real_model_missing() -> str | None:
    """Why the real model's comparison cannot run here (None: it can)."""
    if REAL_MODEL_STEPS <= 0:
        return "ENTROPYRL_PEER_REAL_STEPS=0"
    from entropyrl.conf import compose
    from entropyrl.core.errors import UserError
    from entropyrl.models.gguf import gguf_path

    try:
        gguf_path(compose("train", REAL_MODEL_OVERRIDES).model)
    except UserError as exc:
        return str(exc)
    return None


def run() -> dict:
    """The toy workload (``data=toy``, keys at the top level) and, where its package is installed,
    the real model's study step (``real_model``)."""
    if not available():
        return {"skipped": f"no peer venv at {peer_python()}: `make bench-peers` installs TRL there"}
    result = {**compare(OVERRIDES, THREADS, STEPS, REPEATS), "same_batch": same_batch(OVERRIDES, THREADS)}
    missing = real_model_missing()
    if missing:
        result["real_model"] = {"skipped": missing}
    else:
        real = compare(REAL_MODEL_OVERRIDES, REAL_MODEL_THREADS, REAL_MODEL_STEPS, REAL_MODEL_REPEATS)
        result["real_model"] = {**real, "same_batch": same_batch(REAL_MODEL_OVERRIDES, REAL_MODEL_THREADS)}
    return result


def _ratio_table(block: dict) -> list[str]:
    trl, ours, peer = block["trl"], block["trl"]["ours"], block["trl"]["peer"]
    return [
        "| figure | entropyrl | TRL | ratio |",
        "| --- | --- | --- | --- |",
        f"| seconds per step, min | {ours['step_s_min']} | {peer['step_s_min']} | {trl['step_ratio_min']} |",
        f"| seconds per step, median | {ours['step_s_median']} | {peer['step_s_median']} | {trl['step_ratio']} |",
        f"| seconds per step, seen from outside | {ours['step_s_outside']} | {peer['step_s_outside']} | "
        f"{trl['step_ratio_outside']} |",
        *(
            [
                f"| mean response length (tokens) | {ours['response_tokens_mean']} | {peer['response_tokens_mean']} | |",
                f"| seconds per step per response token | {ours['step_s_per_response_token']} | "
                f"{peer['step_s_per_response_token']} | {trl['step_ratio_per_token']} |",
            ]
            if "step_ratio_per_token" in trl
            else []
        ),
        f"| launch to first step (s) | {ours['startup_s']} | {peer['startup_s']} | {trl['startup_ratio']} |",
        f"| peak resident memory (MB) | {ours['peak_rss_mb']} | {peer['peak_rss_mb']} | {trl['memory_ratio']} |",
        "",
        "Workload, as each side reports the settings it trained with: "
        + ("equal field by field." if block["workload_equal"] else "**not equal**: " + "; ".join(block["workload_differences"])),
    ]


def _runs_line(block: dict) -> str:
    return (
        f"{block['steps']} steps a run, {block['repeats']} run(s) of each taking turns (each figure: the median over a "
        f"side's runs), the first {block['warmup_steps']} steps of a run left out of its step times; load average "
        f"{block['load_avg'][0]} at the start, {block['load_avg'][1]} at the end (on {os.cpu_count()} CPUs: above that, "
        "the figures are upper bounds)."
    )


def _same_batch_line(block: dict) -> list[str]:
    return ["", batch_check.describe(block["same_batch"])] if block.get("same_batch") else []


def _curves(curves: dict) -> list[str]:
    """Each step's mean reward of both sides, and their mean response lengths where measured."""
    names = ["ours", "trl", *(k for k in ("ours_length", "trl_length") if k in curves)]
    heads = {"ours": "entropyrl", "trl": "TRL", "ours_length": "entropyrl tokens", "trl_length": "TRL tokens"}
    lines = ["| step | " + " | ".join(heads[k] for k in names) + " |", "|" + " --- |" * (len(names) + 1)]
    for i in range(max(len(curves[k]) for k in names)):
        cells = [str(curves[k][i]) if i < len(curves[k]) else "" for k in names]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return lines


def render(result: dict) -> str:
    """The peer section: the ratio table, the workload both sides trained with and the curves, for the
    toy workload and (when measured) the real model's."""
    lines = [
        f"Generated by `perf/peers.py` (`make bench-peers`): `entropyrl train data=toy` against TRL "
        f"{result['trl']['version']}'s `GRPOTrainer`, {_runs_line(result)} "
        "Ratios are ours over TRL's (below 1: ours is faster or lighter).",
        "",
        *_ratio_table(result),
        "",
        "| setting | value |",
        "| --- | --- |",
    ]
    lines += [f"| `{k}` | `{v}` |" for k, v in result["workload"].items() if k not in ("model_dir", "prompts_sha256")]
    lines += _same_batch_line(result)
    lines += ["", "Mean reward of each step's batch (and its mean response length):", "", *_curves(result["curves"])]
    real = result.get("real_model") or {"skipped": "not measured in this run"}
    lines += ["", "#### The real model (SmolLM2-135M-Instruct)", ""]
    if "skipped" in real:
        lines.append(f"Not measured: {real['skipped']}.")
    else:
        w = real["workload"]
        lines += [
            f"`entropyrl train {' '.join(REAL_MODEL_OVERRIDES[:1])}` (the real-model study's step: {w['prompts_per_step']} "
            f"prompts x {w['samples_per_prompt']} responses of up to {w['max_new_tokens']} tokens, lr {w['lr']}, "
            f"{w['updates_per_step']} update(s) a step, {w['threads']} torch threads a side) against the same TRL, "
            f"{_runs_line(real)} TRL scores the responses with our word-problem verifier, served from our venv "
            "(`perf/_peer_reward.py`).",
            "",
            *_ratio_table(real),
            *_same_batch_line(real),
            "",
            "Mean reward of each step's batch (and its mean response length):",
            "",
            *_curves(real["curves"]),
        ]
    return "\n".join(lines) + "\n"


def write_section(result: dict, page: Path = PAGE) -> None:
    """Replace the peer section of ``page`` with ``render(result)`` (``perf/report.py``'s writer,
    this suite's markers); ``perf/run.py`` records the result and its section together."""
    _sibling("report").write_suite(page, "peers", render(result))


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
