"""What watches a training step without changing it: the diagnostics that need the model, the
losses or the optimizer at fixed moments of the step. Each is built only when its diagnostic is on
(``build_observers``), so a step with every diagnostic off runs none of their code.

The moments, in the order the step reaches them (``trainers/trainer.py``)::

    begin_step(model, step)                 before the sampling policy's token statistics
    after_score(batch, metrics) -> metrics  the scored batch (mask, old_logp, entropy, sampler_logp,
                                            advantages filled), before the batch-scope selections;
                                            ``metrics``: the step's so far (collection's and the
                                            scoring's ``entropy``), read-only
    on_micro_loss(algo, micro, out, inputs) after each micro-batch loss, before its backward
                                            (``inputs``: the log-probs, entropies and vocabulary
                                            statistics the loss was built from; ``weight``: its
                                            accumulation weight)
    around_optimizer_step(model, optimizer, grad_norm)  a context around each ``optimizer.step()``
    end_step(model) -> metrics              after the update and the weight sync

- ``PredictionObserver``: the first-order entropy prediction of the step's losses
  (``diagnostics.quadrants``; ``stats/prediction.py``);
- ``ProbeObserver``: the realised entropy change of a fixed held-out probe batch
  (``diagnostics.entropy_change`` or ``diagnostics.attribution``; ``stats/probe.py``);
- ``AttributionObserver``: the network's own prediction of that change and its split into parts,
  on steps N, 2N, ... (``diagnostics.attribution``; ``stats/attribution.py``).

The observers of the scored batch alone, which only report metrics, are in ``stats/scored_metrics.py``.
"""

from __future__ import annotations

from contextlib import nullcontext

from ..algos.step_batch import StepBatch
from .attribution import EntropyAttribution
from .prediction import EntropyPrediction
from .probe import ProbeBatch

__all__ = ["StepObserver", "PredictionObserver", "ProbeObserver", "AttributionObserver", "build_observers"]


class StepObserver:
    """Base: every moment does nothing."""

    def begin_step(self, model, step: int) -> None:
        pass

    def after_score(self, batch: StepBatch, metrics: dict) -> dict[str, float]:
        return {}

    def on_micro_loss(self, algo, micro, out, inputs: tuple, weight: float) -> None:
        pass

    def around_optimizer_step(self, model, optimizer, grad_norm: float):
        return nullcontext()

    def end_step(self, model) -> dict[str, float]:
        return {}


class PredictionObserver(StepObserver):
    """Each micro-batch loss's first-order entropy prediction, effective and plain GRPO's (it reads
    the loss's graph: before the backward frees it)."""

    def __init__(self) -> None:
        self.prediction = EntropyPrediction()

    def begin_step(self, model, step: int) -> None:
        self.prediction = EntropyPrediction()

    def on_micro_loss(self, algo, micro, out, inputs: tuple, weight: float) -> None:
        self.prediction.add(out)

    def end_step(self, model) -> dict[str, float]:
        return self.prediction.metrics()


class ProbeObserver(StepObserver):
    """The probe batch's entropy before the step and after it."""

    def __init__(self, probe: ProbeBatch) -> None:
        self.probe = probe

    def begin_step(self, model, step: int) -> None:
        self.probe.before_update(model)

    def end_step(self, model) -> dict[str, float]:
        return self.probe.after_update(model)


class AttributionObserver(StepObserver):
    """On measured steps: ``g_H`` at the start, each micro-batch loss rebuilt one term at a time for
    the split (before ``after_loss`` advances the interventions' state, so the rebuilt losses select
    what this one did), each optimizer step bracketed, the net prediction and its parts at the end."""

    def __init__(self, attribution: EntropyAttribution) -> None:
        self.attribution = attribution
        self.measuring = False

    def begin_step(self, model, step: int) -> None:
        self.measuring = self.attribution.due(step)
        if self.measuring:
            self.attribution.begin(model)

    def on_micro_loss(self, algo, micro, out, inputs: tuple, weight: float) -> None:
        split = self.attribution.split if self.measuring else None  # None under FSDP
        if split is None:
            return
        logp, ent, vocab = inputs
        prefixes = algo.loss_prefixes(micro, logp=logp, entropy=ent, vocab=vocab)
        split.add_micro(
            out.loss * weight,
            [logp, ent, *(vocab.values() if vocab else ())],
            micro,
            [(name, partial * weight) for name, partial in prefixes],
        )

    def around_optimizer_step(self, model, optimizer, grad_norm: float):
        if not self.measuring:
            return nullcontext()
        return self.attribution.optimizer_step(model, optimizer, grad_norm)

    def end_step(self, model) -> dict[str, float]:
        return self.attribution.finish(model)


def build_observers(*, quadrants: bool, probe: ProbeBatch | None, attribution: EntropyAttribution | None) -> list[StepObserver]:
    """The observers switched on, in the order their metrics are reported: the prediction, the
    probe's realised change, the attribution."""
    out: list[StepObserver] = []
    if quadrants:
        out.append(PredictionObserver())
    if probe is not None:
        out.append(ProbeObserver(probe))
    if attribution is not None:
        out.append(AttributionObserver(attribution))
    return out
