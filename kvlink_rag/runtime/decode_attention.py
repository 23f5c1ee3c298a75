"""Attention of one-token queries (decode steps) over a request's KV pieces, grouped-query aware.

A decode step has one query token per head. With grouped-query attention (SmolLM2-135M: 9 query heads
over 3 KV heads) SDPA's ``enable_gqa`` runs a one-row query per head, 7x slower on this CPU than folding
each KV head's group of query heads into its query rows (``[1, kv_heads, group, head_dim]``: the same
keys read once for the whole group, as FlashDecoding and llama.cpp's GQA path do): 1,428 -> 186 us a
layer at 1,300 keys in bfloat16 (one thread). Past :data:`MATMUL_MIN_KEYS` bfloat16 keys on the CPU the
matmul form (two batched GEMMs around a float32 softmax, K as the left operand so a view of the KV
buffer is not copied) beats the fused kernel (274 -> 179 us at 1,300, 698 -> 530 at 4,000), so long rows take it. Several pieces (a conversation's shared turns): the fused
kernel per piece merged by log-sum-exp in bfloat16, else the scores of all pieces concatenated.
Where the runner's CPU kernels run (:mod:`.cpu_kernels`), an unmasked decode over bfloat16 or float32 KV with
head_dim 64 takes the C++ kernel instead: each KV head's group of queries over all its pieces in one pass, no copy, the
query in float32 (~4-8x the forms above on one thread, BENCHMARKS.md). Every form is exact attention up to
summation order and the dtype of the probabilities.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu_kernels import kernels

MATMUL_MIN_KEYS = 1024  # bfloat16 CPU rows with at least this many keys take the matmul form (measured crossover)
GROUP_TOKENS = 256  # pieces shorter than this are joined with their short neighbours before the kernel

Pieces = list[tuple[torch.Tensor, torch.Tensor]]


def attend_decode(q: torch.Tensor, pieces: Pieces, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Attention of one query token per head over ``pieces``.

    Args:
        q: ``[heads, 1, head_dim]`` in the KV's dtype (after RoPE).
        pieces: ``(k, v)`` ``[kv_heads, tokens_i, head_dim]`` in storage order.
        mask: additive ``[1, sum tokens_i]`` or None (all visible).
        scale: softmax scale.
    Returns:
        ``[heads, 1, head_dim]`` in ``q``'s dtype.
    """
    ext = kernels()
    if ext is not None and mask is None and _kernel_fits(q, pieces):
        return ext.decode_attention(q[:, 0].float(), [k for k, _ in pieces], [v for _, v in pieces], scale
                                    ).to(q.dtype)[:, None]
    if len(pieces) == 1:
        return _attend_one(q, pieces[0][0], pieces[0][1], mask, scale)
    if mask is None and q.dtype == torch.bfloat16 and q.device.type == "cpu":
        return _attend_pieces_merged(q, pieces, scale)
    return _attend_pieces(q, pieces, mask, scale)


def _kernel_fits(q: torch.Tensor, pieces: Pieces) -> bool:
    """The C++ kernel's case: CPU, bfloat16 or float32 KV, head_dim 64, unit stride inside a token."""
    k = pieces[0][0]
    return (q.device.type == "cpu" and k.dtype in (torch.bfloat16, torch.float32) and k.shape[-1] == 64
            and all(k.stride(-1) == 1 and v.stride(-1) == 1 for k, v in pieces))


def _attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
                ) -> torch.Tensor:
    heads, _, d = q.shape
    kv, t, _ = k.shape
    qg = q.reshape(kv, heads // kv, d)  # qg: [kv_heads, group, head_dim]; head h uses kv head h // group
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and t >= MATMUL_MIN_KEYS:
        # K as the GEMM's left operand: a view of the KV buffer is read in place (q K^T would copy K first)
        scores = torch.bmm(k, qg.transpose(1, 2)).transpose(1, 2).float() * scale  # [kv_heads, group, tokens]
        if mask is not None:
            scores = scores + mask.float()
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.bmm(probs, v).view(heads, 1, d)
    m = None if mask is None else mask.to(q.dtype)[None, None]  # [1, 1, 1, tokens]: the same for every row
    # reshape, not view: CUDA's kernels may return a permuted layout (seen on an H200)
    return F.scaled_dot_product_attention(qg[None], k[None], v[None], attn_mask=m, scale=scale).reshape(heads, 1, d)


def _attend_pieces_merged(q: torch.Tensor, pieces: Pieces, scale: float) -> torch.Tensor:
    """One-token queries over several bfloat16 pieces on the CPU: the fused kernel per piece, its outputs
    merged by their log-sum-exps (FlashAttention's split-KV / FlashDecoding merge), in float32. A piece's
    kernel call over ``[kv_heads, tokens_i, head_dim]`` reads the piece once; the matmul form of
    :func:`_attend_pieces` runs oneDNN's small bfloat16 GEMMs, slower here than the whole attention."""
    heads, n, d = q.shape
    kv = pieces[0][0].shape[0]
    qg = q.reshape(1, kv, (heads // kv) * n, d)  # each kv head's group of query heads as its query rows
    out = lse = None
    for k, v in grouped(pieces):
        o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, k[None], v[None], 0.0, False,
                                                                            scale=scale)[:2]
        o = o.float()  # o: [1, kv, g, head_dim]; l: [1, kv, g] float32 log-sum-exp of the piece's scores
        if out is None:
            out, lse = o, l
            continue
        new = torch.logaddexp(lse, l)
        out = out * torch.exp(lse - new)[..., None] + o * torch.exp(l - new)[..., None]
        lse = new
    return out.to(q.dtype).view(heads, n, d)


def grouped(pieces: Pieces) -> Pieces:
    """Runs of short pieces (< :data:`GROUP_TOKENS`, e.g. a conversation's turns) joined (a small copy), long
    ones as they are: fewer kernel calls without copying what is large."""
    out, run = [], []

    def flush():
        if run:
            out.append(run[0] if len(run) == 1 else (torch.cat([k for k, _ in run], 1), torch.cat([v for _, v in run], 1)))
            run.clear()

    for piece in pieces:
        if piece[0].shape[1] >= GROUP_TOKENS:
            flush()
            out.append(piece)
        else:
            run.append(piece)
    flush()
    return out


def _attend_pieces(q: torch.Tensor, pieces: Pieces, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """``softmax([q K_1^T, ..., q K_c^T] * scale + mask) [V_1; ...; V_c]``: the scores of all pieces
    concatenated (small), the values never (float32 softmax)."""
    heads, n, d = q.shape
    kv = pieces[0][0].shape[0]
    g = heads // kv
    qg = q.reshape(kv, g * n, d)  # head h uses kv head h // g
    scores = torch.cat([torch.matmul(qg, k.transpose(1, 2)) for k, _ in pieces], dim=-1)  # [kv, g*n, L]
    scores = scores.float() * scale
    if mask is not None:
        scores = (scores.view(kv, g, n, -1) + mask.float()).view(kv, g * n, -1)
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out, at = None, 0
    for k, v in pieces:
        t = k.shape[1]
        part = torch.matmul(probs[:, :, at: at + t], v)  # [kv, g*n, d]
        out = part if out is None else out + part
        at += t
    return out.view(heads, n, d)
