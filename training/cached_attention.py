"""Attention of new tokens over a detached KV cache plus themselves, with a hand-written backward.

The link-and-question training forward (:mod:`training.train_forward`) runs ~75 new tokens an example (link
tokens, question, answer) on top of ~1,500 cached document tokens that take no gradient. Autograd over torch
ops (:func:`training.fast_attention.train_attention`) spent more of a packed bfloat16 step in the elementwise
passes over the ~4M scores a layer - casts between bfloat16 and float32, the mask, the softmax and its backward,
the concatenation of the cached and new scores - than in all of the model's GEMMs (torch profiler,
``docs/bench/train-forward-2026-12-06/profile_step.py``). Here one :class:`torch.autograd.Function` holds the
keys and values of cache and new tokens in one preallocated buffer per layer (the cached part written once per
step, the new part each forward), computes the scores with one batched GEMM, the masked softmax in place (the
C++ kernel ``masked_softmax_bf16_`` on CPUs with AVX512-BF16: one read and one write of each score; torch ops
elsewhere), and in backward forms only the gradients that exist: queries, new keys, new values.

Rounding is that of :func:`~training.fast_attention.train_attention` with ``matmul_dtype`` bfloat16: scores and
probabilities rounded to bfloat16 (the softmax itself in float32), products accumulated in float32 by oneDNN.
In float32 (``matmul_dtype`` float32 or float64) it is exact attention; the tests compare both with SDPA.
"""

from __future__ import annotations

import torch

from kvlink_rag.runtime.cpu_kernels import kernels


def _kernel(t: torch.Tensor):
    """The compiled softmax kernels where they apply to ``t`` (bfloat16 on a CPU with AVX512-BF16), else None."""
    ext = kernels() if t.device.type == "cpu" and t.dtype == torch.bfloat16 else None
    return ext if ext is not None and ext.train_softmax_available() else None


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # bfloat16 -> float32; float64 stays


