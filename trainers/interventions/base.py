"""The intervention interface and registry (docs/algorithms.md §5).

An entropy intervention is a small stateful object that the ``Algorithm`` facade drives at three
moments of a training step:

1. ``begin_step(sampling_entropy)``: once per step, before any update, with the batch-mean entropy
   of the sampling policy (closed-loop controllers: STARE's gate, adaptive entropy coefficient).
2. ``select(batch)``: token selection on a whole step batch or mini-batch, when the intervention's
   ``scope`` is ``"batch"`` or ``"mini"`` (``Algorithm.select``), or on the mini-batch of every
   rank together when it is ``"global"`` (the rows of all ranks gathered, the same selection
   computed on each, this rank's rows kept: N ranks select what one process selects). The returned
   per-token tensors go into the step batch's ``selections``, are sliced with it and come back in
   ``ctx.extras``.
3. ``apply(ctx)``: in every micro-batch loss, edits the ``LossContext``: multiplies token weights
   (``ctx.scale``), replaces the per-token policy loss, narrows the aggregation mask or adds a
   scalar term. With ``scope == "micro"`` the selection happens here, on the micro-batch.
   ``apply`` reads and edits only the context: the loss has no side effects. State that must move
   per loss (Clip-Cov's draw counter) moves in ``after_loss``, which the loop calls.

Adding an intervention is one module in this package (imported automatically) with a
``@register_intervention("name")`` class and a ``Params`` dataclass that declares its parameters'
names and types (and ``validate``), plus one ``conf/intervention/<name>.yaml`` with their
published defaults, each commented (``entropyrl.conf`` mounts it at ``algo.<name>``). Parameters
are read from ``algo.<name>``: a missing key takes the YAML's value, an unknown key is rejected
with the valid ones, the types are checked here and the ranges by ``Params.validate`` only (the
one place an intervention's ranges live; ``core/validation.py`` does not list them). (From outside the package, a ``Params`` with default values stored in Hydra's
ConfigStore group ``intervention`` stands in for the YAML; see tests/trainers/test_extensions.py.)
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ...conf import intervention_defaults
from ...core.errors import UserError
from ...core.registry import Registry, unknown_choice
from ..algos.lab_claim import LabClaim

__all__ = [
    "Intervention",
    "LossContext",
    "TokenBatch",
    "INTERVENTIONS",
    "register_intervention",
    "build_intervention",
    "intervention_params",
    "SCOPES",
    "finding",
]

# micro: each micro-batch (the published reference codes); mini / batch: this rank's mini-batch /
# step batch; global: the mini-batch of all ranks (the selection does not depend on the rank count).
SCOPES = ("micro", "mini", "batch", "global")
#: The scope of an intervention whose ``Params`` declares none (a per-token or per-response rule that
#: selects nothing across rows): the loop runs it where the published codes do, on each micro-batch.
UNSCOPED = SCOPES[0]


@dataclass
class TokenBatch:
    """Detached per-token statistics of a batch, all ``[b, T]`` (what ``select`` sees);
    ``sampler_logp``: the behaviour log-probs the rollout reported (``StepBatch.sampler_logp``), None
    where the trained model sampled (or at scope global, whose gather leaves them out)."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    entropy: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    sampler_logp: torch.Tensor | None = None


