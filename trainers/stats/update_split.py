"""Split a step's parameter update into parts whose predictions add up to the step's
(``attribution/<part>`` to ``entropy_change/predicted_net``, ``attribution_1st/<part>`` to
``predicted_net_1st``; docs/algorithms.md §6).

For one AdamW step (torch's algorithm: decoupled decay, then the moment update) with gradient
``g_t`` after clipping, the change of a parameter is exactly

    delta = -lr wd theta                                      weight_decay
            - s b1 m_{t-1} / d                                momentum (carried from earlier steps)
            - s (1 - b1) c G_k / d      for each token group k (q1-q4, zero_adv)
            - s (1 - b1) c G_j / d      for each intervention j (by its name), and kl
            - s (1 - b1) c (G - sum_k G_k - sum_j G_j) / d    other (gradient not through the token statistics)
            + (stored change - the sum above)                 float_rounding (float32 parameters)

with ``s = lr / (1 - b1^t)``, ``d = sqrt(v_t) / sqrt(1 - b2^t) + eps`` held at this step's value
(``v_t`` already holds ``g_t^2``) and ``c`` the clip factor. ``G_k`` is the gradient of the
configured objective's back-propagated signal (the clipped surrogate, or GSPO's ...; no
intervention, no KL) restricted to group k's tokens; ``G_j`` is what intervention j adds to the
signal given the interventions applied before it (``Algorithm.loss_prefixes``: the loss built up one
intervention at a time, so the differences telescope) and ``kl`` what the KL term adds. With ``d``
fixed the split is linear, so the parts sum to ``delta``; ``float_rounding`` is what storing
``theta + delta`` in float32 (and the optimizer's own float32 arithmetic) changed, about 1e-6 of the
net on the tiny model. Plain SGD is the same with ``b1 = 0``, ``s = lr``, ``d = 1``.

Each part's change ``delta_k`` over an optimizer step is predicted two ways, as the net is
(``attribution.py``): to first order, ``g_H(start) . delta_k`` (``attribution_1st/<part>``), and
with the trapezoid ``(g_H(start) + g_H(end))/2 . delta_k`` once ``g_H`` where that step ended is
known (``attribution/<part>``: the straight-path integral of the gradient, integrated gradients,
by a two-point rule). Several optimizer steps in one training step add up part by part, each from
``g_H`` at its own start and end (``end_segment``). The ``delta_k`` add up to the applied change, so
each set of parts adds up to its net. Memory: until ``g_H`` at its end is known, an optimizer step
keeps each part's gradient (float32, one copy of the trainable parameters per part; the changes of
the group and intervention parts are these times one shared factor) and five float64 copies (that
factor and the changes of weight decay, momentum, other and float rounding).
"""

from __future__ import annotations

import torch

from .diagnostics import QUADRANTS, quadrant_ids

__all__ = ["GROUPS", "group_gradients", "UpdateSplit"]

GROUPS = (*QUADRANTS, "zero_adv")  # quadrant_ids 1-4, then 0 (A == 0 or not a valid token)


def _upstream(loss: torch.Tensor, outs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """``dloss/doutput`` for each output on the graph (None for the others); graphs are retained."""
    live = [o for o in outs if o is not None]
    got = iter(torch.autograd.grad(loss, live, retain_graph=True, allow_unused=True))
    return [None if o is None else next(got) for o in outs]


def _backward(outputs, upstream, params) -> list[torch.Tensor]:
    pairs = [(o, u) for o, u in zip(outputs, upstream) if o is not None and u is not None and bool((u != 0).any())]
    if not pairs:
        return [torch.zeros_like(p) for p in params]
    grads = torch.autograd.grad(
        [o for o, _ in pairs], params, grad_outputs=[u for _, u in pairs], retain_graph=True, allow_unused=True
    )
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads)]


