"""Attention of new tokens over a detached KV cache plus themselves, with a hand-written backward.

The link-and-question training forward (:mod:`training.train_forward`) runs ~75 new tokens an example (link
tokens, question, answer) on top of ~1,500 cached document tokens that take no gradient. Autograd over torch
ops (:func:`training.fast_attention.train_attention`) spent more of a packed bfloat16 step in the elementwise
passes over the ~4M scores a layer - casts between bfloat16 and float32, the mask, the softmax and its backward,
the concatenation of the cached and new scores - than in all of the model's GEMMs (torch profiler,
``docs/bench/train-forward-2026-12-06/profile_step.py``). Here one :class:`torch.autograd.Function` holds the
keys and values of cache and new tokens in one preallocated buffer per layer (the cached part written once per
step, the new part each forward), and per example (no padding: the examples' new tokens are packed rows,
:class:`RaggedLayout`; and one example's ~2 MB of scores stay in cache across its passes) computes the scores with
one batched GEMM over its KV heads, the masked softmax in place (the
C++ kernel ``masked_softmax_bf16_`` on CPUs with AVX512-BF16: one read and one write of each score; torch ops
elsewhere), and in backward forms only the gradients that exist: queries, new keys, new values.

Rounding is that of :func:`~training.fast_attention.train_attention` with ``matmul_dtype`` bfloat16: scores and
probabilities rounded to bfloat16 (the softmax itself in float32), products accumulated in float32 by oneDNN.
In float32 (``matmul_dtype`` float32 or float64) it is exact attention; the tests compare both with SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        buf, want = self._flat.get(key), torch.device(device)
        same_device = buf is not None and buf.device.type == want.type and want.index in (None, buf.device.index)
        if not same_device or buf.numel() < n or buf.dtype != dtype:  # "cuda" is cuda:0's buffer too
            buf = self._flat[key] = torch.empty(n, dtype=dtype, device=device)
        return buf[:n].view(shape)


@dataclass(frozen=True)
class RaggedLayout:
    """Examples packed without padding: example ``i``'s new tokens are rows ``starts[i] .. starts[i] + new[i]`` of
    the packed rows, and its buffers hold ``cached[i]`` tokens before them.

    Attributes:
        new, cached: per example, new and cached token counts.
        masks: per example the additive float32 mask ``[new_i, cached_i + new_i]`` (contiguous).
    """

    new: tuple[int, ...]
    cached: tuple[int, ...]
    masks: tuple[torch.Tensor, ...]

    @property
    def starts(self) -> list[int]:
        """Each example's first row."""
        return [sum(self.new[:i]) for i in range(len(self.new))]

    def kv_size(self, kv_heads: int, head_dim: int) -> int:
        """Elements of one layer's key (or value) buffer: every example's ``[kv_heads, cached_i + new_i, head_dim]``
        one after another."""
        return sum(kv_heads * (c + n) * head_dim for c, n in zip(self.cached, self.new))

    def kv_views(self, flat: torch.Tensor, kv_heads: int, head_dim: int) -> list[torch.Tensor]:
        """Per example the contiguous ``[kv_heads, cached_i + new_i, head_dim]`` view of a layer's ``flat`` buffer
        (contiguous, so a batched GEMM reads it, transposed or not, without a copy)."""
        views, at = [], 0
        for c, n in zip(self.cached, self.new):
            size = kv_heads * (c + n) * head_dim
            views.append(flat[at: at + size].view(kv_heads, c + n, head_dim))
            at += size
        return views


