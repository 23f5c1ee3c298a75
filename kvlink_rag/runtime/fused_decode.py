"""A decoder layer's two halves around attention as single C++ calls, for steps of decode rows only.

A decode step of SmolLM2-135M on 2 CPU threads spends ~4.6 ms in the Q4 x Q8 linears and the LM head and
~9 ms in the ~45 torch operations per layer that surround them (each a few microseconds of dispatch and
Python). :func:`layer_pre` (RMSNorm, q|k|v projection with bias and LoRA, RoPE) and :func:`layer_post` (output
projection, residual, RMSNorm, gate|up, SiLU, down, residual) run the runner's own arithmetic
(:meth:`~kvlink_rag.runtime.model_runner.ModelRunner._layer`, same order, float32) in
``csrc/decode_layer.cpp``; between them :func:`attend` writes every row's new key and value into its buffer
and runs every row's attention in one call (``csrc/decode_rows.cpp``), with the step's buffers and chunks
gathered once (:class:`DecodeRows`) for all layers.

:func:`fits` says when decode rows can take it: on the CPU, every projection's decode format the Q4 x Q8 kernel (``q4q8-f32`` or ``q4q8-bf16``), head_dim 64 and no q/k norm (Qwen3 keeps the
general path). The step's residual stream is float32 (``q4q8-bf16``'s bfloat16 embeddings widen exactly; its KV
stays bfloat16, written and read as before): on this AVX512-BF16 EPYC the bfloat16 general path decoded 106
tok/s and the float32 halves 133 (2 threads, side by side), while bfloat16 keeps its 1.6x faster prefill. LoRA terms (:class:`~kvlink_rag.runtime.lora.FusedLowRank`) ride along as their stacked
``A`` and ``B^T``.

The halves' logits are the general path's bit for bit, not only to float32 rounding: every Q4 x Q8 product
quantises its input to int8, and an input one ulp apart can round to another integer, moving a logit by a
bfloat16 step. So a decode row's LoRA terms are one kernel on both paths (``lowrank_add``; the general path's
GEMMs summed in another order, which one depending on the thread count) and the extension is built without
FMA contraction (:mod:`.cpu_kernels`), so RoPE rounds as torch's multiplies and add do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cpu_kernels import kernels
from .linear import SplitLinear
from .lora import FusedLowRank, LayerLora
from .ragged import RaggedBatch, RaggedRow
from .q4q8 import Q4Q8Linear
from .weights import LayerWeights, ModelWeights

Lora = tuple[torch.Tensor | None, torch.Tensor | None, int]  # (A [rank, in], B^T [rank, span], start column)


def _decode_linear(linear) -> Q4Q8Linear | None:
    small = linear.small if isinstance(linear, SplitLinear) else linear
    return small if isinstance(small, Q4Q8Linear) else None


def fits(w: ModelWeights, lora: list[LayerLora] | None, h: torch.Tensor) -> bool:
    """Whether decode rows of ``w`` with embeddings ``h`` ``[T, hidden]`` and the adapter's terms ``lora`` take
    the fused halves in float32 (see module docstring; float32 LoRA terms only, as the general path multiplies
    them in their dtype). Which rows are decode rows: :func:`plain_decode`."""
    if kernels() is None or h.dtype not in (torch.float32, torch.bfloat16) or h.device.type != "cpu":
        return False
    layer = w.layers[0]
    if lora is not None and any(t.terms[0].a.dtype != torch.float32 for lr in lora for t in lr.present()):
        return False
    return (w.head_dim == 64 and layer.q_norm is None and layer.input_norm.dtype == torch.float32
            and all(_decode_linear(p) is not None for p in (layer.qkv, layer.o, layer.gate_up, layer.down)))


def _lora(term: FusedLowRank | None) -> Lora:
    if term is None:
        return None, None, 0
    a, b_t = term.kernel_stacks()
    return a, b_t, term.start


def layer_pre(w: ModelWeights, layer: LayerWeights, lora: LayerLora | None, h: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> torch.Tensor:
    """``[T, (heads + 2 kv_heads) * 64]`` float32: RMSNorm, the q|k|v projection and RoPE of ``h``
    ``[T, hidden]`` (``cos``, ``sin`` ``[T, 64]`` with rotate-half's sign folded into ``sin``)."""
    qkv = _decode_linear(layer.qkv)
    a, b_t, start = _lora(None if lora is None else lora.qkv)
    return kernels().decode_pre(h, layer.input_norm, w.eps, qkv.packed, qkv.bias, a, b_t, start, cos, sin,
                                (w.heads + w.kv_heads) * 64)


def layer_post(w: ModelWeights, layer: LayerWeights, lora: LayerLora | None, h: torch.Tensor,
               attn: torch.Tensor) -> torch.Tensor:
    """The layer's output ``[T, hidden]`` float32 from its input ``h`` and attention ``attn`` ``[T, heads * 64]``."""
    parts = [_decode_linear(p) for p in (layer.o, layer.gate_up, layer.down)]
    terms = [_lora(t) for t in ((None,) * 3 if lora is None else (lora.o, lora.gate_up, lora.down))]
    return kernels().decode_post(h, attn.contiguous(), [p.packed for p in parts], [p.bias for p in parts],
                                 [t[0] for t in terms], [t[1] for t in terms], [t[2] for t in terms],
                                 layer.post_norm, w.eps, w.intermediate)


def plain_decode(row: RaggedRow) -> bool:
    """Whether ``row`` is a decode row for the kernels: one token, no mask, no attention probabilities wanted
    (explain), its chunks in its own buffers' dtype."""
    return (row.length == 1 and row.mask is None and row.attention is None
            and all(c.dtype == row.seq.dtype for c in row.seq.chunks))


@dataclass(frozen=True)
class DecodeRows:
    """A step's rows as :func:`attend` hands them to the kernel, gathered once for every layer: each row's
    block table as runs (:meth:`~kvlink_rag.runtime.kv_sequence.SequenceKV.pieces`), the last one holding the
    slot of its new token.

    Attributes:
        own_k, own_v: each row's last run ``[layers, kv_heads, tokens, 64]`` (one dtype for all), its new
            token's slot included.
        pos: each row's new token's index in that run.
        chunk_k, chunk_v: each row's runs before it ``[layers, kv_heads, tokens, 64]`` in order (shared chunks,
            then its own earlier blocks).
    """

    own_k: list[torch.Tensor]
    own_v: list[torch.Tensor]
    pos: list[int]
    chunk_k: list[list[torch.Tensor]]
    chunk_v: list[list[torch.Tensor]]

    @classmethod
    def of(cls, batch: RaggedBatch) -> DecodeRows | None:
        """The rows of ``batch``, or None where one is not a :func:`plain_decode` row or the rows' KV
        differ in dtype."""
        rows = batch.rows
        if not rows or not all(plain_decode(r) for r in rows):
            return None
        if any(r.seq.dtype != rows[0].seq.dtype for r in rows):
            return None
        runs = []
        for r in rows:
            r.seq.reserve(1)
            runs.append(r.seq.pieces(1))
        return cls([p[-1][0] for p in runs], [p[-1][1] for p in runs], [p[-1][0].shape[2] - 1 for p in runs],
                   [[k for k, _ in p[:-1]] for p in runs], [[v for _, v in p[:-1]] for p in runs])


def attend(w: ModelWeights, layer: int, qkv: torch.Tensor, rows: DecodeRows) -> torch.Tensor:
    """``[T, heads * 64]`` float32: each row's new K/V (from ``qkv`` ``[T, (heads + 2 kv_heads) * 64]`` after
    RoPE) written at ``rows.pos`` of ``layer``, then its attention over its chunks and own tokens (the general
    path's arithmetic: the query and output rounded to the KV's dtype, as :func:`~.ragged.attend` casts)."""
    return kernels().decode_rows(qkv, w.heads, layer, rows.own_k, rows.own_v, rows.pos, rows.chunk_k, rows.chunk_v,
                                 w.head_dim ** -0.5)
