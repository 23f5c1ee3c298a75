"""Attention of a prefill row (several query tokens) over bfloat16 KV pieces with the runner's C++ kernel.

torch's CPU SDPA runs bfloat16 prefill attention at ~60-140 GFLOP/s on this 2-core AVX512-BF16 CPU against
~400 for a GEMM of the same shape; at 4k keys that was most of a linked request's link-and-question forward
and of a full prefill (BENCHMARKS.md, issue 24). ``csrc/prefill_attention.cpp`` computes each query row's
scores as bfloat16 products accumulated in float32 (AVX512-BF16 ``vdpbf16ps``), the scale and additive mask,
an exact-maximum softmax in float32, the probabilities rounded to bfloat16 for ``P @ V`` (as flash attention's
kernels do) and the output rounded to bfloat16 once: 2.2-4.6x SDPA on these shapes, its error against a
float32 reference no larger than SDPA's own in bfloat16 (tests). Several pieces are read in place (no join);
a causal row skips the keys past its diagonal.

On a CPU with AMX the same SDPA multiplies its blocks on the tiles (oneDNN's brgemm) and is the faster one:
on the AMX Xeon of session 2026-12-08, 70 queries over 1,370 keys 0.81 ms against the kernel's 1.48, 256 over
4,000 keys 4.9 against 15.7 ms (``docs/bench/prefill-attention-amx-2026-12-08/micro.txt``), and 16 clients served
+10% (5.26 against 4.76 req/s, three runs each), so there prefill rows keep SDPA.
``KVLINK_RAG_PREFILL_ATTENTION`` (``EngineSettings.prefill_attention``, which the model loader passes to
:func:`set_mode`) chooses: ``auto`` (the default: the kernel where the CPU has AVX512-BF16 but no AMX), ``kernel``
(wherever it is built) or ``sdpa`` (everywhere; to compare the two side by side).

Where the kernel does not apply (no AVX512-BF16, KV not bfloat16, head_dim not 64, not the CPU, a mask of
another dtype) :func:`attend_prefill` returns None and the caller keeps SDPA.
"""

from __future__ import annotations

import functools
import os
from typing import get_args

import torch

from ..settings import PrefillAttention
from .cpu_kernels import cpu_flags, kernels

Pieces = list[tuple[torch.Tensor, torch.Tensor]]
MASK_DTYPES = (torch.bfloat16, torch.float32)
MODES: tuple[str, ...] = get_args(PrefillAttention)


@functools.cache
def _kernel():
    """The compiled module when it has the prefill kernel (built under AVX512-BF16), else None."""
    ext = kernels()
    return ext if ext is not None and ext.prefill_attention_available() else None


_CONFIGURED: list[str | None] = [None]  # the loaded settings' mode (set_mode); None: the environment


def set_mode(mode: str | None) -> None:
    """Choose the prefill rows' attention for this process: a mode of :data:`MODES` (the model loader passes
    ``EngineSettings.prefill_attention``, so ``settings.env`` and code overrides count), or None to read
    ``KVLINK_RAG_PREFILL_ATTENTION`` from the environment again.

    Raises:
        ValueError: another mode.
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"prefill attention {mode!r}: expected one of {', '.join(MODES)}")
    _CONFIGURED[0] = mode
    available.cache_clear(), bf16_native.cache_clear()


def _mode() -> str:
    """The mode :func:`set_mode` chose, else ``KVLINK_RAG_PREFILL_ATTENTION`` (default ``auto``).

    Raises:
        ValueError: the environment names another mode (a process that reads its settings refuses it at start:
            :class:`~kvlink_rag.settings.EngineSettings` declares it).
    """
    if _CONFIGURED[0] is not None:
        return _CONFIGURED[0]
    mode = os.environ.get("KVLINK_RAG_PREFILL_ATTENTION", "auto")
    if mode not in MODES:
        raise ValueError(f"KVLINK_RAG_PREFILL_ATTENTION={mode!r}: expected one of {', '.join(MODES)}")
    return mode


@functools.cache
def available() -> bool:
    """Whether prefill rows take the C++ kernel on this machine: it is built (AVX512-BF16) and chosen (``kernel``,
    or ``auto`` on a CPU without AMX; with AMX, SDPA is the faster: see the module docstring)."""
    mode = _mode()
    return _kernel() is not None and (mode == "kernel" or (mode == "auto" and "amx_bf16" not in cpu_flags()))


@functools.cache
def bf16_native() -> bool:
    """Whether prefill rows attend in bfloat16 here, so that float32 queries are narrowed rather than the KV widened
    (:func:`~.ragged.attend`): the kernel runs, or the CPU has AMX (SDPA on its tiles). Elsewhere (AVX2, Ice Lake,
    or an AVX512-BF16 CPU whose kernel does not run) the KV is widened to float32 as before these modes."""
    return available() or "amx_bf16" in cpu_flags()


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
    """One request's prefill queries over its KV pieces by the C++ kernel, or None where it does not apply (not
    built here, or inputs it does not take). It runs whenever built, whatever the mode: callers route by
    :func:`available`.

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
