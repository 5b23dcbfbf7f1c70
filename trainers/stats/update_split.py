"""Split a step's parameter update into parts whose predictions ``g_H . delta_part`` add up to
``entropy_change/predicted_net`` (issue 21, item 2; docs/algorithms.md, "Entropy-change attribution").

For one AdamW step (torch's algorithm: decoupled decay, then the moment update) with gradient
``g_t`` after clipping, the change of a parameter is exactly

    delta = -lr wd theta                                      weight_decay
            - s b1 m_{t-1} / d                                momentum (carried from earlier steps)
            - s (1 - b1) c G_k / d      for each token group k (Q1-Q4, zero-advantage tokens)
            - s (1 - b1) c G_iv / d                           intervention
            - s (1 - b1) c (G - sum_k G_k - G_iv) / d         other (gradient not through logp/entropy)
            + (stored change - the sum above)                 float_rounding (float32 parameters)

with ``s = lr / (1 - b1^t)``, ``d = sqrt(v_t) / sqrt(1 - b2^t) + eps`` held at this step's value
(``v_t`` already holds ``g_t^2``), ``c`` the clip factor and ``G_k`` the gradient of the loss's
back-propagated signal restricted to group k's tokens: plain GRPO's signal (``-A rho`` on unclipped
tokens, the configured aggregation), while ``G_iv`` is what the configured loss's signal adds to it
(the interventions' weights, masks, extra terms and the KL term, all of them together). With ``d`` fixed the split is linear, so the
parts sum to ``delta``; ``float_rounding`` is what storing ``theta + delta`` in float32 (and the
optimizer's own float32 arithmetic) changed, about 1e-6 of the net on the tiny model. The prediction of each part is first-order in the same
way as ``predicted_net``. Plain SGD is the same with ``b1 = 0``, ``s = lr``, ``d = 1``.
Several optimizer steps in one training step add up part by part (``g_H`` is taken once, before).
"""

from __future__ import annotations

import torch

from ..algos.loss_agg import agg_loss
from .diagnostics import QUADRANTS, quadrant_ids

__all__ = ["GROUPS", "plain_grpo_upstream", "group_gradients", "UpdateSplit"]

GROUPS = (*QUADRANTS, "zero_adv")        # quadrant_ids 1-4, then 0 (A == 0 or not a valid token)


def plain_grpo_upstream(ctx, weight: float) -> torch.Tensor:
    """``[b, T]``: d(plain GRPO's loss on this micro-batch)/d logp, with the configured clip and
    aggregation but none of the interventions (their weights, masks, extra terms, KL).

    Plain GRPO's per-token gradient on ``logp`` is ``-A rho`` on unclipped tokens
    (``ctx.surrogate``, computed before the interventions), times the aggregation's factor.
    """
    with torch.no_grad():
        base = ctx.advantages * ctx.surrogate.ratio * (~ctx.surrogate.clipped).to(ctx.advantages.dtype)
    probe = torch.zeros_like(base, requires_grad=True)
    with torch.enable_grad():
        (factor,) = torch.autograd.grad(agg_loss(probe, ctx.mask, ctx.loss_agg, ctx.loss_agg_norm), probe)
    return -base * factor * weight


def _backward(outputs, upstream, params) -> list[torch.Tensor]:
    pairs = [(o, u) for o, u in zip(outputs, upstream) if u is not None and bool((u != 0).any())]
    if not pairs:
        return [torch.zeros_like(p) for p in params]
    grads = torch.autograd.grad([o for o, _ in pairs], params, grad_outputs=[u for _, u in pairs],
                                retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads)]


def group_gradients(loss: torch.Tensor, outputs: list[torch.Tensor], ids: torch.Tensor,
                    params: list[torch.Tensor], base: torch.Tensor | None = None) -> list[list[torch.Tensor]]:
    """Per token group (``GROUPS``), then the intervention, the parameter gradient of ``loss``.

    ``outputs``: ``[logp, entropy]`` (``[b, T]``) the loss was built from, still on the graph;
    ``ids``: ``[b, T]`` long, quadrant ids (0 = zero-advantage); ``base``: plain GRPO's upstream
    on logp (``plain_grpo_upstream``) or None (then the loss's whole signal is split by group and
    the intervention part is 0). By the chain rule the loss's gradient is the backward of its
    upstream ``dloss/doutputs``; the groups split ``base`` by token mask, the intervention is the
    upstream minus ``base``: linear, so the parts sum to the gradient. Graphs are retained.
    """
    outs = [o if o is not None and o.requires_grad else None for o in outputs]
    live = [o for o in outs if o is not None]
    got = iter(torch.autograd.grad(loss, live, retain_graph=True, allow_unused=True))
    upstream = [None if o is None else next(got) for o in outs]
    own = [torch.zeros_like(outputs[0]) if upstream[0] is None else upstream[0], *upstream[1:]]
    signal = [own[0] if base is None else base.to(own[0].dtype)] + [None if base is not None else u
                                                                   for u in own[1:]]
    result = []
    for k in (1, 2, 3, 4, 0):
        sel = (ids == k)
        masked = [None if u is None else u * sel.to(u.dtype) for u in signal]
        result.append(_backward(outs, masked, params))
    extra = [own[0] - signal[0], *[u if base is not None else None for u in own[1:]]]
    result.append(_backward(outs, extra, params))
    return result


