"""Entropy interventions, one module each, registered by name (see ``base.py``).

Importing this package registers every built-in intervention; ``INTERVENTIONS`` maps the config
name (``algo.interventions: [stare, ...]``) to its class.
"""

from entropyrl.trainers.interventions import (  # noqa: F401
                                                   clip_cov,
                                                   entropy_bonus,
                                                   high_entropy_mask,
                                                   kl_cov,
                                                   none,
                                                   sample_reweight,
                                                   stare,
                                                   steer,
                                                   tis,
)
from entropyrl.trainers.interventions.base import (
                                                   INTERVENTIONS,
                                                   SCOPES,
                                                   Intervention,
                                                   LossContext,
                                                   TokenBatch,
                                                   build_intervention,
                                                   register_intervention,
)

__all__ = ["INTERVENTIONS", "SCOPES", "Intervention", "LossContext", "TokenBatch", "build_intervention",
           "register_intervention"]