def _minus(a: list[torch.Tensor | None], b: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    return [None if x is None and y is None else (x if y is None else (-y if x is None else x - y)) for x, y in zip(a, b)]


def group_gradients(
    loss: torch.Tensor,
    outputs: list[torch.Tensor],
    ids: torch.Tensor,
    params: list[torch.Tensor],
    prefixes: list[tuple[str, torch.Tensor]] | None = None,
) -> list[tuple[str, list[torch.Tensor]]]:
    """The parameter gradient of ``loss`` split into named parts that add up to it.

    ``outputs``: ``[logp, entropy]`` (``[b, T]``) the loss was built from, still on the graph;
    ``ids``: ``[b, T]`` long, quadrant ids (0 = zero-advantage); ``prefixes``: the loss built up a term
    at a time (``Algorithm.loss_prefixes``: the objective alone, then one intervention more each).
    By the chain rule a loss's gradient is the backward of its upstream ``dloss/doutputs``, which is
    linear, so: the objective's upstream is split by token mask into the groups (``GROUPS``), each
    further prefix's upstream minus the one before is that intervention's part, and ``loss``'s minus
    the last prefix's is ``kl`` (the KL term; 0 without one). Without ``prefixes`` the whole loss is
    split by group. Graphs are retained.
    """
    outs = [o if o is not None and o.requires_grad else None for o in outputs]
    total = _upstream(loss, outs)
    base = total if not prefixes else _upstream(prefixes[0][1], outs)
    result = []
    for name, k in zip(GROUPS, (1, 2, 3, 4, 0)):
        sel = ids == k
        result.append((name, _backward(outs, [None if u is None else u * sel.to(u.dtype) for u in base], params)))
    if prefixes:
        previous = base
        for name, partial in prefixes[1:]:
            current = _upstream(partial, outs)
            result.append((name, _backward(outs, _minus(current, previous), params)))
            previous = current
        result.append(("kl", _backward(outs, _minus(total, previous), params)))
    return result


class UpdateSplit:
    """Accumulates the parts of a training step's optimizer steps (a fresh one per measured step):
    ``add_micro`` per micro-batch, ``before_step``/``after_step`` around each optimizer step, then
    ``end_segment`` with ``g_H`` where it ended."""

    def __init__(self, g_h: list[torch.Tensor], params: list[torch.Tensor]):
        self.g_h, self.params = g_h, params
        self.parts: dict[str, float] = {}  # part -> trapezoid prediction (attribution/<part>)
        self.parts_1st: dict[str, float] = {}  # part -> first-order prediction (attribution_1st/<part>)
        self._groups: dict[str, list[torch.Tensor]] = {}  # part -> this optimizer step's gradient
        # what the trapezoid needs of the last optimizer step: (scale, the parts' gradients, the other parts' changes)
        self._kept: tuple[list[torch.Tensor], dict[str, list[torch.Tensor]], dict[str, list[torch.Tensor]]] | None = None
        self._segment: dict[str, float] = {}  # part -> its first-order value in it

    def add_micro(
        self, loss: torch.Tensor, outputs: list[torch.Tensor], micro, prefixes: list[tuple[str, torch.Tensor]] | None = None
    ) -> None:
        """Add one micro-batch's (weighted) loss, before its backward (``prefixes``: see ``group_gradients``)."""
        with torch.no_grad():
            ids = quadrant_ids(micro.old_logp, micro.entropy, micro.advantages, micro.mask)
        for name, grads in group_gradients(loss, outputs, ids, self.params, prefixes):
            if name not in self._groups:
                self._groups[name] = grads
            else:
                for a, n in zip(self._groups[name], grads):
                    a.add_(n)

    def _add_first_order(self, key: str, value: float) -> None:
        """Part ``key``'s first-order prediction over this optimizer step, into the step's and the run's sums."""
        self.parts_1st[key] = self.parts_1st.get(key, 0.0) + value
        self._segment[key] = self._segment.get(key, 0.0) + value

    def end_segment(self, g_end: list[torch.Tensor]) -> None:
        """After an optimizer step, with ``g_H`` where it ended: the trapezoid prediction of each
        part's change over it is added to ``parts``, what was kept of the step is freed, and the
        next optimizer step's parts are predicted from ``g_end``."""
        at_end: dict[str, float] = {}
        if self._kept is not None:
            scale, groups, deltas = self._kept
            for i, g in enumerate(g_end):
                g = g.double()
                gs = g * scale[i]
                for name, grads in groups.items():
                    at_end[name] = at_end.get(name, 0.0) + float((gs * grads[i]).sum().cpu())
                for name, vectors in deltas.items():
                    at_end[name] = at_end.get(name, 0.0) + float((g * vectors[i]).sum().cpu())
        for key, first in self._segment.items():
            self.parts[key] = self.parts.get(key, 0.0) + 0.5 * (first + at_end.get(key, 0.0))
        self._kept, self._segment, self.g_h = None, {}, g_end

    def before_step(self, optimizer, grad_norm_before: float) -> None:
        """After clipping, before ``optimizer.step()``: snapshot what the step reads (in the
        parameters' own dtype: exact, at half the memory of a float64 copy)."""
        ids = {id(p) for p in self.params}
        self._prev = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) in ids:
                    m = optimizer.state.get(p, {}).get("exp_avg")
                    self._prev[id(p)] = (p.detach().clone(), None if m is None else m.detach().clone())
        norm_after = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in self.params if p.grad is not None)))
        self._clip = norm_after / grad_norm_before if grad_norm_before > 0 else 1.0

    def after_step(self, optimizer) -> None:
        """After ``optimizer.step()``: the step's parts, from this step's optimizer state.

        Worked out one parameter tensor at a time. Kept for the trapezoid at ``end_segment``: the
        per-parameter factor ``scale = -s (1 - b1) c / d`` (the group and intervention parts are
        ``scale * G_k``, so only their gradients, held anyway, are kept with it) and the four other
        parts' changes in float64; memory about ``(4 + 5 (float64)) x`` the trainable parameters
        beyond the parts' gradients, whatever the number of parts."""
        groups = self._groups or {g: [torch.zeros_like(p) for p in self.params] for g in GROUPS}
        settings = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                settings[id(p)] = group
        scale_kept: list[torch.Tensor] = []
        deltas: dict[str, list[torch.Tensor]] = {k: [] for k in ("weight_decay", "momentum", "other", "float_rounding")}
        first = dict.fromkeys([*deltas, *groups], 0.0)
        for i, p in enumerate(self.params):
            theta_f, m_f = self._prev.pop(id(p))
            theta, m_prev = theta_f.double(), None if m_f is None else m_f.double()
            del theta_f, m_f
            group = settings[id(p)]
            lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
            state = optimizer.state.get(p, {})
            if "exp_avg_sq" in state:  # AdamW
                b1, b2 = group["betas"]
                t = float(state["step"])
                s = lr / (1 - b1**t)
                d = state["exp_avg_sq"].double().sqrt() / (1 - b2**t) ** 0.5 + group["eps"]
                mom = torch.zeros_like(theta) if m_prev is None else -s * b1 * m_prev / d
                scale = -s * (1 - b1) * self._clip / d
                del d
            else:  # plain SGD (no momentum)
                mom = torch.zeros_like(theta)
                scale = torch.full_like(theta, -lr * self._clip)
            wd_part = -lr * wd * theta
            total_grad = torch.zeros_like(theta) if p.grad is None else p.grad.double() / self._clip
            rest = total_grad.clone()
            g_h = self.g_h[i].double()
            gs = g_h * scale
            for name, grads in groups.items():
                g = grads[i].double()
                first[name] += float((gs * g).sum().cpu())
                rest.sub_(g)
                del g
            other = scale * rest
            del rest
            applied = p.detach().double() - theta  # what was stored
            rounding = applied - (wd_part + mom + scale * total_grad)
            del applied, total_grad, theta
            for name, v in (("weight_decay", wd_part), ("momentum", mom), ("other", other), ("float_rounding", rounding)):
                first[name] += float((g_h * v).sum().cpu())
                deltas[name].append(v)
            scale_kept.append(scale)
            del g_h, gs
        for name, value in first.items():
            self._add_first_order(name, value)
        self._kept = (scale_kept, groups, deltas)
        self._groups = {}

    def metrics(self) -> dict[str, float]:
        return {
            **{f"attribution/{k}": v for k, v in self.parts.items()},
            **{f"attribution_1st/{k}": v for k, v in self.parts_1st.items()},
        }
