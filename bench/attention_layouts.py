"""Attention over a request's KV as each candidate layout stores it, side by side (issue 24, item 2).

Before choosing a KV block pool's layout, each candidate is timed on the same queries and keys, one layer of
the default model's shape (9 query heads, 3 KV heads, head_dim 64), for a decode step (1 query) and a chunked
prefill step (128 queries, causal within the chunk) at each context:

- ``contiguous``: one buffer per request (today's own tokens), torch's SDPA;
- ``prefix pieces``: 4 shared read-only pieces then the own tokens (today's prefix-tree chunks,
  :func:`kvlink_rag.runtime.ragged.attend`: scores concatenated for a decode, pieces joined for a prefill);
- ``blocks B, gathered``: a pool of fixed-size blocks and a block table (vLLM's paged layout), the row's blocks
  gathered into one buffer (``index_select``), then SDPA;
- ``blocks B, per block``: the same blocks as pieces, never gathered (:func:`kvlink_rag.runtime.ragged.attend`);
- ``pool 16, one run`` / ``scattered``: the product's block pool read as runs (:func:`_pool_candidates`);
- ``flex``: FlexAttention (compiled, dense KV; compile seconds reported) when ``flex=True``.

Every candidate's output is checked against ``contiguous`` (max abs difference reported). CPU seconds
(``time.process_time``, one thread) per layer call, best of ``repeats``: the figure a busy machine disturbs least.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvlink_rag.runtime.ragged import attend

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M


def _causal_chunk_mask(n: int, keys: int) -> torch.Tensor:
    """Additive ``[n, keys]``: the last ``n`` keys causal among the ``n`` queries."""
    mask = torch.zeros(n, keys)
    mask[:, keys - n:].masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    return mask


def _candidates(q, k, v, mask, blocks: list[int], flex: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """Name -> a call computing ``[heads, n, head_dim]`` attention of ``q`` over ``k``/``v`` in that layout."""
    scale, keys = HEAD_DIM ** -0.5, k.shape[1]
    cands = {"contiguous": lambda: attend(q, [(k, v)], mask, scale)}
    bounds = [keys * i // 5 for i in range(6)]
    pieces = [(k[:, a:b].clone(), v[:, a:b].clone()) for a, b in zip(bounds, bounds[1:])]
    cands["prefix pieces (5)"] = lambda: attend(q, pieces, mask, scale)
    for size in blocks:
        nb = -(-keys // size)
        pool_k = torch.zeros(2 * nb, KV_HEADS, size, HEAD_DIM)  # pool: [blocks, kv_heads, block, head_dim]
        pool_v = torch.zeros_like(pool_k)
        table = torch.randperm(2 * nb)[:nb]  # the row's block table (scattered over the pool)
        padded_k = F.pad(k, (0, 0, 0, nb * size - keys)).view(KV_HEADS, nb, size, HEAD_DIM).transpose(0, 1)
        padded_v = F.pad(v, (0, 0, 0, nb * size - keys)).view(KV_HEADS, nb, size, HEAD_DIM).transpose(0, 1)
        pool_k[table], pool_v[table] = padded_k, padded_v

        def gathered(t=table, pk=pool_k, pv=pool_v):
            kk = pk.index_select(0, t).transpose(0, 1).reshape(KV_HEADS, -1, HEAD_DIM)[:, :keys]
            vv = pv.index_select(0, t).transpose(0, 1).reshape(KV_HEADS, -1, HEAD_DIM)[:, :keys]
            return attend(q, [(kk, vv)], mask, scale)

        def per_block(t=table.tolist(), pk=pool_k, pv=pool_v, size=size):
            last = keys - (len(t) - 1) * size
            ps = [(pk[b], pv[b]) if i < len(t) - 1 else (pk[b][:, :last], pv[b][:, :last]) for i, b in enumerate(t)]
            return attend(q, ps, mask, scale)

        cands[f"blocks {size}, gathered"] = gathered
        cands[f"blocks {size}, per block"] = per_block
    cands.update(_pool_candidates(q, k, v, mask))
    if flex:
        cands["flex (compiled)"] = _flex(q, k, v, mask)
    return cands


def _pool_candidates(q, k, v, mask) -> dict[str, Callable[[], torch.Tensor]]:
    """The product's pool (:class:`~kvlink_rag.runtime.block_pool.BlockPool`, arenas ``[layers, kv_heads, slots,
    head_dim]``): a row's blocks as runs handed to :func:`attend` (the C++ decode kernel's pieces; a prefill
    joins them), once consecutive (one run, what the allocator gives) and once every other block (worst case)."""
    from kvlink_rag.runtime.block_pool import BlockPool

    scale, keys, size = HEAD_DIM ** -0.5, k.shape[1], 16
    nb = -(-keys // size)
    out = {}
    for name, table in (("pool 16, one run", list(range(nb))), ("pool 16, scattered", list(range(0, 2 * nb, 2)))):
        pool = BlockPool(1, KV_HEADS, HEAD_DIM, k.dtype, block_size=size, arena_blocks=2 * nb)
        pool.allocate(2 * nb)  # the arena, every block held
        runs = pool.runs(table, 0, keys)
        at = 0
        for rk, rv in runs:  # rk: [1, kv_heads, tokens, head_dim]
            t = rk.shape[2]
            rk[0], rv[0] = k[:, at: at + t], v[:, at: at + t]
            at += t
        out[name] = lambda runs=runs: attend(q, [(rk[0], rv[0]) for rk, rv in runs], mask, scale)
    return out


def _flex(q, k, v, mask) -> Callable[[], torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    fn = torch.compile(flex_attention, dynamic=False)
    bias = None if mask is None else mask

    def score_mod(score, b, h, qi, ki):
        return score if bias is None else score + bias[qi, ki]

    return lambda: fn(q[None], k[None], v[None], score_mod=score_mod, enable_gqa=True)[0]


def _time(fn: Callable[[], torch.Tensor], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t0) / calls)
    return best


@torch.inference_mode()
def attention_layouts(contexts: list[int], blocks: list[int], flex: bool = False, repeats: int = 3,
                      log=print) -> list[dict]:
    """One row per (step, context, candidate): ``us_per_layer`` (CPU microseconds), ``vs_contiguous`` (ratio),
    ``max_diff`` (against contiguous), ``first_call_s`` (compile time for flex, else the first call)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for step, n in (("decode", 1), ("prefill chunk", 128)):
        for keys in contexts:
            q = torch.randn(HEADS, n, HEAD_DIM, generator=gen)
            k, v = (torch.randn(KV_HEADS, keys, HEAD_DIM, generator=gen) for _ in range(2))
            mask = None if n == 1 else _causal_chunk_mask(n, keys)
            ref, base = None, None
            for name, fn in _candidates(q, k, v, mask, blocks, flex).items():
                log(f"attention: {step} {keys} keys, {name}")
                t0 = time.perf_counter()
                out = fn()
                first = time.perf_counter() - t0
                ref = out if ref is None else ref
                us = _time(fn, 50 if n == 1 else 5, repeats) * 1e6
                base = us if base is None else base
                rows.append({"step": step, "keys": keys, "layout": name, "us_per_layer": us,
                             "vs_contiguous": us / base, "max_diff": float((out - ref).abs().max()),
                             "first_call_s": first})
    return rows


def markdown(rows: list[dict]) -> str:
    """The table (one line per row)."""
    lines = ["| step | keys | layout | CPU us per layer | vs contiguous | max diff | first call s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['step']} | {r['keys']} | {r['layout']} | {r['us_per_layer']:.0f} | "
                     f"{r['vs_contiguous']:.2f}x | {r['max_diff']:.1e} | {r['first_call_s']:.2f} |")
    return "\n".join(lines) + "\n"