class CachedAttention(torch.autograd.Function):
    """``attention(q, [cache; new keys], [cache; new values])`` per example, grouped-query heads, additive masks.

    ``apply(q, k_new, v_new, k_all, v_all, layout, scale, workspace, key)``:

    Args:
        q: queries ``[T, heads, head_dim]`` (RoPE applied; the examples' rows packed, :class:`RaggedLayout`).
        k_new, v_new: the new tokens' keys and values ``[T, kv_heads, head_dim]``.
        k_all, v_all: one layer's flat buffers (:meth:`RaggedLayout.kv_views`: example ``i``'s ``[kv_heads,
            cached_i + new_i, head_dim]``) in the matmul dtype, each example's cache in its first ``cached_i`` rows
            (filled by the caller, no gradient); its new tokens are written here after them.
        layout: the examples' rows, cache lengths and masks.
        scale: the softmax scale (``head_dim ** -0.5`` for these families).
        workspace, key: where the probabilities live (:class:`Workspace`, buffer ``("probs", key)``; None: fresh).
    Returns:
        ``[T, heads, head_dim]`` in ``q``'s dtype; gradients for ``q``, ``k_new``, ``v_new`` only.
    """

    @staticmethod
    def forward(ctx, q, k_new, v_new, k_all, v_all, layout, scale, workspace=None, key=None):
        h, d = q.shape[1], q.shape[2]
        kv, dt = k_new.shape[1], k_all.dtype
        g = h // kv
        ks, vs = layout.kv_views(k_all, kv, d), layout.kv_views(v_all, kv, d)
        qs = (q * scale).to(dt)  # [T, heads, head_dim]
        sizes = [kv * g * n * (c + n) for n, c in zip(layout.new, layout.cached)]
        p_all = _buffer(workspace, ("probs", key), (sum(sizes),), dt, q.device)
        out = torch.empty(q.shape, dtype=dt, device=q.device)
        at = 0
        for i, (r0, n, c) in enumerate(zip(layout.starts, layout.new, layout.cached)):
            length, rows = c + n, slice(r0, r0 + n)
            ks[i][:, c:] = k_new[rows].transpose(0, 1)
            vs[i][:, c:] = v_new[rows].transpose(0, 1)
            qg = qs[rows].transpose(0, 1).reshape(kv, g * n, d)  # the query heads of one KV head as one matrix
            p = p_all[at: at + sizes[i]].view(kv, g * n, length)
            at += sizes[i]
            torch.bmm(qg, ks[i].transpose(1, 2), out=p)  # p: [kv, g * n, L]
            masked_softmax_(p.view(1, h, n, length), layout.masks[i].view(1, n, length), h)
            out[rows] = torch.bmm(p, vs[i]).view(h, n, d).transpose(0, 1)
        ctx.save_for_backward(qs, k_all, v_all, p_all)
        ctx.layout, ctx.scale, ctx.workspace, ctx.kv = layout, scale, workspace, kv
        ctx.in_dtype, ctx.new_dtype = q.dtype, k_new.dtype
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        qs, k_all, v_all, p_all = ctx.saved_tensors
        layout, (h, d), kv = ctx.layout, qs.shape[1:], ctx.kv
        g = h // kv
        ks, vs = layout.kv_views(k_all, kv, d), layout.kv_views(v_all, kv, d)
        go_all = grad_out.to(k_all.dtype)  # [T, heads, head_dim]
        grad_q = torch.empty_like(go_all)
        grad_k = torch.empty(qs.shape[0], kv, d, dtype=go_all.dtype, device=go_all.device)
        grad_v = torch.empty_like(grad_k)
        at = 0
        for i, (r0, n, c) in enumerate(zip(layout.starts, layout.new, layout.cached)):
            length, rows = c + n, slice(r0, r0 + n)
            go = go_all[rows].transpose(0, 1).reshape(kv, g * n, d)
            qg = qs[rows].transpose(0, 1).reshape(kv, g * n, d)
            p = p_all[at: at + kv * g * n * length].view(kv, g * n, length)
            at += p.numel()
            grad_v[rows] = torch.bmm(p[..., c:].transpose(1, 2), go).transpose(0, 1)  # [n, kv, head_dim]
            gp = _buffer(ctx.workspace, "grad", (kv, g * n, length), p.dtype, p.device)
            gs = softmax_backward_(torch.bmm(go, vs[i].transpose(1, 2), out=gp), p)
            grad_q[rows] = torch.bmm(gs, ks[i]).view(h, n, d).transpose(0, 1)
            grad_k[rows] = torch.bmm(gs[..., c:].transpose(1, 2), qg).transpose(0, 1)
        grad_q = grad_q.to(ctx.in_dtype) * ctx.scale
        return grad_q, grad_k.to(ctx.new_dtype), grad_v.to(ctx.new_dtype), None, None, None, None, None, None


def _buffer(workspace: Workspace | None, key: object, shape, dtype, device) -> torch.Tensor:
    if workspace is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return workspace.get(key, tuple(shape), dtype, device)


def cached_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_all: torch.Tensor,
                     v_all: torch.Tensor, layout: RaggedLayout, scale: float, workspace: Workspace | None = None,
                     key: object = None) -> torch.Tensor:
    """:class:`CachedAttention` applied (arguments and result there); with a ``workspace``, the probabilities
    live in its buffer ``("probs", key)`` (one key per layer) and the scores' gradient in its ``"grad"``."""
    return CachedAttention.apply(q, k_new, v_new, k_all, v_all, layout, scale, workspace, key)
