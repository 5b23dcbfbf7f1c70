"""Entropy where reasoning turns, over a sweep's runs: per variant, how often the responses held a
reflection word and the token entropy (and surprisal) at the first token of those words (the
decision to turn), over all their tokens, at the token before them and over all tokens, from each run's ``metrics.jsonl`` (``reflection/*``, docs/long-cot.md). Prints a
markdown table; the numbers in docs/long-cot.md for the real model come from it.

    python examples/reflection_entropy.py SWEEP_DIR

Per step the trainer logs the mean over that step's reflection tokens (``reflection/entropy_at``,
nan when no response reflected); here each step with reflection tokens counts with its number of
reflection tokens (``reflection/token_frac`` x its valid tokens are not logged, so the weight is
the step's reflection words, ``reflection/count/mean`` x responses), and the all-token figure is
taken over the same steps so the two compare like with like.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(float(x))


def summarise(rows: list[dict], responses_per_step: int) -> dict:
    """Counts and word-weighted means over the steps whose responses held a reflection word."""
    steps = [r for r in rows if _finite(r.get("reflection/entropy_at"))]
    words = [float(r.get("reflection/count/mean", 0.0)) * responses_per_step for r in steps]
    total = sum(words)

    def mean(key: str) -> float:
        pairs = [(w, float(r[key])) for w, r in zip(words, steps) if _finite(r.get(key))]
        weight = sum(w for w, _ in pairs)
        return sum(w * v for w, v in pairs) / weight if weight else float("nan")

    return {
        "steps": len(rows),
        "steps_reflecting": len(steps),
        "words": total,
        "frac_mean": sum(float(r.get("reflection/frac", 0.0)) for r in rows) / max(len(rows), 1),
        **{
            k: mean(f"reflection/{k}")
            for k in (
                "entropy_first",
                "entropy_at",
                "entropy_before",
                "entropy_all",
                "surprisal_first",
                "surprisal_at",
                "surprisal_all",
            )
        },
    }


def _pooled(parts: list[dict], key: str) -> float:
    """``key`` over several runs, each weighted by its reflection words."""
    pairs = [(p["words"], p[key]) for p in parts if _finite(p[key]) and p["words"]]
    weight = sum(w for w, _ in pairs)
    return sum(w * v for w, v in pairs) / weight if weight else float("nan")


def main(sweep_dir: Path) -> None:
    runs = sorted((sweep_dir / "runs").glob("*/s*/metrics.jsonl"))
    by_variant: dict[str, list[dict]] = {}
    for path in runs:
        cfg = (path.parent / "config.yaml").read_text() if (path.parent / "config.yaml").exists() else ""
        n = _responses_per_step(cfg)
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        by_variant.setdefault(path.parent.parent.name, []).append(summarise(rows, n))
    print(
        "| variant | steps with a reflection word | words | share of responses "
        "| entropy first / at / before / all | surprisal first / at / all |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for variant, parts in by_variant.items():
        steps = sum(p["steps"] for p in parts)
        hit = sum(p["steps_reflecting"] for p in parts)
        words = sum(p["words"] for p in parts)

        frac = sum(p["frac_mean"] * p["steps"] for p in parts) / max(steps, 1)
        print(
            f"| `{variant}` | {hit} of {steps} | {words:.0f} | {frac:.3f} | "
            f"{_pooled(parts, 'entropy_first'):.2f} / {_pooled(parts, 'entropy_at'):.2f} / "
            f"{_pooled(parts, 'entropy_before'):.2f} / {_pooled(parts, 'entropy_all'):.2f} | "
            f"{_pooled(parts, 'surprisal_first'):.2f} / {_pooled(parts, 'surprisal_at'):.2f} / {_pooled(parts, 'surprisal_all'):.2f} |"
        )


def _responses_per_step(config_yaml: str) -> int:
    """``trainer.prompts_per_step x rollout.n`` from a run's resolved config.yaml."""
    import yaml

    cfg = yaml.safe_load(config_yaml) or {}
    return int(cfg.get("trainer", {}).get("prompts_per_step", 1)) * int(cfg.get("rollout", {}).get("n", 1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
