"""bfloat16 linear layers with their weights packed once into oneDNN's blocked layout (CPU).

``F.linear`` on a plain bfloat16 weight reorders that weight into oneDNN's blocked layout on **every call**: a
forward of a few prefill tokens (a linked query's link tokens and question, a long prompt's chunk) spends most of its
linear time re-packing 212 MB of SmolLM2-135M weights. Packing once at load (what torch.compile's CPU backend does
for frozen bfloat16 weights: ``torch.ops.mkldnn._reorder_linear_weight`` then ``_linear_pointwise``) runs the same
brgemm kernel on the same blocks, so every output is **bit for bit** ``F.linear``'s, at any number of rows (tested),
and a row's result never depends on its batch. Measured on the development CPUs (30 layers of SmolLM2-135M's
shapes, two threads): 22 rows 19.2 -> 13.3 ms, 80 rows ~24 -> 17 ms, 256 rows 42 -> 28 ms.

The packed tensor is opaque (no views, no ``.weight`` to read rows from), so the LM head that re-scores candidates
from its rows (:class:`~kvlink_rag.runtime.head.RescoredHead`) keeps a plain weight.
"""

from __future__ import annotations

import functools

import torch

PACK_ROWS_HINT = 64  # the rows oneDNN blocks the packed weight for: fastest here from 22 to 256 rows (a prefill step)


@functools.cache
def _cpu_bf16_packing() -> bool:
    """Whether this torch build and CPU run oneDNN's packed bfloat16 linear."""
    ops = torch.ops.mkldnn
    try:
        return bool(torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
                    and hasattr(ops, "_linear_pointwise") and ops._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def packing_available(weight: torch.Tensor) -> bool:
    """True when ``weight`` can be held packed: a bfloat16 CPU tensor, and oneDNN's bfloat16 linear on this CPU."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and _cpu_bf16_packing()


class PackedLinear:
    """A bfloat16 weight ``[out, in]`` (and optional bias ``[out]``) packed once for oneDNN.

    Activations of another dtype are cast to bfloat16 for the product and the result cast back (as
    :class:`~kvlink_rag.runtime.linear.DenseLinear` does with a bfloat16 weight: the residual stream stays float32).

    Args:
        weight: ``[out, in]`` bfloat16 on the CPU (:func:`packing_available`).
        bias: ``[out]`` or None (cast to bfloat16).
    Raises:
        ValueError: ``weight`` cannot be packed here.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        if not packing_available(weight):
            raise ValueError("PackedLinear needs a bfloat16 CPU weight and oneDNN's bfloat16 linear on this CPU")
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS_HINT)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()

    def __call__(self, x: torch.Tensor, split=None) -> torch.Tensor:
        """``x`` ``[tokens, in]`` -> ``[tokens, out]`` in ``x``'s dtype."""
        xb = x.to(torch.bfloat16).contiguous()
        y = torch.ops.mkldnn._linear_pointwise(xb, self.packed, self.bias, "none", [], "")
        return y if x.dtype == torch.bfloat16 else y.to(x.dtype)