@dataclass
class LossContext:
    """What a micro-batch loss is being built from; interventions edit it in order.

    Tensors are ``[b, T]``. ``logp`` carries gradient; ``entropy`` carries gradient only when the
    algorithm ``needs_entropy_grad``. ``surrogate`` holds the clipped-surrogate pieces
    (``core_algos.SurrogateOutput``), ``pg_loss`` the per-token policy loss the aggregation will see.
    ``sampling_entropy`` and ``sampler_logp`` are the step batch's named fields (``StepBatch.entropy``,
    ``.sampler_logp``): the sampling policy's entropy, computed before the step, and the log-probs
    the rollout engine reported; None when the caller has none (a direct ``loss`` call, the ``hf``
    engine). ``extras`` holds the selections that ``Algorithm.select`` made on the whole batch or a
    mini-batch (``StepBatch.selections``, keys ``"<intervention>/..."``).
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    entropy: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    surrogate: Any
    pg_loss: torch.Tensor
    clipped: torch.Tensor
    pg_mask: torch.Tensor
    eps_low: float  # the configured clip (interventions that re-clip read it)
    eps_high: float
    dual_c: float | None
    dual_clipped: torch.Tensor | None = None  # bool [b, T]: the dual clip bound was taken (None: never)
    loss_agg: str = "token-mean"  # the configured aggregation (entropy terms follow it)
    loss_agg_norm: float | None = None
    weights: torch.Tensor | None = None  # token weights omega (detached); None means 1
    extra_terms: dict[str, torch.Tensor] = field(default_factory=dict)  # scalars added to the loss
    metrics: dict[str, float] = field(default_factory=dict)
    # bool [b, T]: the tokens an intervention truncated or masked, under the name of the metric that
    # counts them (tis: "rollout/tis_clip_frac"); the loop splits them by entropy quartile beside the
    # loss (stats/update_tokens.py)
    token_masks: dict[str, torch.Tensor] = field(default_factory=dict)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # selections (Algorithm.select)
    sampling_entropy: torch.Tensor | None = None  # [b, T] the sampling policy's entropy (no grad)
    sampler_logp: torch.Tensor | None = None  # [b, T] the rollout engine's log-probs (vLLM)
    ref_logp: torch.Tensor | None = None  # the reference policy (when Algorithm.needs_ref)
    surrogate_fn: Any = None  # (logp, old_logp, advantages, mask) -> SurrogateOutput

    def scale(self, w: torch.Tensor) -> None:
        """Multiply the token weights by ``w [b, T]`` (detached: weights never carry gradient)."""
        w = w.detach().to(self.pg_loss.dtype)
        self.weights = w if self.weights is None else self.weights * w

    def set_advantages(self, advantages: torch.Tensor) -> None:
        """Replace the token advantages ``[b, T]`` (detached) and rebuild the policy loss from the
        configured objective: for interventions that shape advantages, listed before the others."""
        self.advantages = advantages.detach().to(self.pg_loss.dtype)
        if self.surrogate_fn is None:
            raise RuntimeError("LossContext.set_advantages needs surrogate_fn (Algorithm.loss sets it)")
        surr = self.surrogate_fn(self.logp, self.old_logp, self.advantages, self.mask)
        self.surrogate, self.pg_loss, self.clipped, self.dual_clipped = surr, surr.loss, surr.clipped, surr.dual_clipped

    def batch(self) -> TokenBatch:
        """Detached view for selection rules; the current ``pg_mask`` defines valid tokens, so an
        earlier mask in the intervention list narrows the pool of a later selection."""
        return TokenBatch(
            self.logp.detach(),
            self.old_logp.detach(),
            self.entropy.detach(),
            self.advantages.detach(),
            self.pg_mask,
            None if self.sampler_logp is None else self.sampler_logp.detach(),
        )


def finding(id_: str, message: str, first_step: int | None) -> dict:
    """A regime finding as ``summary.json`` stores it (``trainers/run/regime.py``)."""
    return {"id": id_, "message": message, "first_step": first_step}


class Intervention:
    """Base class. Subclasses set ``name`` (via the decorator) and a ``Params`` dataclass."""

    name: ClassVar[str] = ""
    needs_entropy_grad: ClassVar[bool] = False
    #: A config path outside ``algo`` (e.g. ``"rollout.tis"``) whose ``enabled: true`` adds this
    #: intervention after the listed ones, with the section's other keys as its parameters.
    switched_on_by: ClassVar[str | None] = None
    needs_ref: bool = False  # the loss reads ctx.ref_logp (the loop loads the reference)
    #: The metrics it logs each step it runs (what it selected, its weights or coefficient), under
    #: stable names (docs/algorithms.md §5); the end-to-end tests check every one appears.
    logged_metrics: ClassVar[tuple[str, ...]] = ()
    #: The logged metric whose mean over steps says how often (a 0/1 gate) or on how much (a token
    #: share) it acted, for the sweep report's "acted" column; None means the first of ``logged_metrics``.
    acted_metric: ClassVar[str | None] = None
    #: The parameter that is its entropy set point in nats (STARE's ``h_tgt``), drawn on ``curves.png``; None: none.
    target_param: ClassVar[str | None] = None
    #: What its paper claims about entropy, in the form the lab measures, with the metrics it acts
    #: through (``trainers/algos/lab_claim.py``); None: the lab has no claim row for it.
    lab_claim: ClassVar[LabClaim | None] = None

    @classmethod
    def acted_key(cls) -> str | None:
        """The metric the reports read as "how often it acted" (``acted_metric`` or the first logged one)."""
        return cls.acted_metric or (cls.logged_metrics[0] if cls.logged_metrics else None)

    @dataclass
    class Params:
        pass

    def __init__(self, params: Intervention.Params, *, seed: int = 0, max_response_length: int | None = None):
        self.params = params
        self.seed = seed
        self.max_response_length = max_response_length
        self.scope: str = getattr(params, "scope", UNSCOPED)  # checked by intervention_params

    def vocab_stats(self) -> dict:
        """``{key: (name, params)}``: full-distribution statistics (``stats/vocab_stats.py``) this
        intervention reads from ``ctx.extras[key]``; default none (the loop computes nothing more)."""
        return {}

    def sampling_vocab_stats(self) -> dict:
        """``{key: (name, params)}`` this intervention needs on the step's *whole* batch under the
        sampling policy, before any update (``observe_sampling``); default none. Asked every step, so
        an intervention asks only while it needs them (SIREN: until its anchor is set)."""
        return {}

    @classmethod
    def regime_warnings(cls, series, params: dict) -> list[dict]:
        """Why this intervention could not act in a finished run, read from the run's metric rows:
        ``series(key)`` is ``[(step, value)]`` of a logged metric (finite values only), ``params`` its
        ``algo.<name>`` section as a plain dict. Returns ``finding``s; default none. Pure."""
        return []

    # -- step-level control ----------------------------------------------------------------
    def observe_sampling(self, stats: dict[str, torch.Tensor], mask: torch.Tensor, reduce=None) -> None:
        """Once per training step where ``sampling_vocab_stats`` asked: ``stats[key]`` ``[B, T]`` over
        this rank's rows of the step batch (sampling policy), ``mask`` ``[B, T]``; ``reduce(tensor)``
        sums over ranks (None on one process). Default: nothing."""

    def begin_step(self, sampling_entropy: float) -> None:
        """Once per training step, before any update. Default: stateless."""

    def step_metrics(self) -> dict[str, float]:
        return {}

    def after_loss(self) -> None:
        """Once after each micro-batch loss the loop computed: advance per-loss state (a random
        draw counter). ``apply`` itself must not change the intervention. Default: nothing."""

    def record(self, ctx: LossContext) -> None:
        """Once after each micro-batch loss the loop computed (not its pairing passes), with that
        loss's context: accumulate what a controller reads at the next ``begin_step``. Default: nothing."""

    def reduce_step(self, reduce) -> None:
        """At the end of a step under data parallelism (``Algorithm.end_step``): ``reduce(tensor) -> tensor`` sums over
        ranks (``distributed.sum_across``), for a controller whose ``scope`` is global. Default: nothing."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    # -- selection (scope) -----------------------------------------------------------------
    def select(self, batch: TokenBatch) -> dict[str, torch.Tensor]:
        """Per-token selection tensors ``{f"{name}/...": [b, T]}``; default: none."""
        return {}

    def selection(self, ctx: LossContext) -> dict[str, torch.Tensor]:
        """The selection for this micro-batch: computed now (scope micro) or taken from the
        selections ``Algorithm.select`` made at the mini/batch level, sliced with the batch."""
        if self.scope == "micro":
            return self.select(ctx.batch())
        sel = {k: v for k, v in ctx.extras.items() if k.startswith(f"{self.name}/")}
        if not sel:
            raise RuntimeError(
                f"{self.name}: scope '{self.scope}' needs the selections of Algorithm.select(batch, "
                f"'{self.scope}') (or prepare) passed to the loss, found keys {sorted(ctx.extras)}"
            )
        return {k: v.to(ctx.pg_loss.device) for k, v in sel.items()}

    # -- the loss --------------------------------------------------------------------------
    def apply(self, ctx: LossContext) -> None:
        raise NotImplementedError


INTERVENTIONS: Registry = Registry("intervention")


def register_intervention(name: str):
    """Class decorator: register an ``Intervention`` subclass under ``name`` (its config key)."""

    def deco(cls: type[Intervention]) -> type[Intervention]:
        if name in INTERVENTIONS and INTERVENTIONS[name] is not cls:
            raise ValueError(f"intervention '{name}' is already registered by {INTERVENTIONS[name].__module__}")
        cls.name = name
        INTERVENTIONS[name] = cls
        return cls

    return deco


_KINDS = (bool, int, float, str)


def _kind(params_cls: type, f: dataclasses.Field) -> type | None:
    """The plain type (bool/int/float/str) a ``Params`` field declares, or None (not checked)."""
    try:
        hint = typing.get_type_hints(params_cls).get(f.name, f.type)
    except Exception:  # an annotation that does not resolve: fall back to the default's type
        hint = f.type
    if hint in _KINDS:
        return hint
    if f.default is not dataclasses.MISSING and type(f.default) in _KINDS:
        return type(f.default)
    return None


def _coerce(name: str, key: str, value: Any, kind: type | None) -> Any:
    """Check a config value against its field's declared type (bool/int/float/str)."""
    where = f"algo.{name}.{key}"
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where} must be true or false, got {value!r}")
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"{where} must be a number, got {value!r}")
        return float(value) if kind is float else value
    if kind is str and not isinstance(value, str):
        raise UserError(f"{where} must be a string, got {value!r}")
    return value


