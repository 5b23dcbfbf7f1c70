"""Policy objectives: the per-token surrogate a micro-batch loss starts from (docs/algorithms.md §3b).

``algo.objective`` names one of ``POLICY_OBJECTIVES``; ``ppo_clip`` (the default) is
``core_algos.clipped_surrogate`` itself, so the default path is unchanged. The others are the
sequence-level and soft objectives of 2025, cross-checked against verl's ``core_algos.py``
(volcengine/verl b178a3cd, ``compute_policy_loss_{gspo,geo_mean,cispo,sapo}``):

- ``gspo``  (Zheng et al. 2025, 2507.18071): one importance ratio per response,
  ``s_i = exp(mean_t (logp - old_logp))``, clipped PPO-style; the token's gradient is ``s_i`` times
  its own log-prob gradient (``s_i,t = sg[s_i] * pi / sg[pi]``).
- ``gmpo``  (Zhao et al. 2025, 2507.20673): the geometric mean of token ratios, each log-ratio
  clipped to ``[-eps_low, eps_high]`` on the side the advantage's sign pushes, times the
  response's mean advantage; one loss per response.
- ``cispo`` (MiniMax-M1, 2506.13585): REINFORCE on ``logp`` with a detached, clipped IS weight
  ``sg[clip(rho, 1 - eps_low, 1 + eps_high)]``: no token loses its gradient.
- ``sapo``  (Gao et al. 2025, 2511.20347): a soft gate ``4/tau * sigmoid(tau (rho - 1))`` instead of
  the hard clip, ``tau_pos`` for positive and ``tau_neg`` for other advantages.

Every objective returns ``core_algos.SurrogateOutput`` (per-token ``[B, T]`` pieces) so the
aggregation, the interventions and the diagnostics see the same fields, with ``metrics``: what the
objective itself did on this micro-batch (GSPO's share of responses clipped, CISPO's clipped IS
weights, SAPO's gate...), so that a run shows the switch acted. They are the objective's own keys,
``<name>/...``, declared with ``register_objective(..., logged_metrics=...)`` (``OBJECTIVE_METRICS``);
the facade logs them beside ``clip/*`` and ``loss/*``. A response-level loss
(GMPO) is written on each of the response's tokens: with ``seq-mean-token-mean`` (the presets) it
aggregates to the mean over responses, as verl's ``torch.mean(pg_losses)``.
"""

from __future__ import annotations

import inspect

import torch

from ...core.errors import UserError
from ...core.registry import Registry
from .core_algos import LOG_RATIO_CLAMP, SurrogateOutput, clipped_surrogate
from .lab_claim import LabClaim, Lever

__all__ = [
    "POLICY_OBJECTIVES",
    "register_objective",
    "OBJECTIVE_LAB_CLAIMS",
    "OBJECTIVE_METRICS",
    "policy_objective",
    "check_objective_args",
    "gspo_objective",
    "gmpo_objective",
    "cispo_objective",
    "sapo_objective",
]

GSPO_LOG_RATIO_MAX = 10.0  # verl clamps the sequence log-ratio at 10 before exp
GMPO_EPS = 1e-8  # verl's length floor in the geometric mean

# name -> fn(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_c, **args) -> SurrogateOutput
POLICY_OBJECTIVES: Registry = Registry("algo.objective")
# name -> what its paper claims about entropy, as the lab measures it (trainers/algos/lab_claim.py)
OBJECTIVE_LAB_CLAIMS: dict[str, LabClaim] = {}
# name -> the metric keys its SurrogateOutput.metrics holds (what the objective itself did)
OBJECTIVE_METRICS: dict[str, tuple[str, ...]] = {}
# name -> the algo.clip.* keys the objective does not read (an intervention that re-clips may still read them)
OBJECTIVE_UNREAD: dict[str, tuple[str, ...]] = {}


def register_objective(
    name: str, lab_claim: LabClaim | None = None, logged_metrics: tuple[str, ...] = (), unread: tuple[str, ...] = ()
):
    """Register ``fn(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_c, **args)``, with
    its paper's entropy claim for the lab (``lab_claim``, optional), the keys of the metrics it
    returns in ``SurrogateOutput.metrics`` (``logged_metrics``; tests/trainers/test_method_metrics.py
    checks every method logs one of its own) and the ``algo.clip.*`` keys it does not read
    (``unread``: said, not silently ignored; tests/trainers/test_accepted_keys.py checks both ways)."""

    def deco(fn):
        POLICY_OBJECTIVES[name] = fn
        if lab_claim is not None:
            OBJECTIVE_LAB_CLAIMS[name] = lab_claim
        OBJECTIVE_METRICS[name] = tuple(logged_metrics)
        OBJECTIVE_UNREAD[name] = tuple(unread)
        return fn

    return deco


def _valid_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x [B, T]`` over the valid tokens of ``mask`` (0 when there are none), detached."""
    m = mask.to(torch.float64)
    return ((x.detach().to(torch.float64) * m).sum() / m.sum().clamp(min=1.0)).to(torch.float32)


def _row_mean(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean of ``x [B]`` over the responses where ``rows [B]`` (bool) holds (0 when none), detached."""
    r = rows.to(torch.float64)
    return ((x.detach().to(torch.float64) * r).sum() / r.sum().clamp(min=1.0)).to(torch.float32)


