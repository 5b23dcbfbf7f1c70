"""Code benchmarks in the eval harness: prompts -> samples -> sandbox verdicts -> pass@k.

``evaluate_code`` is what ``runner.evaluate`` calls for a benchmark of ``CodeProblem`` items
(``humaneval``, ``mbpp``, ``livecodebench`` or a code file). Prompts: a base model (no chat
template) continues the HumanEval prompt itself (for MBPP/LiveCodeBench: the problem text then an
opened ```python fence); a chat model is asked for the whole function/program in a code block.
Each response's program runs in the sandbox (``evals/code/sandbox.py``) with the benchmark's limits
(``sandbox:`` in its YAML) overridden by ``eval.sandbox.*``; ``eval.sandbox.workers`` (else
``eval.workers``, else one per CPU) programs at once. Metrics per problem: ``avg@n`` and unbiased
``pass@k`` for k in 1, 5, 10 (<= n), averaged over problems.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from ...core.errors import UserError
from ..benchmarks import load_benchmark
from ..generation import sample_texts
from ..metrics import avg_at_n, mean_metrics, pass_at_k
from .code_tasks import CODE_BENCHMARKS, CodeProblem, code_user_message, grade_code, record, row_problem_id, rows_to_code_problems
from .sandbox import SandboxLimits, SandboxPool

__all__ = ["CODE_KS", "OPEN_FENCE", "code_problem_metrics", "code_prompt", "sandbox_for", "evaluate_code", "is_code_problem"]

CODE_KS = (1, 5, 10)
OPEN_FENCE = "```python\n"


def is_code_problem(item: Any) -> bool:
    return isinstance(item, CodeProblem)


def code_problem_metrics(passed: Sequence[bool]) -> dict[str, float]:
    """``{"avg@n", "pass@k" for k in CODE_KS if k <= n}`` for one problem's n verdicts."""
    n, c = len(passed), sum(bool(x) for x in passed)
    out = {f"avg@{n}": avg_at_n(passed)}
    out.update({f"pass@{k}": pass_at_k(n, c, k) for k in CODE_KS if k <= n})
    return out


def sandbox_for(bench_limits: Mapping | None, overrides: Mapping | None, workers: int | None = None) -> SandboxPool:
    """A pool with the benchmark's limits, ``overrides`` (non-null keys) on top."""
    merged = dict(bench_limits or {})
    merged.update({k: v for k, v in dict(overrides or {}).items() if v is not None})
    pool_workers = merged.pop("workers", None) or workers
    return SandboxPool(workers=pool_workers, limits=SandboxLimits.from_cfg(merged))


def code_prompt(problem: CodeProblem, tokenizer=None, chat: bool = False) -> tuple[str, bool]:
    """``(prompt, opened_fence)``; opened_fence: the prompt ends inside a ```python block, so the
    response is read with that opening fence in front of it."""
    if chat:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": code_user_message(problem)}], tokenize=False, add_generation_prompt=True
        ), False
    if problem.test:  # HumanEval layout: continue the function
        return problem.prompt, False
    return problem.prompt.rstrip() + "\n\n" + OPEN_FENCE, True


def _prompts(problems: Sequence[CodeProblem], tokenizer, chat: bool) -> tuple[list[str], list[bool]]:
    pairs = [code_prompt(p, tokenizer, chat) for p in problems]
    return [t for t, _ in pairs], [o for _, o in pairs]


