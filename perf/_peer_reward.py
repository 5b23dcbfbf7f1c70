"""Our verifier as a reward service for TRL's side of ``make bench-peers``, when the workload's task is
graded by more than the standard library (the real model's word problems: the math grader, math-verify
in worker processes).

Run with the product venv's interpreter by ``perf/_peer_trl.py`` (the peer venv has TRL, not our
dependencies)::

    .venv/bin/python perf/_peer_reward.py '<overrides as JSON>'

It composes ``entropyrl train`` with the overrides our side trained with, builds the run's prompt
source and reward runner as our trainer does (``trainers/components.py``), and answers each line
``{"problems": [[task, prompt, answer, params], ...], "responses": [...], "group": [...]}`` on stdin
with one line ``{"rewards": [...]}``: the totals ``RewardRunner.score`` gives our trainer for the same
responses. An empty line or the end of stdin ends it.
"""

from __future__ import annotations

import json
import sys


def serve(overrides: list[str], lines, write) -> int:
    """Answer every request of ``lines`` through ``write`` (one JSON line each); the count answered."""
    from entropyrl.conf import compose
    from entropyrl.rewards import build_reward_runner
    from entropyrl.tasks.problem import Problem
    from entropyrl.trainers.data.prompts_source import build_prompt_source

    cfg = compose("train", overrides)
    source = build_prompt_source(cfg.data, int(cfg.trainer.seed))
    runner = build_reward_runner(cfg.get("reward"), source, log=lambda *a: print(*a, file=sys.stderr))
    answered = 0
    try:
        for line in lines:
            if not line.strip():
                break
            request = json.loads(line)
            problems = [Problem(t, p, a, tuple(q)) for t, p, a, q in request["problems"]]
            prompts = [p.prompt for p in problems]
            scored = runner.score(problems, prompts, list(request["responses"]), list(request["group"]))
            write(json.dumps({"rewards": [float(s) for s in scored.total]}) + "\n")
            answered += 1
    finally:
        runner.close()
    return answered


def main(argv: list[str]) -> int:
    answers, sys.stdout = sys.stdout, sys.stderr  # stdout carries the answers only: anything printed goes to stderr

    def write(text: str) -> None:
        answers.write(text)
        answers.flush()

    serve(json.loads(argv[0]), sys.stdin, write)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
