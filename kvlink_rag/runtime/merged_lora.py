"""The query-side adapter merged into the bfloat16 weights of prefill rows: ``W + B A`` (scales folded), one GEMM a
projection instead of the base GEMM and the term's two (Hu et al., 2021, arXiv 2106.09685, section 4.1: "we can
explicitly compute and store W = W0 + BA"; peft's ``merge_and_unload``).

Only formats whose prefill rows multiply in bfloat16 merge (``q4q8-bf16``, ``int4-bf16``, ``bfloat16``): there the
base weight is rounded to bfloat16 anyway, and the merged one is ``W0 + BA`` rounded once. The terms' GEMMs cost
half to two-thirds of the base linears they adapt for 7% of their FLOPs (two skinny GEMMs, casts and an add per
projection; a 16-client profile on the AVX512-BF16 EPYC put them at 10% of the scheduler's time in bfloat16 against
14% for the base GEMMs, ``docs/bench/lora-bf16-2026-12-06/``). Decode rows keep their format (the Q4 x Q8 kernel)
and the term's float32 kernel, so their numerics do not change. Each merged adapter holds a second bfloat16 copy of
the layer weights (212 MB for SmolLM2-135M), built on the adapter's first prefill and rebuilt when its tensors
change in place (training).
"""

from __future__ import annotations

import torch

from .linear import Linear, SplitLinear, TokenSplit, bfloat16_linear


def merged_weights(modules: list[torch.nn.Module], start: int, end: int, a: torch.Tensor, b_t: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused weight ``[sum out, in]`` (float32) of ``modules`` with ``b_t^T a`` added to rows ``[start, end)``,
    and the fused bias (None without one).

    Args:
        modules: the projections fused (q, k, v; gate, up; o; down), peft-wrapped or plain.
        a: ``[sum rank, in]`` the stacked ``A``; b_t: ``[sum rank, end - start]`` the block-diagonal ``B^T``
            with each target's scale folded in (:meth:`~.lora.FusedLowRank.stacks`).
    """
    from .weights import fused_weight

    weight, bias = fused_weight(modules)
    weight = weight.float()  # [sum out, in], a copy (cat) the merge may write into
    weight[start:end] += b_t.float().t() @ a.float()  # [span, sum rank] @ [sum rank, in]
    return weight, None if bias is None else bias.float()


def merged_linear(modules: list[torch.nn.Module], start: int, end: int, a: torch.Tensor, b_t: torch.Tensor
                  ) -> Linear:
    """:func:`merged_weights` as a bfloat16 linear (packed for oneDNN where it runs)."""
    return bfloat16_linear(*merged_weights(modules, start, end, a, b_t))


def project(linear: Linear, merged: Linear, x: torch.Tensor, split: TokenSplit) -> tuple[torch.Tensor, bool]:
    """``linear``'s output for ``x`` ``[tokens, in]`` with the rows of the large format (prefill rows) through
    ``merged`` instead; returns it and whether the decode rows (``split.small`` of a :class:`SplitLinear`) still
    need their term. A linear of one format (``bfloat16``) takes ``merged`` for every row."""
    if not isinstance(linear, SplitLinear):
        return merged(x, split), False
    if split.large is None:
        return linear(x, split), True
    return SplitLinear(linear.small, merged)(x, split), split.small is not None