def _extra_args(fn) -> dict[str, object]:
    """The objective's own keyword parameters (beyond the clip) and their defaults."""
    sig = inspect.signature(fn)
    skip = {"logp", "old_logp", "advantages", "mask", "eps_low", "eps_high", "dual_c"}
    return {k: p.default for k, p in sig.parameters.items() if k not in skip}


def check_objective_args(name: str, args: dict) -> dict:
    """Validate ``algo.objective`` / ``algo.objective_args``; returns the args as floats."""
    fn = POLICY_OBJECTIVES.lookup(name)
    valid = _extra_args(fn)
    unknown = sorted(set(args) - set(valid))
    if unknown:
        raise UserError(
            f"unknown key(s) {', '.join(f'algo.objective_args.{k}' for k in unknown)} for objective "
            f"'{name}'; valid keys: {', '.join(valid) or '(none)'}"
        )
    out = {}
    for k, v in args.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v) > 0:
            raise UserError(f"algo.objective_args.{k} must be a number > 0, got {v!r}")
        out[k] = float(v)
    return out


def policy_objective(
    name: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_c: float | None,
    **args,
) -> SurrogateOutput:
    """The per-token surrogate of objective ``name``; all tensors ``[B, T]``."""
    return POLICY_OBJECTIVES.lookup(name)(
        logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high, dual_c=dual_c, **args
    )


# the PPO clip's own quantities are the clip shares the facade logs for every objective (clip/ratio_frac,
# clip/dual_frac): it is the baseline the other objectives' keys are told apart from
@register_objective("ppo_clip", logged_metrics=("clip/ratio_frac", "clip/dual_frac"))
def _ppo_clip(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_c):
    return clipped_surrogate(logp, old_logp, advantages, eps_low=eps_low, eps_high=eps_high, dual_c=dual_c)


