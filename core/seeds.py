"""Every seed a run derives from ``trainer.seed``, in one place: each stream of randomness gets its
own, so that changing one (say, the number of generation attempts) moves no other. The constants are
distinct primes; a checkpoint resumes the same streams because each is a pure function of the run
seed and a counter the checkpoint keeps (the step, an intervention's draw count).
"""

from __future__ import annotations

__all__ = ["rollout_seed", "rank_seed", "group_seed", "shuffle_seed", "draw_seed", "PASS_SEED", "PROBE_SEED"]

PASS_SEED = 31_337  # validation's pass@k samples: the same draws at every validation of a run
PROBE_SEED = 424_242  # the held-out probe batch's sampling: independent of the training seed stream


def rollout_seed(seed: int, step: int, attempt: int) -> int:
    """The sampling seed of a training step's ``attempt``-th generation round (dynamic sampling)."""
    return int(seed) * 1_000_003 + int(step) * 101 + int(attempt)


def rank_seed(call_seed: int, rank: int) -> int:
    """One rank's generate call (``rollout.seed_scope=call``): the step's seed, offset per rank."""
    return int(call_seed) + int(rank) * 7_919_993


def group_seed(call_seed: int, index: int) -> int:
    """One prompt group's generate call (``rollout.seed_scope=group``): by its index among the step's
    prompts, so the responses do not depend on how many ranks share the step."""
    return int(call_seed) * 65_537 + int(index)


def shuffle_seed(seed: int, step: int) -> int:
    """The order of a training step's rows across its mini-batches (every PPO epoch)."""
    return int(seed) * 7919 + int(step)


def draw_seed(seed: int, calls: int) -> int:
    """A per-loss random draw (Clip-Cov's pick): the run seed and the number of losses so far."""
    return (int(seed) * 1_000_003 + int(calls)) % (2**63)
