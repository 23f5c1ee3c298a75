"""The training forward's elementwise steps around its GEMMs - the MLP's ``silu(gate) * up`` and RMSNorm - each
one pass forward and one backward where the CPU kernels apply.

In torch ops a packed bfloat16 step (:mod:`training.train_forward`) spent ~15% of its time here (torch profiler,
``docs/bench/train-elementwise-2026-12-07h``; the interleaved timings there: the step 9% shorter with the kernels):
the gate|up GEMM's output converted from bfloat16 to float32
(~3.6 MB a layer at 4 examples), ``silu`` over a strided half of it, the product, their backward's three
products and a concatenation back into one gate|up gradient, converted to bfloat16 again for the GEMM's
backward; and RMSNorm as six ops (power, mean, add, rsqrt and two products) with as many in backward. The C++
kernels (``kvlink_rag/runtime/csrc/train_elementwise.cpp``, CPUs with AVX512-BF16) read each input once: the
MLP's from the GEMM's bfloat16 output, its gradient written as the bfloat16 the GEMM's backward reads.

Rounding: the same values as the torch ops up to float32 arithmetic order (the sigmoid by Cephes' expf, ~1 ulp;
the norm's sum of squares in another order); the tests compare both. Elsewhere (float32 GEMMs - the exact path -
or a CPU without the kernels) the functions are the torch ops, as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlink_rag.runtime.cpu_kernels import kernels


def elementwise_kernels(dtype: torch.dtype, device: torch.device):
    """The compiled kernels where this module uses them: a bfloat16 forward on a CPU with AVX512-BF16; else None."""
    if dtype != torch.bfloat16 or torch.device(device).type != "cpu":
        return None
    ext = kernels()
    return ext if ext is not None and ext.train_elementwise_available() else None


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gu, inter, ext):
        ctx.save_for_backward(gu)
        ctx.ext = ext
        return ext.silu_mul_bf16(gu, inter)

    @staticmethod
    def backward(ctx, grad):
        (gu,) = ctx.saved_tensors
        return ctx.ext.silu_mul_backward_bf16(grad.contiguous(), gu), None, None


def silu_mul(gu: torch.Tensor, intermediate: int, ext=None) -> torch.Tensor:
    """``silu(gate) * up`` of a gate|up projection's output.

    Args:
        gu: ``[T, 2 * intermediate]``: gate then up. With ``ext`` (:func:`elementwise_kernels`) bfloat16 and
            contiguous, its gradient comes back in bfloat16; else any float dtype, computed in float32 torch ops.
        intermediate: the MLP's width.
        ext: the kernels, or None (torch ops).
    Returns:
        ``[T, intermediate]`` float32 (float64 stays float64).
    """
    if ext is not None:
        return _SiluMul.apply(gu, intermediate, ext)
    wide = torch.promote_types(gu.dtype, torch.float32)
    gate, up = gu.to(wide).split(intermediate, -1)
    return F.silu(gate) * up


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, ext):
        y, rstd = ext.rms_norm_train(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.ext = ext
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        return ctx.ext.rms_norm_train_backward(grad.contiguous(), x, weight, rstd), None, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ext=None) -> torch.Tensor:
    """RMSNorm of rows with a frozen weight (no gradient reaches it).

    Args:
        x: ``[T, hidden]`` (the kernel takes float32 ``x`` and ``weight``; other dtypes go to torch's op).
        weight: ``[hidden]``.
        eps: added to the mean square.
        ext: the kernels (:func:`elementwise_kernels`), or None: :func:`torch.nn.functional.rms_norm`.
    Returns:
        ``[T, hidden]`` in ``x``'s dtype.
    """
    if ext is not None and x.dtype == torch.float32 and weight.dtype == torch.float32:
        return _RMSNorm.apply(x.contiguous(), weight.contiguous(), eps, ext)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
