"""A frozen linear layer with a trainable low-rank term as one GEMM each way, forward and backward written out.

``y = x W^T + b + (x A^T) B^T`` with ``W`` (and ``b``) frozen in the GEMM dtype (bfloat16 on CPUs with native
bfloat16) and ``A``, ``B`` trainable float32 masters (LoRA, Hu et al., 2021, arXiv 2106.09685; ``B`` with the
scale folded in). The term rides in the frozen GEMM: ``y = [x | x A^T] [W | B]^T`` over ``in + rank`` columns, the
``B`` columns of the augmented weight rewritten from the masters at every forward; backward is one GEMM too,
``[dx_W | d(xA^T)] = dy [W | B]``, then ``dx = dx_W + d(xA^T) A``, ``dA = d(xA^T)^T x``, ``dB = dy^T (x A^T)``.
As separate torch ops the term cost more than a third of the frozen GEMMs' time (a profile of a packed step,
``docs/bench/train-forward-2026-12-06``): its float32 products are thin (rank 16-48) and each re-read the
projection's whole float32 output or gradient (~3.6 MB a gate|up projection at 4 examples); autograd also
recorded the in-place addition as a copy of a view, whose backward cloned and zero-filled the gradient.

Rounding (a bfloat16 weight): ``x A^T`` and ``B`` enter the GEMM rounded to bfloat16 as ``x`` and ``W`` do, the
gradient ``dy`` is rounded to bfloat16 for ``dB`` and ``d(xA^T)`` as it already is for ``dx``; products accumulate
in float32. In float32 (and float64, the gradient check) it is the formula exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class FrozenLoraLinear(torch.autograd.Function):
    """``apply(x, weight, bias, a, b, keep=False)``.

    Args:
        x: ``[rows, in]`` float32 (float64 in the gradient check).
        weight: ``[out, in + rank]`` in the GEMM dtype: the frozen ``W`` in ``[:, :in]``; ``[:, in:]`` is
            overwritten here with ``b``. Without a term (``a`` None) ``[out, >= in]``, only ``[:, :in]`` read.
        bias: ``[out]`` in the GEMM dtype, or None.
        a: ``[rank, in]`` or None (no term); b: ``[out, rank]`` (scale folded in).
        keep: return the GEMM's output in the GEMM dtype (its gradient may come in that dtype too) instead of
            converting it to ``x``'s dtype: for a consumer that reads the GEMM dtype (:func:`training.elementwise.silu_mul`).
    Returns:
        ``[rows, out]`` in ``x``'s dtype (``keep``: the GEMM dtype); gradients for ``x``, ``a``, ``b`` (never the
        frozen weight or bias), in the dtypes of ``x`` and ``a``.
        A graph whose weight a later forward rewrote fails in backward (the weight's version counter).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, a, b, keep=False):
        n_in, dt = x.shape[1], weight.dtype
        out_dtype = dt if keep else x.dtype
        ctx.x_dtype = x.dtype
        if a is None:
            ctx.save_for_backward(weight[:, :n_in])
            ctx.n_in = None
            return F.linear(x.to(dt), weight[:, :n_in], bias).to(out_dtype)
        x_aug = torch.empty(x.shape[0], n_in + a.shape[0], dtype=dt, device=x.device)  # [rows, in + rank]
        x_aug[:, :n_in] = x
        x_aug[:, n_in:] = x @ a.t()
        weight[:, n_in:] = b
        ctx.save_for_backward(x, x_aug, weight, a)
        ctx.n_in = n_in
        return F.linear(x_aug, weight, bias).to(out_dtype)

    @staticmethod
    def backward(ctx, grad):
        wide = ctx.x_dtype  # the gradients' dtype (``grad`` is in the GEMM dtype where the forward kept it)
        if ctx.n_in is None:
            (weight,) = ctx.saved_tensors
            return (grad.to(weight.dtype) @ weight).to(wide), None, None, None, None, None
        x, x_aug, weight, a = ctx.saved_tensors
        n_in, g = ctx.n_in, grad.to(weight.dtype)
        gx_aug = g @ weight  # [rows, in + rank]: dx through W and the gradient of x A^T, one GEMM
        grad_xa = gx_aug[:, n_in:].to(wide)
        grad_x = gx_aug[:, :n_in].to(wide).addmm_(grad_xa, a) if ctx.needs_input_grad[0] else None
        grad_a = grad_xa.t() @ x if ctx.needs_input_grad[3] else None
        grad_b = (g.t() @ x_aug[:, n_in:]).to(wide) if ctx.needs_input_grad[4] else None
        return grad_x, None, None, grad_a, grad_b, None


def frozen_lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       term: tuple[torch.Tensor, torch.Tensor] | None, keep: bool = False) -> torch.Tensor:
    """:class:`FrozenLoraLinear` over ``x`` ``[..., in]`` (leading dims flattened and restored); ``term`` is
    ``(A, B)`` or None; ``weight`` and ``keep`` as the class takes them. Returns ``[..., out]`` in ``x``'s dtype
    (``keep``: the weight's)."""
    a, b = term if term is not None else (None, None)
    rows = x.reshape(-1, x.shape[-1])
    return FrozenLoraLinear.apply(rows, weight, bias, a, b, keep).view(*x.shape[:-1], weight.shape[0])
