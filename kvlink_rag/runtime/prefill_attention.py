"""Attention of a prefill row (several query tokens) over bfloat16 KV pieces with the runner's C++ kernel.

torch's CPU SDPA runs bfloat16 prefill attention at ~60-140 GFLOP/s on this 2-core AVX512-BF16 CPU against
~400 for a GEMM of the same shape; at 4k keys that was most of a linked request's link-and-question forward
and of a full prefill (BENCHMARKS.md, issue 24). ``csrc/prefill_attention.cpp`` computes each query row's
scores as bfloat16 products accumulated in float32 (AVX512-BF16 ``vdpbf16ps``), the scale and additive mask,
an exact-maximum softmax in float32, the probabilities rounded to bfloat16 for ``P @ V`` (as flash attention's
kernels do) and the output rounded to bfloat16 once: 2.2-4.6x SDPA on these shapes, its error against a
float32 reference no larger than SDPA's own in bfloat16 (tests). Several pieces are read in place (no join);
a causal row skips the keys past its diagonal.

Where the kernel does not apply (no AVX512-BF16, KV not bfloat16, head_dim not 64, not the CPU, a mask of
another dtype) :func:`attend_prefill` returns None and the caller keeps SDPA.
``KVLINK_RAG_PREFILL_ATTENTION=sdpa`` keeps SDPA everywhere (to compare the two side by side).
"""

from __future__ import annotations

import functools
import os

import torch

from .cpu_kernels import kernels

Pieces = list[tuple[torch.Tensor, torch.Tensor]]
MASK_DTYPES = (torch.bfloat16, torch.float32)


@functools.cache
def _kernel():
    """The compiled module when it has the prefill kernel and it is not turned off, else None."""
    if os.environ.get("KVLINK_RAG_PREFILL_ATTENTION", "kernel") == "sdpa":
        return None
    ext = kernels()
    return ext if ext is not None and ext.prefill_attention_available() else None


def available() -> bool:
    """Whether prefill rows take the C++ kernel on this machine (AVX512-BF16, kernels built, not turned off)."""
    return _kernel() is not None


def _fits(q: torch.Tensor, pieces: Pieces, mask: torch.Tensor | None) -> bool:
    """The kernel's case: CPU, bfloat16 queries and every piece bfloat16, head_dim 64 with unit stride, key rows
    on 32-bit boundaries, a bfloat16 or float32 mask with unit column stride."""
    if q.device.type != "cpu" or q.dtype != torch.bfloat16 or q.shape[-1] != 64 or q.stride(-1) != 1:
        return False
    if mask is not None and (mask.dtype not in MASK_DTYPES or mask.stride(-1) != 1):
        return False
    return all(k.dtype == v.dtype == torch.bfloat16 and k.stride(-1) == v.stride(-1) == 1 and k.stride(1) % 2 == 0
               for k, v in pieces)


def attend_prefill(q: torch.Tensor, pieces: Pieces, mask: torch.Tensor | None, scale: float, causal: bool
                   ) -> torch.Tensor | None:
    """One request's prefill queries over its KV pieces by the C++ kernel, or None where it does not apply.

    Args:
        q: ``[heads, n, 64]`` bfloat16 queries (after RoPE; ``heads`` a multiple of the KV heads).
        pieces: ``(k, v)`` ``[kv_heads, tokens_i, 64]`` bfloat16 in storage order (read in place).
        mask: additive ``[n, sum tokens_i]`` bfloat16 or float32 (``finfo.min`` or ``-inf`` where masked), or None.
        scale: softmax scale (``head_dim ** -0.5``).
        causal: no mask; query ``t`` sees the keys up to ``sum tokens_i - n + t`` (the last ``n`` keys are its own).
    Returns:
        ``[heads, n, 64]`` bfloat16, or None (the caller's SDPA then runs).
    """
    ext = _kernel()
    if ext is None or not _fits(q, pieces, mask):
        return None
    return ext.prefill_attention(q, [k for k, _ in pieces], [v for _, v in pieces], None if causal else mask,
                                 causal, scale)
