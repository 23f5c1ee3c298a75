"""Ragged (packed) batches: many requests' new tokens in one forward, each attending to its own KV.

Continuous batching (Yu et al., 2022, Orca; vLLM, SGLang, nano-vllm) runs one forward per step over
the new tokens of every running request: a decode token for requests that are generating, the link
and question tokens for requests just admitted. Here the tokens are packed into one row
``[1, T_total]`` (no padding): the linear layers see one matrix of ``T_total`` tokens, and attention,
the only part that mixes tokens, splits the packed queries by request and attends each request's
queries to that request's own keys and values (:func:`attend`, called per row by the model runner,
:mod:`kvlink_rag.runtime.model_runner`): shared read-only chunks (prefix-tree nodes, never copied) followed by the request's own
tokens. Each row carries its own additive mask (the KVLink mask for a linked prefill) or none
(a decode token sees everything before it).

Attention per row over bfloat16 KV on an AVX512-BF16 CPU without AMX is the runner's prefill kernel
(:mod:`kvlink_rag.runtime.prefill_attention`: float32 scores, pieces read in place), elsewhere torch's SDPA
over the row's keys (the fused kernels; its causal path for a row that opens its sequence); a one-token decode
row goes to :mod:`kvlink_rag.runtime.decode_attention` (each KV head's query heads as its query rows; several
shared chunks never copied).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from .decode_attention import attend_decode
from .prefill_attention import attend_prefill, available as prefill_kernel, bf16_native
from .kv_sequence import KVChunk, SequenceKV

__all__ = ["KVChunk", "RaggedBatch", "RaggedRow", "SequenceKV", "attend", "attend_with_lse", "mask_rows", "widened"]


@dataclass
class RaggedRow:
    """One request's slice of a packed forward.

    Attributes:
        seq: the request's KV (extended by this forward).
        start, length: where its new tokens sit in the packed row (tokens).
        mask: additive ``[length, seq.num_tokens + length]`` over all its keys in storage order, or None
            for a single token that sees everything before it.
        attention: for a row whose attention probabilities are wanted (explain), the receiver of each layer's
            mass per key (:class:`kvlink_rag.runtime.attention_probs.MassReceiver`); None for the others.
        causal: the row's tokens are the sequence's first and plainly causal (``mask`` is that triangle):
            attention may take the kernel's causal path, which skips the masked half (2x less work at 1,300
            tokens than the same kernel with the mask).
    """

    seq: SequenceKV
    start: int
    length: int
    mask: torch.Tensor | None = None
    attention: object | None = None
    causal: bool = False


@dataclass
class RaggedBatch:
    """The rows of one packed forward (passed to the model as the ``ragged`` keyword)."""

    rows: list[RaggedRow] = field(default_factory=list)

    def add(self, seq: SequenceKV, length: int, mask: torch.Tensor | None = None, attention=None) -> RaggedRow:
        """Append a row of ``length`` new tokens; reserves room in ``seq``. Without ``mask`` several new
        tokens are causal among themselves (the mask made once here, not per layer). ``attention``: see
        :class:`RaggedRow`."""
        start = self.rows[-1].start + self.rows[-1].length if self.rows else 0
        seq.reserve(length)
        causal = mask is None and length > 1 and seq.num_tokens == 0
        if mask is None:
            mask = _causal_tail(length, seq.num_tokens + length, seq.dtype, seq.device)
        row = RaggedRow(seq, start, length, mask, attention, causal)
        self.rows.append(row)
        return row

    @property
    def num_tokens(self) -> int:
        return sum(r.length for r in self.rows)

    def subset(self, indices: list[int]) -> tuple[RaggedBatch, torch.Tensor]:
        """Rows ``indices`` (in that order) as a batch of their own, and the ``[n]`` int64 indexes of their
        tokens in this batch's packing (to slice its embeddings and position ids)."""
        sub, take, at = RaggedBatch(), [], 0
        for j in indices:
            r = self.rows[j]
            sub.rows.append(replace(r, start=at))
            take.extend(range(r.start, r.start + r.length))
            at += r.length
        return sub, torch.tensor(take, dtype=torch.long)

    def commit(self) -> None:
        """After the forward: every row's new tokens become part of its sequence."""
        for r in self.rows:
            r.seq.commit(r.length)


def mask_rows(mask: torch.Tensor | None, a: int, b: int) -> torch.Tensor | None:
    """Rows ``a..b-1`` of an additive ``[n, keys + n]`` prefill mask, over every key up to query ``b - 1``
    (``keys + b`` columns): the mask of that chunk of the prefill computed after its first ``a`` tokens
    (chunked prefill). None stays None (causal continuation)."""
    if mask is None:
        return None
    return mask[a:b, : mask.shape[1] - (mask.shape[0] - b)]


