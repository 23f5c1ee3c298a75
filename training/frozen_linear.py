"""A frozen linear layer with a trainable low-rank term, forward and backward written out.

``y = x W^T + b + (x A^T) B^T`` with ``W`` (and ``b``) frozen in the GEMM dtype (bfloat16 on CPUs with native
bfloat16) and ``A``, ``B`` trainable in float32 (LoRA, Hu et al., 2021, arXiv 2106.09685; ``B`` with the scale
folded in). As torch ops, autograd recorded the term's in-place addition into the GEMM's output as a copy of a
view (its backward cloned the whole gradient and zero-filled a fresh tensor each layer, ~3.7 MB a gate|up
projection at 4 examples, page-faulted on first touch), and the casts around the GEMM as nodes of their own.
Here one :class:`torch.autograd.Function` does the same arithmetic: the term added into the output in place
(beta = 1), and backward forms ``dx = (dy W) + (dy B) A``, ``dA = (dy B)^T x``, ``dB = dy^T (x A^T)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class FrozenLoraLinear(torch.autograd.Function):
    """``apply(x, weight, bias, a, b)``.

    Args:
        x: ``[rows, in]`` float32 (requires grad or not; float64 in the gradient check).
        weight: ``[out, in]`` frozen, in the GEMM dtype; bias: ``[out]`` in that dtype, or None.
        a: ``[rank, in]`` float32 or None (no term); b: ``[out, rank]`` float32 (scale folded in).
    Returns:
        ``[rows, out]`` in ``x``'s dtype; gradients for ``x``, ``a``, ``b`` (never the frozen weight or bias).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, a, b):
        y = F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)
        xa = None
        if a is not None:
            xa = x @ a.t()  # [rows, rank]
            y.addmm_(xa, b.t())
        ctx.save_for_backward(x, weight, a, b, xa)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, a, b, xa = ctx.saved_tensors
        grad_x = grad_a = grad_b = None
        gb = None if a is None else grad @ b  # [rows, rank]
        if ctx.needs_input_grad[0]:
            grad_x = (grad.to(weight.dtype) @ weight).to(grad.dtype)  # [rows, in]
            if gb is not None:
                grad_x.addmm_(gb, a)
        if a is not None and ctx.needs_input_grad[3]:
            grad_a = gb.t() @ x
        if a is not None and ctx.needs_input_grad[4]:
            grad_b = grad.t() @ xa
        return grad_x, None, None, grad_a, grad_b


def frozen_lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       term: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """:class:`FrozenLoraLinear` over ``x`` ``[..., in]`` (leading dims flattened and restored); ``term`` is
    ``(A, B)`` or None. Returns ``[..., out]`` float32."""
    a, b = term if term is not None else (None, None)
    rows = x.reshape(-1, x.shape[-1])
    return FrozenLoraLinear.apply(rows, weight, bias, a, b).view(*x.shape[:-1], weight.shape[0])
