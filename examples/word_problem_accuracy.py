"""A model's accuracy on the word-problem task (``data=word_problems``) at several difficulties, greedy
and sampled, through the package's own prompt source, engine and grader -- how the task's default
difficulty was chosen (where the model starts between 20 % and 70 %, so GRPO has groups with both
right and wrong answers to learn from).

    PYTHONPATH=.. python examples/word_problem_accuracy.py --difficulties 1 2 3 --problems 40
    python examples/word_problem_accuracy.py model=smollm2-135m --temperatures 0 1 --max-new-tokens 96

Trailing ``key=value`` arguments are ``entropyrl train`` overrides (default ``model=smollm2-135m``).
Prints one JSON line per (difficulty, temperature): accuracy, the share of responses cut at the
token cap, the mean response length, and the seconds it took.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--difficulties", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="entropyrl train overrides (model=..., data.prompt=...)")
    args = parser.parse_args()

    import torch

    from entropyrl.conf import compose
    from entropyrl.models.loading import load_policy
    from entropyrl.rollout.hf_engine import HFRollout
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    torch.set_num_threads(args.threads)
    overrides = args.overrides if any(o.startswith("model=") for o in args.overrides) else ["model=smollm2-135m", *args.overrides]
    cfg = compose("train", [*overrides, "data=word_problems"])
    model, tokenizer = load_policy(cfg.model, log=lambda *_: None)
    model.eval()
    engine = HFRollout({"batch_size": args.problems}, model, tokenizer)
    for difficulty in args.difficulties:
        cfg.data.difficulty = difficulty
        source = build_prompt_source(cfg.data, seed=0, tokenizer=tokenizer)
        problems = source.validation(args.problems)
        prompts = [source.prompt(p) for p in problems]
        for temperature in args.temperatures:
            started = time.perf_counter()
            out = engine.generate(prompts, n=1, seed=0, temperature=temperature, max_new_tokens=args.max_new_tokens)
            scores = source.rewards(problems, out.texts)
            row = {
                "difficulty": difficulty,
                "temperature": temperature,
                "problems": len(problems),
                "accuracy": round(sum(scores) / len(scores), 3),
                "truncated": round(sum(map(bool, out.truncated)) / len(scores), 3),
                "mean_response_tokens": round(float(out.response_mask.sum(1).float().mean()), 1),
                "seconds": round(time.perf_counter() - started, 1),
                "example": out.texts[0][:300],
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