def intervention_params(name: str, section: dict | None):
    """The checked ``Params`` of intervention ``name`` from its config section ``algo.<name>``:
    keys it leaves out take the published defaults (``conf/intervention/<name>.yaml`` or its
    ConfigStore node, else the ``Params`` field defaults); None means all defaults. Types are
    checked here, ranges by ``Params.validate``; a bad value raises ``UserError``."""
    cls = INTERVENTIONS.get(name)
    if cls is None:
        raise UserError(unknown_choice("intervention", name, INTERVENTIONS))
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    section = dict(section or {})
    values = {**(intervention_defaults(name) or {}), **section}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise UserError(
            f"unknown key(s) {', '.join(f'algo.{name}.{k}' for k in unknown)}; valid keys: {', '.join(fields) or '(none)'}"
        )
    missing = [
        k
        for k, f in fields.items()
        if k not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise UserError(
            f"algo.{name} has no value for {', '.join(missing)}: give them in "
            f"conf/intervention/{name}.yaml (or algo.{name}.{missing[0]}=...)"
        )
    kwargs = {k: _coerce(name, k, v, _kind(cls.Params, fields[k])) for k, v in values.items()}
    params = cls.Params(**kwargs)
    check = getattr(params, "validate", None)
    if check is not None:
        check(name)
    scope = getattr(params, "scope", UNSCOPED)
    if scope not in SCOPES:
        raise UserError(unknown_choice(f"algo.{name}.scope", scope, SCOPES))
    return params


def build_intervention(name: str, section: dict | None, *, seed: int = 0, max_response_length: int | None = None) -> Intervention:
    """Instantiate intervention ``name`` from its config section ``algo.<name>`` (see
    ``intervention_params``)."""
    params = intervention_params(name, section)
    return INTERVENTIONS[name](params, seed=seed, max_response_length=max_response_length)