class UpdateSplit:
    """Accumulates the parts of a training step's optimizer steps (a fresh one per measured step)."""

    def __init__(self, g_h: list[torch.Tensor], params: list[torch.Tensor]):
        self.g_h, self.params = g_h, params
        self.parts: dict[str, float] = {}
        self._groups: list[list[torch.Tensor]] | None = None

    def add_micro(self, loss: torch.Tensor, outputs: list[torch.Tensor], micro,
                  base: torch.Tensor | None = None) -> None:
        """Add one micro-batch's (weighted) loss, before its backward (``base``: see ``group_gradients``)."""
        with torch.no_grad():
            ids = quadrant_ids(micro.old_logp, micro.entropy, micro.advantages, micro.mask)
        grads = group_gradients(loss, outputs, ids, self.params, base)
        if self._groups is None:
            self._groups = grads
        else:
            for acc, new in zip(self._groups, grads):
                for a, n in zip(acc, new):
                    a.add_(n)

    def _dot(self, key: str, vectors) -> None:
        total = torch.zeros((), dtype=torch.float64)
        for g, v in zip(self.g_h, vectors):
            total += (g.double() * v).sum().cpu()
        self.parts[key] = self.parts.get(key, 0.0) + float(total)

    def before_step(self, optimizer, grad_norm_before: float) -> None:
        """After clipping, before ``optimizer.step()``: snapshot what the step reads."""
        ids = {id(p) for p in self.params}
        self._prev = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) in ids:
                    m = optimizer.state.get(p, {}).get("exp_avg")
                    self._prev[id(p)] = (p.detach().double().clone(), None if m is None else m.double().clone())
        norm_after = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in self.params if p.grad is not None)))
        self._clip = norm_after / grad_norm_before if grad_norm_before > 0 else 1.0

    def after_step(self, optimizer) -> None:
        """After ``optimizer.step()``: the step's parts, from this step's optimizer state."""
        groups = self._groups or [[torch.zeros_like(p) for p in self.params] for _ in (*GROUPS, "intervention")]
        index = {id(p): i for i, p in enumerate(self.params)}
        n = len(self.params)
        wd_part, mom_part = [torch.zeros(())] * n, [torch.zeros(())] * n
        scale = [torch.zeros(())] * n          # -s (1 - b1) c / d, per parameter
        for group in optimizer.param_groups:
            lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
            for p in group["params"]:
                if id(p) not in index:
                    continue
                i, (theta, m_prev) = index[id(p)], self._prev[id(p)]
                state = optimizer.state.get(p, {})
                if "exp_avg_sq" in state:      # AdamW
                    b1, b2 = group["betas"]
                    t = float(state["step"])
                    s = lr / (1 - b1 ** t)
                    d = state["exp_avg_sq"].double().sqrt() / (1 - b2 ** t) ** 0.5 + group["eps"]
                    wd_part[i] = -lr * wd * theta
                    mom_part[i] = torch.zeros_like(theta) if m_prev is None else -s * b1 * m_prev / d
                    scale[i] = -s * (1 - b1) * self._clip / d
                else:                          # plain SGD (no momentum)
                    wd_part[i] = -lr * wd * theta
                    mom_part[i] = torch.zeros_like(theta)
                    scale[i] = torch.full_like(theta, -lr * self._clip)
        self._dot("weight_decay", wd_part)
        self._dot("momentum", mom_part)
        total_grad = [torch.zeros_like(p, dtype=torch.float64) if p.grad is None else p.grad.double() / self._clip
                      for p in self.params]
        rest = [t.clone() for t in total_grad]
        for name, grads in zip((*GROUPS, "intervention"), groups):
            self._dot(name, [sc * g.double() for sc, g in zip(scale, grads)])
            for r, g in zip(rest, grads):
                r.sub_(g.double())
        self._dot("other", [sc * r for sc, r in zip(scale, rest)])
        applied = [p.detach().double() - self._prev[id(p)][0] for p in self.params]   # what was stored
        exact = [w + m + sc * g for w, m, sc, g in zip(wd_part, mom_part, scale, total_grad)]
        self._dot("float_rounding", [a - e for a, e in zip(applied, exact)])
        self._groups = None

    def metrics(self) -> dict[str, float]:
        return {f"attribution/{k}": v for k, v in self.parts.items()}