@register_objective(
    "gspo",
    LabClaim("none", "its claim is on the sampler/trainer mismatch (vLLM), which the lab's hf rollout does not have"),
    logged_metrics=("gspo/seq_clip_frac", "gspo/seq_ratio_mean"),
    unread=("clip.dual_c",),
)
def gspo_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_c: float | None = None,
) -> SurrogateOutput:
    """GSPO: ``L = max(-A s, -A clip(s, 1 - eps_low, 1 + eps_high))`` with the response ratio
    ``s_i = exp(min(mean_valid(logp - old_logp), 10))``; each token's gradient is
    ``s_i * d logp_t`` (the sequence ratio detached, the token's own log-prob live). No dual clip.
    ``[B, T] -> SurrogateOutput [B, T]``.

    As the paper's GSPO-token (its eq. for ``s_i,t``) with one advantage per response; the clamp of the
    sequence log-ratio at 10 is verl's, not the paper's (it only bounds a ratio the clip already cuts).
    Metrics: ``gspo/seq_clip_frac``, the share of responses whose ``s_i`` left ``[1 - eps_low, 1 +
    eps_high]`` on the side its mean advantage pushes (the clip the paper defines, taken per response),
    and ``gspo/seq_ratio_mean``, the mean ``s_i`` over responses."""
    m = mask.to(logp.dtype)
    n = m.sum(-1).clamp(min=1.0)
    seq_log = (((logp - old_logp) * m).sum(-1) / n).detach()
    log_s = torch.clamp(logp - logp.detach() + seq_log.unsqueeze(-1), max=GSPO_LOG_RATIO_MAX)
    s = torch.exp(log_s)
    l1 = -advantages * s
    l2 = -advantages * torch.clamp(s, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(l1, l2)
    clipped = l2 > l1
    with torch.no_grad():
        rows = m.sum(-1) > 0
        s_seq = torch.exp(torch.clamp(seq_log, max=GSPO_LOG_RATIO_MAX))
        adv_seq = (advantages.detach() * m).sum(-1) / n
        cut = ((adv_seq > 0) & (s_seq > 1.0 + eps_high)) | ((adv_seq < 0) & (s_seq < 1.0 - eps_low))
        metrics = {"gspo/seq_clip_frac": _row_mean(cut.to(logp.dtype), rows), "gspo/seq_ratio_mean": _row_mean(s_seq, rows)}
    return SurrogateOutput(loss, clipped, s, l1, loss, clipped, torch.zeros_like(clipped), metrics)


@register_objective(
    "gmpo",
    LabClaim(
        "above_grpo",
        "GMPO's geometric mean keeps entropy higher than GRPO's arithmetic mean",
        levers=(Lever("clip/frac", "log-ratios clipped", "frac"),),
    ),
    logged_metrics=("gmpo/clip_frac", "gmpo/log_ratio_mean", "gmpo/seq_ratio_mean"),
    unread=("clip.dual_c",),
)
def gmpo_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_c: float | None = None,
) -> SurrogateOutput:
    """GMPO: per response ``L_i = -mean_valid(A) * exp(mean_valid(sgn(A) min(sgn(A) d, sgn(A) clip(d, -eps_low,
    eps_high))))`` with ``d = logp - old_logp``; ``L_i`` is written on every token of response ``i``.
    ``clipped``: the token's log-ratio was cut (the clipped side of the min). ``[B, T] -> SurrogateOutput``.

    The paper's clip range ``(e^-eps_low, e^eps_high)`` on the token ratio is this clip of the log-ratio
    (its runs: 0.4 on both sides); ``GMPO_EPS`` in the length is verl's. Metrics: ``gmpo/clip_frac``,
    the share of valid tokens whose log-ratio was cut; ``gmpo/log_ratio_mean``, the mean token
    log-ratio ``d`` before the clip; ``gmpo/seq_ratio_mean``, the mean geometric-mean ratio over responses."""
    m = mask.to(logp.dtype)
    d = logp - old_logp
    sgn = torch.sign(advantages)
    d_clip = torch.clamp(d, -eps_low, eps_high)
    d_min = sgn * torch.minimum(sgn * d, sgn * d_clip)
    n = m.sum(-1)
    ratio_seq = torch.exp((d_min * m).sum(-1) / (n + GMPO_EPS))
    adv_seq = (advantages * m).sum(-1) / (n + GMPO_EPS)
    loss = (-adv_seq * ratio_seq).unsqueeze(-1).expand_as(logp)
    clipped = (sgn * d_clip < sgn * d) & mask.bool()
    ratio = torch.exp(torch.clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    with torch.no_grad():
        metrics = {
            "gmpo/clip_frac": _valid_mean(clipped.to(logp.dtype), mask),
            "gmpo/log_ratio_mean": _valid_mean(d, mask),
            "gmpo/seq_ratio_mean": _row_mean(ratio_seq, n > 0),
        }
    return SurrogateOutput(loss, clipped, ratio, loss, loss, clipped, torch.zeros_like(clipped), metrics)


@register_objective(
    "cispo",
    LabClaim("none", "its claims are on training efficiency"),
    logged_metrics=("cispo/is_clip_frac", "cispo/is_weight_mean"),
    unread=("clip.dual_c",),
)
def cispo_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_c: float | None = None,
) -> SurrogateOutput:
    """CISPO: ``L = -sg[clip(rho, 1 - eps_low, 1 + eps_high)] * A * logp``. ``clipped`` marks tokens whose
    weight was clipped (their gradient is kept, only its weight bounded). ``[B, T] -> SurrogateOutput``.

    The paper's objective (MiniMax-M1, eq. for J_CISPO) with its token mask left out (all ones, as
    in its runs); it leaves the lower bound off (the preset's ``clip.low: 1.0``) and normalises by the
    batch's tokens (the preset's ``token-mean``). Metrics: ``cispo/is_clip_frac``, the share of valid
    tokens whose IS weight was clipped; ``cispo/is_weight_mean``, the mean clipped weight."""
    ratio = torch.exp(torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    w = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()
    loss = -w * advantages * logp
    clipped = ratio.detach() != w
    with torch.no_grad():
        metrics = {"cispo/is_clip_frac": _valid_mean(clipped.to(logp.dtype), mask), "cispo/is_weight_mean": _valid_mean(w, mask)}
    return SurrogateOutput(loss, clipped, ratio, loss, loss, clipped, torch.zeros_like(clipped), metrics)


@register_objective(
    "sapo",
    LabClaim("none", "its claims are on training stability and accuracy"),
    logged_metrics=("sapo/gate_mean", "sapo/gate_min"),
    unread=("clip.low", "clip.high", "clip.dual_c"),
)
def sapo_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.0,
    eps_high: float = 0.0,
    dual_c: float | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> SurrogateOutput:
    """SAPO: ``L = -A * 4/tau * sigmoid(tau (rho - 1))``, ``tau = tau_pos`` where ``A > 0`` else ``tau_neg``
    (the clip range is not used: the gate decays smoothly instead). ``[B, T] -> SurrogateOutput``.

    The paper's token-level soft gate (its eq. for ``f(r)``), as verl writes it. The gradient of
    ``f`` at ``rho`` is ``rho * 4 sigmoid(tau (rho - 1)) (1 - sigmoid(...))`` times ``d logp``: the
    soft gate ``g = 4 sigmoid (1 - sigmoid)`` is 1 on policy and decays as ``rho`` leaves 1, where
    the hard clip would cut. Metrics: ``sapo/gate_mean`` and ``sapo/gate_min``, ``g`` over the valid
    tokens (1 = the gate did not attenuate anything)."""
    ratio = torch.exp(torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = -gate * advantages
    none = torch.zeros_like(mask, dtype=torch.bool)
    with torch.no_grad():
        sig = torch.sigmoid(tau * (ratio - 1.0))
        g = 4.0 * sig * (1.0 - sig)
        valid = mask.bool()
        g_min = g[valid].min() if bool(valid.any()) else torch.ones((), dtype=g.dtype, device=g.device)
        metrics = {"sapo/gate_mean": _valid_mean(g, mask), "sapo/gate_min": g_min.detach()}
    return SurrogateOutput(loss, none, ratio, loss, loss, none, none, metrics)
