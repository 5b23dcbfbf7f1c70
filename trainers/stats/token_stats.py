"""Per-token log-probability and entropy (docs/algorithms.md §1).

Two entry points:

- ``logits_token_stats(logits, targets, temperature)``: from materialised logits (small vocabularies,
  tests, evaluation).
- ``chunked_token_stats(hidden, weight, targets, ...)``: from the last hidden states and the output
  projection, a chunk of tokens (and inside it a block of vocabulary rows) at a time, so the
  ``[N, V]`` logits never exist at once. At V = 151,936 and a few thousand tokens a full fp32
  logits tensor is gigabytes; here the peak extra memory is O(chunk x V) at most (O(chunk x
  vocab block) in practice). ``logp`` keeps its gradient through a custom autograd Function that
  recomputes each block's logits in backward instead of saving them. At Qwen2.5-0.5B's head size
  (512 tokens) it uses ~7% of the naive path's extra memory at equal or better speed
  (``perf/token_stats.py``).

Entropy uses ``H = logsumexp(z) - sum(softmax(z) * z)``: both terms are finite for any finite logits,
whereas ``-sum(p * log p)`` on a materialised softmax produces ``0 * -inf = nan`` where p underflows.
Statistics are taken on ``z / temperature``, the distribution that sampled.
"""

from __future__ import annotations

import torch

__all__ = ["logits_token_stats", "chunked_token_stats", "DEFAULT_VOCAB_CHUNK"]

# Vocabulary rows per block inside a token chunk; tuned on a 2-core CPU (perf/token_stats.py).
DEFAULT_VOCAB_CHUNK = 16384


def _check_temperature(temperature: float) -> float:
    temperature = float(temperature)
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return temperature


