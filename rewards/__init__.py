"""Rewards from config: a registry of reward functions (user callables by reference, an HTTP
judge, the built-in verifiers) and the runner that scores a training batch with their weighted
sum, each under a time limit with a fallback for what fails (``runner.RewardRunner``).

Layer: between ``evals`` (whose graders the built-in entries call) and ``trainers`` (whose loop
scores its batches here).
"""

from .runner import RewardRunner, ScoredBatch, build_reward_runner, problem_fields, reward_metrics

__all__ = ["RewardRunner", "ScoredBatch", "build_reward_runner", "problem_fields", "reward_metrics"]