def masked_softmax_(s: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """``softmax(s + mask)`` over the last dim, written into ``s`` (returned).

    Args:
        s: scores ``[B, heads, Q, L]`` contiguous (bfloat16: arithmetic in float32, result rounded once).
        mask: additive float32 ``[B or 1, Q, L]`` contiguous (0 allowed; <= -1e30 masked, probability 0).
        heads: the second dim of ``s`` (query heads).
    """
    ext = _kernel(s)
    if ext is not None:
        ext.masked_softmax_bf16_(s, mask, heads)
        return s
    x = s.to(_wide(s.dtype)) + mask[:, None]
    return s.copy_(torch.softmax(x, dim=-1))


def softmax_backward_(grad: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The gradient of the scores from that of the probabilities: ``p * (g - sum_j g_j p_j)`` per row, written
    into ``grad`` (returned); ``grad``, ``probs`` ``[..., L]`` contiguous, one dtype (bfloat16: float32 inside)."""
    ext = _kernel(grad)
    if ext is not None:
        ext.softmax_backward_bf16_(grad, probs)
        return grad
    g, p = grad.to(_wide(grad.dtype)), probs.to(_wide(grad.dtype))
    return grad.copy_(p * (g - (g * p).sum(-1, keepdim=True)))


class Workspace:
    """Grow-only buffers reused from step to step: per key (a layer's probabilities, kept until backward; the
    scores' gradient, one for all layers), so the ~8 MB a layer of a 4-example step is not a fresh allocation,
    page-faulted on first write, at every forward (~1 ms a GEMM of 2 on this CPU). A graph whose buffers a later
    forward has overwritten fails loudly in backward (the buffers' version counter), never silently.
    """

    def __init__(self):
        self._flat: dict[object, torch.Tensor] = {}

    def get(self, key: object, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        """A ``shape`` tensor of ``dtype`` (uninitialised) in the buffer named ``key``."""
        n = 1
        for dim in shape:
            n *= int(dim)
        buf = self._flat.get(key)
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != torch.device(device):
            buf = self._flat[key] = torch.empty(n, dtype=dtype, device=device)
        return buf[:n].view(shape)


class CachedAttention(torch.autograd.Function):
    """``attention(q, [cache; new keys], [cache; new values])`` with grouped-query heads and an additive mask.

    ``apply(q, k_new, v_new, k_all, v_all, mask, scale)``:

    Args:
        q: queries ``[B, heads, Q, head_dim]`` (RoPE applied), any float dtype.
        k_new, v_new: the new tokens' keys and values ``[B, kv_heads, Q, head_dim]``.
        k_all, v_all: buffers ``[B, kv_heads, N + Q, head_dim]`` in the matmul dtype: the cached part
            ``[:, :, :N]`` filled by the caller (no gradient), the last ``Q`` rows overwritten here with
            ``k_new`` / ``v_new``.
        mask: additive float32 ``[B or 1, Q, N + Q]``.
        scale: the softmax scale (``head_dim ** -0.5`` for these families).
        workspace, key: where the probabilities ``[B * kv_heads, g * Q, N + Q]`` live (:class:`Workspace`;
            None: fresh tensors).
    Returns:
        ``[B, heads, Q, head_dim]`` in ``q``'s dtype; gradients for ``q``, ``k_new``, ``v_new`` only.
    """

    @staticmethod
    def forward(ctx, q, k_new, v_new, k_all, v_all, mask, scale, workspace=None, key=None):
        b, h, nq, d = q.shape
        kv, length = k_all.shape[1], k_all.shape[2]
        dt, g = k_all.dtype, h // kv
        k_all[:, :, length - nq:] = k_new
        v_all[:, :, length - nq:] = v_new
        qg = (q * scale).to(dt).reshape(b, kv, g * nq, d)  # the query heads of one KV head as one matrix
        p = _buffer(workspace, ("probs", key), (b, kv, g * nq, length), dt, q.device)
        out = torch.empty(b, kv, g * nq, d, dtype=dt, device=q.device)
        for i in range(b):  # one example at a time: its ~2 MB of scores stay in cache across the three passes
            torch.bmm(qg[i], k_all[i].transpose(1, 2), out=p[i])  # p[i]: [kv, g * Q, L]
            masked_softmax_(p[i].view(1, h, nq, length), mask[i: i + 1] if mask.shape[0] > 1 else mask, h)
            torch.bmm(p[i], v_all[i], out=out[i])
        ctx.save_for_backward(qg, k_all, v_all, p)
        ctx.scale, ctx.in_dtype, ctx.new_dtype, ctx.workspace = scale, q.dtype, k_new.dtype, workspace
        return out.view(b, h, nq, d).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        qg, k_all, v_all, p = ctx.saved_tensors
        b, h, nq, d = grad_out.shape
        kv, length = k_all.shape[1], k_all.shape[2]
        new = slice(length - nq, length)
        go = grad_out.to(k_all.dtype).reshape(b, kv, -1, d)  # [B, kv, g * Q, head_dim]
        grad_q = torch.empty_like(go)
        grad_k = torch.empty(b, kv, nq, d, dtype=go.dtype, device=go.device)
        grad_v = torch.empty_like(grad_k)
        gp = _buffer(ctx.workspace, "grad", p.shape[1:], p.dtype, p.device)  # one example's, reused
        for i in range(b):
            torch.bmm(p[i][..., new].transpose(1, 2), go[i], out=grad_v[i])  # [kv, Q, head_dim]
            gs = softmax_backward_(torch.bmm(go[i], v_all[i].transpose(1, 2), out=gp), p[i])  # [kv, g * Q, L]
            torch.bmm(gs, k_all[i], out=grad_q[i])
            torch.bmm(gs[..., new].transpose(1, 2), qg[i], out=grad_k[i])
        grad_q = grad_q.view(b, h, nq, d).to(ctx.in_dtype) * ctx.scale
        return grad_q, grad_k.to(ctx.new_dtype), grad_v.to(ctx.new_dtype), None, None, None, None, None, None


def _buffer(workspace: Workspace | None, key: object, shape, dtype, device) -> torch.Tensor:
    if workspace is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return workspace.get(key, tuple(shape), dtype, device)


def cached_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_all: torch.Tensor,
                     v_all: torch.Tensor, mask: torch.Tensor, scale: float, workspace: Workspace | None = None,
                     key: object = None) -> torch.Tensor:
    """:class:`CachedAttention` applied (arguments and result there); with a ``workspace``, the probabilities
    live in its buffer ``("probs", key)`` (one key per layer) and the scores' gradient in its ``"grad"``."""
    return CachedAttention.apply(q, k_new, v_new, k_all, v_all, mask, scale, workspace, key)