def logits_token_stats(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and entropy of the next-token distribution.

    Args:
        logits: ``[..., V]`` raw logits (any leading shape, e.g. ``[N, V]`` or ``[B, T, V]``).
        targets: ``[...]`` long, the sampled token ids.
        temperature: statistics are taken on ``logits / temperature``.

    Returns:
        ``(logp [...], entropy [...])``, both differentiable through ``logits``. Half/bfloat16
        logits are upcast to float32 (log-softmax over 150k entries loses too much in 8 bits of
        mantissa); float64 stays float64.
    """
    temperature = _check_temperature(temperature)
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1) - lse
    p = torch.softmax(z, dim=-1)
    entropy = lse - (p * z).sum(dim=-1)
    return logp, entropy


def _block_logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, v0: int, v1: int, temperature: float
) -> torch.Tensor:
    """``[c, v1 - v0]`` scaled logits of a block of tokens and vocabulary rows, float32 at least."""
    w = weight[v0:v1]
    z = torch.mm(h, w.t()) if bias is None else torch.addmm(bias[v0:v1], h, w.t())
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()
    if temperature != 1.0:
        z.div_(temperature)  # in place: no second buffer
    return z


class _ChunkedTokenStats(torch.autograd.Function):
    """``(logp [N], entropy [N], lse [N])`` from ``hidden [N, D]`` and ``weight [V, D]``, block by block.

    Tokens are processed ``chunk_size`` at a time and, inside a token chunk, the vocabulary
    ``vocab_chunk`` rows at a time, so a block of logits is at most ``chunk_size x vocab_chunk``.
    The log-normaliser and ``sum(p * z)`` are accumulated online across vocabulary blocks (running
    max, rescaled sums: the same trick as flash attention's softmax). Splitting the vocabulary as
    well as the tokens keeps the blocks cache-sized and reads the ``[V, D]`` weight once per token
    chunk instead of once per small token chunk, which is what makes this path as fast as the
    naive one on CPU.

    Forward keeps no ``[N, V]`` tensor: it saves the inputs plus the per-token log-normaliser and
    entropy and recomputes each block's logits in backward. With ``z`` the scaled logits and
    ``p = softmax(z)``:

        d logp / d z = onehot(target) - p
        d H    / d z = -p * (log p + H)

    and ``d z / d(h W^T + b) = 1 / temperature``. Backward builds a block's ``[c, v]`` gradient
    ``G`` in place in the recomputed logits buffer, then ``grad_h += G W_v``, ``grad_W_v += G^T h``.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, vocab_chunk, entropy_grad):
        n, vocab = hidden.shape[0], weight.shape[0]
        out_dtype = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
        dev = hidden.device
        logp = torch.empty(n, dtype=out_dtype, device=dev)
        entropy = torch.empty(n, dtype=out_dtype, device=dev)
        lse_all = torch.empty(n, dtype=out_dtype, device=dev)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            h, tgt = hidden[start:end], targets[start:end]
            c = end - start
            run_max = torch.full((c,), -float("inf"), dtype=out_dtype, device=dev)
            run_sum = torch.zeros(c, dtype=out_dtype, device=dev)  # sum exp(z - max)
            run_zsum = torch.zeros(c, dtype=out_dtype, device=dev)  # sum exp(z - max) * z
            z_tgt = torch.zeros(c, dtype=out_dtype, device=dev)
            for v0 in range(0, vocab, vocab_chunk):
                v1 = min(v0 + vocab_chunk, vocab)
                z = _block_logits(h, weight, bias, v0, v1, temperature)
                new_max = torch.maximum(run_max, z.amax(dim=1))
                rescale = torch.exp(run_max - new_max)
                e = (z - new_max.unsqueeze(1)).exp_()
                run_sum = run_sum * rescale + e.sum(dim=1)
                run_zsum = run_zsum * rescale + e.mul_(z).sum(dim=1)
                run_max = new_max
                hit = (tgt >= v0) & (tgt < v1)
                if bool(hit.any()):
                    rows = torch.nonzero(hit, as_tuple=True)[0]
                    z_tgt[rows] = z[rows, tgt[rows] - v0]
                del z, e
            lse = run_max + torch.log(run_sum)
            logp[start:end] = z_tgt - lse
            # H = lse - sum(softmax(z) * z), with sum(softmax(z) * z) = run_zsum / run_sum
            entropy[start:end] = lse - run_zsum / run_sum
            lse_all[start:end] = lse
        ctx.save_for_backward(hidden, weight, bias, targets, lse_all, entropy)
        ctx.temperature, ctx.chunk_size, ctx.vocab_chunk = temperature, chunk_size, vocab_chunk
        ctx.entropy_grad = entropy_grad
        ctx.mark_non_differentiable(lse_all)
        return logp, entropy, lse_all

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy, _grad_lse):
        hidden, weight, bias, targets, lse_all, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if not (need_h or need_w or need_b):
            return None, None, None, None, None, None, None, None
        use_h_grad = ctx.entropy_grad and grad_entropy is not None
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse_all)
        temperature, chunk, vchunk = ctx.temperature, ctx.chunk_size, ctx.vocab_chunk
        n, vocab = hidden.shape[0], weight.shape[0]
        grad_hidden = torch.zeros_like(hidden) if need_h else None
        grad_weight = torch.empty_like(weight) if need_w else None  # every row written by the first chunk
        grad_bias = torch.zeros_like(bias) if need_b else None
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            h, tgt = hidden[start:end], targets[start:end]
            lse = lse_all[start:end].unsqueeze(1)
            gl = (grad_logp[start:end] / temperature).unsqueeze(1)  # chain rule through z / temperature
            if use_h_grad:
                gh = (grad_entropy[start:end] / temperature).unsqueeze(1)
                ent = entropy[start:end].unsqueeze(1)
            for v0 in range(0, vocab, vchunk):
                v1 = min(v0 + vchunk, vocab)
                z = _block_logits(h, weight, bias, v0, v1, temperature)
                if use_h_grad:
                    z.sub_(lse)  # log p
                    p = torch.exp(z)
                    # G = -gl * p - gh * p * (log p + H)
                    g = p.mul_(z.add_(ent).mul_(gh).add_(gl)).neg_()
                    del z
                else:
                    g = z.sub_(lse).exp_().mul_(-gl)  # G = -gl * p, in the logits buffer
                hit = (tgt >= v0) & (tgt < v1)
                if bool(hit.any()):  # + gl on the sampled token
                    rows = torch.nonzero(hit, as_tuple=True)[0]
                    g[rows, tgt[rows] - v0] += gl[rows, 0]
                g = g.to(weight.dtype)
                if need_h:
                    grad_hidden[start:end].addmm_(g, weight[v0:v1])
                if need_w:
                    if start == 0:
                        torch.mm(g.t(), h, out=grad_weight[v0:v1])
                    else:
                        grad_weight[v0:v1].addmm_(g.t(), h)
                if need_b:
                    grad_bias[v0:v1] += g.sum(0)
                del g
        if need_w and n == 0:
            grad_weight.zero_()
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def chunked_token_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    entropy_grad: bool = False,
    vocab_chunk_size: int = DEFAULT_VOCAB_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and entropy from hidden states, ``chunk_size`` tokens at a time.

    Args:
        hidden: ``[N, D]`` last hidden states (flatten ``[B, T, D]`` first).
        weight: ``[V, D]`` output projection (``lm_head.weight``).
        targets: ``[N]`` long, the sampled token ids.
        bias: optional ``[V]`` output bias.
        temperature: statistics on ``(hidden @ weight.T + bias) / temperature``.
        chunk_size: tokens per chunk. Peak extra memory is about
            ``3 * chunk_size * min(V, vocab_chunk_size)`` floats, i.e. O(chunk_size x V) at most.
        entropy_grad: if False (default) the returned entropy is detached (token selection needs no
            gradient, and it saves nothing); if True it is differentiable too (entropy bonus).
        vocab_chunk_size: vocabulary rows per block inside a token chunk (a speed knob: blocks
            that fit in cache; it changes no result beyond float rounding).

    Returns:
        ``(logp [N], entropy [N])``: float32 for half/bfloat16 inputs, else the input dtype.
        ``logp`` is differentiable w.r.t. ``hidden``, ``weight`` and ``bias``.
    """
    temperature = _check_temperature(temperature)
    if chunk_size < 1 or vocab_chunk_size < 1:
        raise ValueError(f"chunk_size and vocab_chunk_size must be >= 1, got {chunk_size}, {vocab_chunk_size}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"expected hidden [N, D] and weight [V, D], got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [N]={tuple(hidden.shape[:1])}, got {tuple(targets.shape)}")
    targets = targets.long()
    logp, entropy, _ = _ChunkedTokenStats.apply(
        hidden, weight, bias, targets, temperature, int(chunk_size), int(vocab_chunk_size), bool(entropy_grad)
    )
    # Selection statistics need no gradient: hand out a detached entropy so nothing downstream can
    # backpropagate into it by accident.
    return logp, (entropy if entropy_grad else entropy.detach())