def _causal_tail(n: int, total: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """Additive ``[n, total]``: the last ``n`` keys are causal among the ``n`` queries, the rest visible."""
    if n == 1:
        return None
    mask = torch.zeros(n, total, dtype=dtype, device=device)
    tri = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    mask[:, total - n:].masked_fill_(tri, torch.finfo(dtype).min)
    return mask


def attend(q: torch.Tensor, pieces: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None,
           scale: float, causal: bool = False) -> torch.Tensor:
    """Attention of one request's queries over its KV pieces (grouped-query aware).

    Several queries (a prefill) over bfloat16 KV on an AVX512-BF16 CPU without AMX go to the runner's prefill kernel
    (:func:`~.prefill_attention.attend_prefill`, pieces read in place), elsewhere to torch's
    ``scaled_dot_product_attention`` (its fused CPU/CUDA kernels; several pieces are joined first, a copy
    that a prefill amortises); a one-token decode goes to :func:`~.decode_attention.attend_decode` (query heads
    folded into their KV head's rows, several pieces never copied).

    Args:
        q: ``[heads, n, head_dim]`` queries (after RoPE).
        pieces: ``(k, v)`` ``[kv_heads, tokens_i, head_dim]`` in storage order.
        mask: additive ``[n, sum tokens_i]`` or None (all visible).
        scale: softmax scale (``head_dim ** -0.5``).
        causal: ``q`` are the only keys' own queries, plainly causal (one piece of ``n`` keys): the kernel's
            causal path, ``mask`` unused.
    Returns:
        ``[heads, n, head_dim]`` in ``q``'s dtype. Queries are cast to the KV's dtype first (float32 queries over
        bfloat16 KV attend in bfloat16, as the KV was stored), but for float32 prefill rows over bfloat16 KV where
        bfloat16 attention is not native (:func:`~.prefill_attention.bf16_native`: the kernel does not run and the
        CPU has no AMX): there the KV is widened to float32 instead (torch's bfloat16 SDPA is emulated on a CPU
        without AVX512-BF16, several times slower than float32). Measured on an AVX2 EPYC (BENCHMARKS.md,
        ``pattn_f32.txt``): at 70 queries over 1.3k keys the widened attention takes as long as float32 SDPA over
        float32 KV, at 16 queries twice as long (1.4 against 0.7 ms: the copy into fresh pages).
    """
    kv_dtype = pieces[0][0].dtype
    if q.dtype == torch.float32 and kv_dtype == torch.bfloat16 and q.shape[1] > 1 and not bf16_native():
        return attend(q, [widened(pieces)], mask, scale, causal)
    if q.dtype != kv_dtype:
        return attend(q.to(kv_dtype), pieces, mask, scale, causal).to(q.dtype)
    causal = causal and len(pieces) == 1 and pieces[0][0].shape[1] == q.shape[1]
    if q.shape[1] > 1 and prefill_kernel() and (out := attend_prefill(q, pieces, mask, scale, causal)) is not None:
        return out
    if causal:
        k, v = pieces[0]
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale,
                                              enable_gqa=q.shape[0] != k.shape[0])[0]
    if q.shape[1] == 1:
        return attend_decode(q, pieces, mask, scale)
    k = pieces[0][0] if len(pieces) == 1 else torch.cat([k for k, _ in pieces], dim=1)
    v = pieces[0][1] if len(pieces) == 1 else torch.cat([v for _, v in pieces], dim=1)
    m = None if mask is None else mask.to(q.dtype)
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=m, scale=scale,
                                         enable_gqa=q.shape[0] != k.shape[0])
    return out[0]


def attend_with_lse(q: torch.Tensor, pieces: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None,
                    scale: float, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attend`, and each query row's log-sum-exp of its scaled, masked scores over every key where the
    attention runs as a masked float32 prefill on the CPU: there :func:`attend` takes torch's SDPA, which dispatches
    to the fused CPU flash kernel; that kernel is called here directly for its second output (the same output bytes,
    grouped-query heads native: tested). An importance score then needs no second pass over the keys
    (:func:`~.attention_probs.attention_mass`'s ``lse``).

    Returns:
        ``([heads, n, head_dim]`` as :func:`attend`, ``[heads, n]`` float32 log-sum-exp ``)``; the second is None
        where another kernel runs (a causal row, one query, bfloat16 attention: the prefill kernel or SDPA on AMX
        (:func:`~.prefill_attention.bf16_native`), another dtype or device).
    """
    kv_dtype = pieces[0][0].dtype
    widen = kv_dtype == torch.bfloat16 and not bf16_native()
    if (causal or mask is None or q.device.type != "cpu" or q.dtype != torch.float32 or q.shape[1] < 2
            or not (kv_dtype == torch.float32 or widen)):
        return attend(q, pieces, mask, scale, causal), None
    if widen or len(pieces) > 1:
        pieces = [widened(pieces)]
    k, v = pieces[0]  # [kv_heads, keys, head_dim] float32
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q[None], k[None], v[None], 0.0, False, attn_mask=mask.to(q.dtype)[None, None], scale=scale)
    return out[0], lse[0]


def widened(pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The pieces joined into one float32 ``(k, v)`` ``[kv_heads, sum tokens_i, head_dim]`` (one converting copy)."""
    kv, _, d = pieces[0][0].shape
    total = sum(k.shape[1] for k, _ in pieces)
    k = torch.empty(kv, total, d, dtype=torch.float32, device=pieces[0][0].device)
    v = torch.empty_like(k)
    at = 0
    for pk, pv in pieces:
        k[:, at: at + pk.shape[1]].copy_(pk)
        v[:, at: at + pk.shape[1]].copy_(pv)
        at += pk.shape[1]
    return k, v
