"""Weight formats of the model runner's linear layers, behind one declared interface.

``Linear`` maps activations ``[tokens, in]`` to ``[tokens, out]`` in the activations' dtype; the weight
may be held in another format (the model's own dtype, bfloat16, int8 weight-only). Each format is one class; the
runner never asks which it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from .quantize import int8_rows, q4_groups

MAX_SMALL_TOKENS = 1  # a row of at most this many tokens (a decode step) takes a SplitLinear's small format;
# every prefill row, however it was chunked, takes the large one, so a request's numerics never depend on its
# batch or on how its prefill was split


@dataclass(frozen=True)
class TokenSplit:
    """Which packed tokens take a :class:`SplitLinear`'s small format: those of rows of at most
    :data:`MAX_SMALL_TOKENS` tokens (decode steps), so every row gets the format its own forward would get,
    whatever else is in the batch. ``small``/``large``: ``[n]`` int64 token indexes (None when empty)."""

    small: torch.Tensor | None
    large: torch.Tensor | None

    @classmethod
    def of_rows(cls, lengths: list[int], device, one_per_row: bool = False) -> TokenSplit:
        """The split of rows of ``lengths`` tokens packed in order (``one_per_row``: one token of each row,
        e.g. the rows' last tokens for the LM head)."""
        small, large, at = [], [], 0
        for n in lengths:
            k = 1 if one_per_row else n
            (small if n <= MAX_SMALL_TOKENS else large).extend(range(at, at + k))
            at += k
        return cls(_index(small, device), _index(large, device))


def _index(ix: list[int], device) -> torch.Tensor | None:
    return torch.tensor(ix, dtype=torch.long, device=device) if ix else None


class Linear(Protocol):
    """``y = x W^T (+ b)``: ``x`` ``[tokens, in]`` -> ``[tokens, out]`` (dtype of ``x``)."""

    out_features: int

    def __call__(self, x: torch.Tensor, split: TokenSplit | None = None) -> torch.Tensor: ...


class DenseLinear:
    """A dense weight ``[out, in]`` (float32 or bfloat16) and optional bias ``[out]``.

    With weights in another dtype than the activations, the matmul runs in the weights' dtype and the
    result is cast back (bfloat16 weights with float32 activations: the residual stream stays float32).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor, split: TokenSplit | None = None) -> torch.Tensor:
        w = self.weight
        if x.dtype == w.dtype:
            return F.linear(x, w, self.bias)
        b = None if self.bias is None else self.bias.to(w.dtype)
        return F.linear(x.to(w.dtype), w, b).to(x.dtype)


class Int8Linear:
    """int8 weight-only with one float scale per output channel (``torch._weight_int8pack_mm``).

    ``W ~= q * s``, ``q`` int8 ``[out, in]``, ``s`` ``[out]``: symmetric per-channel rounding (as torchao's
    int8 weight-only). Activations run in bfloat16 (the kernel's CPU dtype) and return in their dtype.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        q, scale = int8_rows(weight)
        self.qweight = q.contiguous()
        self.scale = scale.to(torch.bfloat16)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.out_features = int(weight.shape[0])

    def __call__(self, x: torch.Tensor, split: TokenSplit | None = None) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x.to(torch.bfloat16), self.qweight, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


class Int4Linear:
    """int4 weight-only, asymmetric per group of 32 input columns (``torch._weight_int4pack_mm_for_cpu``).

    ``W ~= q * s + m`` per group, ``q`` in 0..15: the layout of GGUF's Q4_1 (``w = d*q + m`` per block of 32),
    so the default model's weights, dequantised from Q4_1 at conversion, are re-quantised onto the same
    grid; the kernel keeps ``s`` and ``m`` in bfloat16 (GGUF keeps float16), so they round. Activations run
    in bfloat16 (the kernel's fast CPU dtype) and return in their dtype. CPU only.

    Raises:
        ValueError: the input width is not a multiple of the group size.
    """

    GROUP = 32

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        n, k = weight.shape
        g = self.GROUP
        if k % g:
            raise ValueError(f"int4 needs the input width ({k}) to be a multiple of {g}")
        q, scale, lo = q4_groups(weight, g)  # scale, lo: [out, groups]
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        # the kernel computes (q - 8) * s + z per group: z = m + 8 s; [groups, out, 2]
        self.scales_zeros = torch.stack([scale.t(), (lo + 8 * scale).t()], -1).to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.out_features = int(n)

    def __call__(self, x: torch.Tensor, split: TokenSplit | None = None) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, self.GROUP, self.scales_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


class SplitLinear:
    """Two formats of one weight: ``small`` (e.g. int4, fastest for decode steps, where reading the weight is
    the cost) for the tokens of rows of at most :data:`MAX_SMALL_TOKENS` tokens, ``large`` (e.g. bfloat16
    GEMM, fastest for prefill, where the multiply-adds are) for the others. With a :class:`TokenSplit` each
    row takes its own format in a mixed batch (a row's numerics never depend on its batch); without one the
    whole call counts as one row of ``x``'s tokens."""

    def __init__(self, small: Linear, large: Linear):
        self.small, self.large = small, large
        self.out_features = small.out_features

    def __call__(self, x: torch.Tensor, split: TokenSplit | None = None) -> torch.Tensor:
        if split is None:
            return (self.small if x.shape[0] <= MAX_SMALL_TOKENS else self.large)(x)
        if split.large is None:
            return self.small(x)
        if split.small is None:
            return self.large(x)
        y = x.new_empty(x.shape[0], self.out_features)
        y[split.small] = self.small(x[split.small])
        y[split.large] = self.large(x[split.large])
        return y


WEIGHT_FORMATS = ("native", "bfloat16", "int8", "int4", "int4-bf16", "int4-f32", "q4q8-bf16", "q4q8-f32")


def bfloat16_linear(weight: torch.Tensor, bias: torch.Tensor | None, pack: bool = True) -> Linear:
    """``weight`` (and ``bias``) in bfloat16: packed once for oneDNN where this CPU runs it
    (:class:`~.packed_linear.PackedLinear`, bit for bit the same outputs), else a :class:`DenseLinear`."""
    from .packed_linear import PackedLinear, packing_available

    w = weight.detach().to(torch.bfloat16)
    b = None if bias is None else bias.detach().to(torch.bfloat16)
    return PackedLinear(w, b) if pack and packing_available(w) else DenseLinear(w, b)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str) -> Linear:
    """A :class:`Linear` of ``weight`` ``[out, in]`` in format ``fmt`` (one of :data:`WEIGHT_FORMATS`).

    ``native`` keeps ``weight`` itself in the model's dtype (no copy: the runner shares the model's tensors);
    ``int4-f32`` is int4 for decode rows and that same shared weight for prefill rows; ``q4q8-bf16`` /
    ``q4q8-f32`` are those two with decode rows on the Q4 x Q8 kernel (:mod:`.q4q8`).

    Raises:
        ValueError: unknown format. RuntimeError: a q4q8 format where its kernel is not available.
    """
    if fmt == "native":
        return DenseLinear(weight, bias)
    if fmt == "bfloat16":
        return bfloat16_linear(weight, bias)
    if fmt == "int8":
        return Int8Linear(weight, bias)
    if fmt == "int4":
        return Int4Linear(weight, bias)
    if fmt == "int4-bf16":
        return SplitLinear(Int4Linear(weight, bias), make_linear(weight, bias, "bfloat16"))
    if fmt == "int4-f32":  # CPUs without native bfloat16 GEMM: prefill on the model's own float32 weights (shared)
        return SplitLinear(Int4Linear(weight, bias), DenseLinear(weight, bias))
    if fmt in ("q4q8-bf16", "q4q8-f32"):  # decode rows on the Q4 x Q8 kernel (runtime/q4q8.py)
        from .q4q8 import Q4Q8Linear

        large = make_linear(weight, bias, "bfloat16" if fmt == "q4q8-bf16" else "native")
        return SplitLinear(Q4Q8Linear(weight, bias), large)
    raise ValueError(f"unknown weight format {fmt!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