def _fit_context(engine, prompts: list[str], max_new_tokens: int) -> tuple[list[str], int, str | None]:
    """``(prompts, response cap, what was cut or None)`` that fit a model with a short context (the
    embedded tiny model: 64 positions): the cap lowered to half the context and the end of each prompt
    kept, when a prompt and the cap overflow it. Real models' contexts make this a no-op; when it is
    not, the line says how many prompts lost their beginning and what the cap became."""
    model = getattr(engine, "model", None)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    tok = getattr(engine, "tokenizer", None)
    if not limit or tok is None:
        return prompts, max_new_tokens, None
    lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    if not any(n + int(max_new_tokens) > int(limit) for n in lengths):
        return prompts, int(max_new_tokens), None
    new = min(int(max_new_tokens), max(1, int(limit) // 2))
    budget = int(limit) - new - 2
    fitted = []
    for p, n in zip(prompts, lengths):
        if n > budget:
            p = p[-budget:]  # characters >= tokens: never longer than the budget
            while len(tok(p, add_special_tokens=False)["input_ids"]) > budget and p:
                p = p[len(p) // 8 + 1 :]
        fitted.append(p)
    cut = sum(n > budget for n in lengths)
    note = (
        f"the model's context ({limit} positions) does not hold a prompt and eval.max_new_tokens={max_new_tokens}: "
        f"responses capped at {new} tokens"
        + (f", {cut} of {len(prompts)} prompt(s) cut to their last {budget} tokens" if cut else "")
        + " (a model with a longer context evaluates them whole)"
    )
    return fitted, new, note


def evaluate_code(
    engine,
    tokenizer,
    bench: str,
    spec,
    problems: Sequence[CodeProblem],
    settings,
    *,
    chat: bool = False,
    progress: Callable[[str, str, int, int], None] | None = None,
) -> tuple[dict, list[dict]]:
    """``(result, samples)`` for one code benchmark; ``result`` in ``runner.evaluate``'s layout."""
    n = int(settings.n_samples or spec.n_samples)
    temperature = float(spec.temperature if settings.temperature is None else settings.temperature)
    top_p = float(spec.top_p if settings.top_p is None else settings.top_p)
    total = n * len(problems)

    def tick(phase: str):
        if progress is None:
            return None
        progress(bench, phase, 0, total)
        return lambda k: progress(bench, phase, k, total)

    pool = sandbox_for(spec.sandbox, settings.sandbox, settings.workers)
    prompts, opened = _prompts(problems, tokenizer, chat)
    prompts, max_new, cut = _fit_context(engine, prompts, settings.max_new_tokens)
    t0 = time.perf_counter()
    completions = sample_texts(
        engine,
        prompts,
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new,
        seed=settings.seed,
        progress=tick("generate"),
    )
    t1 = time.perf_counter()
    flat_problems = [p for p in problems for _ in range(n)]
    flat = [(OPEN_FENCE if opened[i] else "") + c for i, group in enumerate(completions) for c in group]
    graded = grade_code(flat_problems, flat, pool, mode="all", progress=tick("grade"))
    t2 = time.perf_counter()
    per_problem, samples = [], []
    for i, p in enumerate(problems):
        mine = graded[i * n : (i + 1) * n]
        per_problem.append(code_problem_metrics([r.passed for _, r in mine]))
        for j, (text, (program, r)) in enumerate(zip(completions[i], mine)):
            rec = record(program, r)
            rec["stdout_tail"] = rec["stdout_tail"][-500:]
            samples.append({"benchmark": bench, "problem_id": p.id, "sample": j, "response": text, **rec})
    reasons: dict[str, int] = {}
    for _, r in graded:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    result = {
        "n_samples": n,
        "problems": len(problems),
        "temperature": temperature,
        "top_p": top_p,
        "metrics": mean_metrics(per_problem),
        "kind": "code",
        "reasons": reasons,
        "seconds": {"generate": round(t1 - t0, 3), "grade": round(t2 - t1, 3)},
        "grader_timeouts": reasons.get("timeout", 0),
        "max_new_tokens": max_new,
        **({"warning": f"{bench}: {cut}"} if cut else {}),
    }
    return result, samples


def _find(problems: Sequence[CodeProblem], ident: Any, bench: str) -> CodeProblem:
    want = str(ident)
    for p in problems:
        if p.id == want or p.id.rsplit("/", 1)[-1] == want:  # "HumanEval/3" or 3
            return p
    raise UserError(f"{bench} has no problem with id '{want}' (ids look like '{problems[0].id}')")


def grade_code_rows(
    rows: Sequence[dict], pool: SandboxPool, mode: str = "all", data_root: str | None = None, progress=None
) -> list[dict | str]:
    """For each row (HumanEval/MBPP/LiveCodeBench layout, or ``benchmark`` + ``id``) with a
    ``response``: the ``record`` of its graded program, or a one-line problem (bad id...).
    ``progress(k)``: called as programs finish."""
    loaded: dict[str, list[CodeProblem]] = {}
    problems: list[CodeProblem | str] = []
    for row in rows:
        try:
            if (
                row.get("benchmark") is not None
                and row_problem_id(row) is not None
                and not (isinstance(row.get("test"), str) or "test_list" in row or "public_test_cases" in row)
            ):
                bench = str(row["benchmark"])
                if bench not in CODE_BENCHMARKS:
                    raise UserError(f"benchmark '{bench}' is not a code benchmark ({', '.join(CODE_BENCHMARKS)})")
                if bench not in loaded:
                    loaded[bench] = load_benchmark(bench, data_root)
                problems.append(_find(loaded[bench], row_problem_id(row), bench))
            else:
                problems.append(rows_to_code_problems([row])[0])
        except UserError as exc:
            problems.append(str(exc))
    ok = [i for i, p in enumerate(problems) if isinstance(p, CodeProblem)]
    graded = grade_code([problems[i] for i in ok], [rows[i]["response"] for i in ok], pool, mode, progress=progress)
    out: list[dict | str] = list(problems)  # the problem strings stay where they were
    for i, (program, result) in zip(ok, graded):
        out[i] = record(program, result)
    return out
