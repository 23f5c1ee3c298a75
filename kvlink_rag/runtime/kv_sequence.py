"""A request's KV as a block table: shared read-only chunks (prefix-tree nodes) then its own tokens in blocks of
a :class:`~kvlink_rag.runtime.block_pool.BlockPool`.

Attention reads both as *runs* (strided views of the pool's arenas, ``[layers, kv_heads, tokens, head_dim]``):
the decode kernels take them as pieces, a prefill joins them (one copy, amortised over its queries). A
sequence made without a pool gets a private one sized to its capacity (one-request paths, tests), whose
single run is a plain view, as the growable buffers this replaces were.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence

import torch

from .block_pool import BlockPool, Run


class KVChunk:
    """Read-only KV of consecutive tokens shared by requests (a prefix-tree node's segment).

    Either plain tensors (``KVChunk(keys, values)``, each ``[layers, kv_heads, tokens, head_dim]``) or tokens
    in a pool's blocks (:meth:`in_blocks`); :meth:`retain` / :meth:`drop` take and give back references to its
    blocks (the prefix tree does, for as long as a node holds the chunk).
    """

    __slots__ = ("_runs", "blocks", "pool", "offset", "num_tokens")

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, *,
                 runs: Sequence[Run] | None = None, blocks: Sequence[int] = (), pool: BlockPool | None = None,
                 offset: int = 0, num_tokens: int | None = None):
        self._runs = None if runs is None and keys is None else tuple(runs) if runs is not None else ((keys, values),)
        self.blocks, self.pool, self.offset = tuple(blocks), pool, offset
        self.num_tokens = int(num_tokens if num_tokens is not None else sum(k.shape[2] for k, _ in self._runs))

    @classmethod
    def in_blocks(cls, pool: BlockPool, blocks: Sequence[int], offset: int, n: int) -> KVChunk:
        """``n`` tokens of ``pool`` from token ``offset`` of ``blocks[0]`` on (no reference taken)."""
        used = pool.blocks_for(offset + n) if n else 0
        return cls(blocks=blocks[:used], pool=pool, offset=offset, num_tokens=n)

    @property
    def runs(self) -> tuple[Run, ...]:
        """``(k, v)`` views ``[layers, kv_heads, tokens_i, head_dim]`` in order."""
        if self._runs is None:
            self._runs = tuple(self.pool.runs(self.blocks, self.offset, self.num_tokens)) if self.num_tokens else ()
        return self._runs

    @property
    def keys(self) -> torch.Tensor:
        """``[layers, kv_heads, tokens, head_dim]`` (a view for one run, else a joined copy)."""
        r = self.runs
        return r[0][0] if len(r) == 1 else torch.cat([k for k, _ in r], dim=2)

    @property
    def values(self) -> torch.Tensor:
        r = self.runs
        return r[0][1] if len(r) == 1 else torch.cat([v for _, v in r], dim=2)

    @property
    def dtype(self) -> torch.dtype:
        return self.pool.dtype if self.pool is not None else self.runs[0][0].dtype

    @property
    def nbytes(self) -> int:
        if self.pool is not None:
            return self.num_tokens * self.pool.block_bytes // self.pool.block_size
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.runs)

    def slice(self, start: int, end: int) -> KVChunk:
        """Tokens ``start..end`` (a view; no reference taken)."""
        if self.pool is None:
            if len(self.runs) != 1:
                return KVChunk(self.keys[:, :, start:end], self.values[:, :, start:end])
            k, v = self.runs[0]
            return KVChunk(k[:, :, start:end], v[:, :, start:end])
        at = self.offset + start
        first = at // self.pool.block_size
        return KVChunk.in_blocks(self.pool, self.blocks[first:], at % self.pool.block_size, end - start)

    def retain(self) -> KVChunk:
        """Take a reference to each of its blocks (nothing for plain tensors); returns itself."""
        if self.pool is not None:
            self.pool.incref(self.blocks)
        return self

    def drop(self) -> None:
        """Give back the references :meth:`retain` took."""
        if self.pool is not None:
            self.pool.decref(self.blocks)


def _free(pool: BlockPool, table: list[int]) -> None:
    if table:
        pool.decref(table)
        table.clear()


class SequenceKV:
    """One request's KV: shared chunks, then its own tokens in blocks of ``pool``.

    Args:
        chunks: read-only prefix chunks in order (read in place, never copied; the prefix tree keeps them alive).
        layers, kv_heads, head_dim: model shape.
        dtype, device: of the own tokens.
        capacity: own tokens whose blocks are reserved up front (more are added when exceeded).
        pool: the block pool (default: a private one sized to ``capacity``).
    Raises:
        PoolExhausted: the pool cannot hold ``capacity`` tokens.
    The own blocks go back to the pool on :meth:`release`, or when the sequence is garbage.
    """

    def __init__(self, chunks: Sequence[KVChunk], layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", capacity: int = 64,
                 pool: BlockPool | None = None):
        if pool is None:
            bs = 16
            pool = BlockPool(layers, kv_heads, head_dim, dtype, device, bs, arena_blocks=-(-max(capacity, 1) // bs))
        self.pool, self.chunks = pool, list(chunks)
        self.shape = (layers, kv_heads, head_dim)
        self.table: list[int] = []  # own block ids
        self._spans: list[tuple[int, int, int]] = []  # (arena, slot, tokens) of every reserved own slot
        self._finalizer = weakref.finalize(self, _free, pool, self.table)
        self.length = 0  # own tokens committed (all layers written)
        self.shared_tokens = sum(c.num_tokens for c in self.chunks)
        self.lent = 0  # own tokens whose KV the prefix tree holds too (not counted twice)
        self.reserve(max(capacity, 1))

    @property
    def dtype(self) -> torch.dtype:
        return self.pool.dtype

    @property
    def device(self) -> torch.device:
        return self.pool.device

    @property
    def capacity(self) -> int:
        """Own tokens the reserved blocks hold."""
        return len(self.table) * self.pool.block_size

    @property
    def num_tokens(self) -> int:
        """Tokens visible to the next forward: shared chunks plus own committed tokens."""
        return self.shared_tokens + self.length

    @property
    def own_bytes(self) -> int:
        """Bytes of this request's own (unshared) committed KV: its tokens less those it lent to the tree."""
        return (self.length - self.lent) * self.pool.block_bytes // self.pool.block_size

    def reserve(self, n: int) -> None:
        """Blocks for ``n`` more own tokens (consecutive with the last one where the pool can).

        Raises:
            PoolExhausted: the pool has no room.
        """
        need = self.pool.blocks_for(self.length + n) - len(self.table)
        if need > 0:
            self.table += self.pool.allocate(need, after=self.table[-1] if self.table else None)
            self._spans = self.pool.spans(self.table, 0, self.capacity)

    def release(self) -> None:
        """Give the own blocks back to the pool (the sequence is not used after)."""
        _free(self.pool, self.table)
        self._spans, self.length = [], 0

    def _own_spans(self, start: int, n: int) -> Iterator[tuple[int, int, int, int]]:
        """``(arena, slot, tokens, offset in the range)`` of own tokens ``start..start + n``."""
        at, end = 0, start + n
        for a, s, t in self._spans:
            lo, hi = max(start, at), min(end, at + t)
            if lo < hi:
                yield a, s + lo - at, hi - lo, lo - start
            at += t
            if at >= end:
                return

    def own_runs(self, start: int, n: int) -> list[Run]:
        """Views ``(k, v)`` ``[layers, kv_heads, tokens_i, head_dim]`` of own tokens ``start..start + n``."""
        arenas = self.pool.arenas
        return [(arenas[a][0][:, :, s: s + t], arenas[a][1][:, :, s: s + t]) for a, s, t, _ in self._own_spans(start, n)]

    def own_kv(self, start: int = 0, end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Own tokens ``start..end`` (default: the committed ones) as ``(k, v)`` ``[layers, kv_heads, tokens,
        head_dim]``: a view when they are one run, else a joined copy."""
        runs = self.own_runs(start, (self.length if end is None else end) - start)
        if len(runs) == 1:
            return runs[0]
        if not runs:
            layers, kv_heads, head_dim = self.shape
            e = torch.empty(layers, kv_heads, 0, head_dim, dtype=self.dtype, device=self.device)
            return e, e
        return torch.cat([k for k, _ in runs], 2), torch.cat([v for _, v in runs], 2)

    def put(self, start: int, keys: torch.Tensor, values: torch.Tensor, layer: int | None = None) -> None:
        """Write ``keys``/``values`` (``[layers, kv_heads, n, head_dim]``, or ``[kv_heads, n, head_dim]`` of
        ``layer``) over own slots ``start..start + n`` (reserved; nothing committed)."""
        n = int(keys.shape[-2])
        for a, s, t, off in self._own_spans(start, n):
            k, v = self.pool.arenas[a]
            if layer is None:
                k[:, :, s: s + t] = keys[:, :, off: off + t]
                v[:, :, s: s + t] = values[:, :, off: off + t]
            else:
                k[layer, :, s: s + t] = keys[:, off: off + t]
                v[layer, :, s: s + t] = values[:, off: off + t]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append whole tokens ``[layers, kv_heads, n, head_dim]`` (e.g. a document's re-rotated KV)."""
        n = int(keys.shape[2])
        self.reserve(n)
        self.put(self.length, keys, values)
        self.length += n

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one layer's ``[kv_heads, n, head_dim]`` new tokens after the committed ones (a forward in
        progress; :meth:`commit` makes them visible once every layer is written)."""
        self.reserve(int(k.shape[1]))
        self.put(self.length, k, v, layer)

    def commit(self, n: int) -> None:
        """The ``n`` tokens written to every layer become part of the sequence."""
        self.length += n

    def lend(self, start: int, end: int) -> KVChunk:
        """Own tokens ``start..end`` as a chunk in this sequence's blocks (no reference taken: the prefix tree
        retains what it keeps)."""
        bs = self.pool.block_size
        return KVChunk.in_blocks(self.pool, self.table[start // bs:], start % bs, end - start)

    def pieces(self, extra: int = 0) -> list[Run]:
        """Every run in order, all layers: the chunks', then own tokens (``extra`` written but not committed)."""
        out = [r for c in self.chunks for r in c.runs]
        n = self.length + extra
        return out + self.own_runs(0, n) if n else out

    def layer_kv(self, layer: int, extra: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(k, v)`` ``[kv_heads, tokens, head_dim]`` pieces of ``layer`` in order, including ``extra``
        own tokens written but not yet committed."""
        for k, v in self.pieces(extra):
            yield k[layer], v[layer]


def pooled_sequence(lm, capacity: int) -> SequenceKV:
    """An empty sequence for ``lm`` (``lm.kv_dtype``, its device) with ``capacity`` own tokens reserved in one run
    of ``lm.scratch_pool``: a pool of arenas as long as the longest such sequence so far (made anew when a longer
    one comes), kept between requests, so that a one-request path (``ask``, ``eval``, the TTFT bench) writes into
    pages an earlier request touched. A fresh buffer per request page-faulted on its first writes: ~65 ms of a
    4k-token linked TTFT on the development machine. Its blocks go back when it is released or garbage."""
    bs = 16
    blocks = -(-max(capacity, 1) // bs)
    pool = lm.scratch_pool
    if not isinstance(pool, BlockPool) or pool.dtype != lm.kv_dtype or pool.arena_blocks < blocks:
        pool = BlockPool(lm.num_layers, int(lm.config.num_key_value_heads), lm.head_dim, lm.kv_dtype, lm.device,
                         bs, arena_blocks=blocks)
        lm.scratch_pool = pool
    return SequenceKV([], *pool.shape, pool.dtype, pool.device, capacity, pool=pool)
