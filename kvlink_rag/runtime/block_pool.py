"""The KV block pool: fixed-size blocks of KV slots, reference counted, that every request's own tokens and
every prefix-tree node live in (PagedAttention's block manager, Kwon et al., SOSP 2023; nano-vllm's
``block_manager``; SGLang's token-to-KV pool).

Storage is a list of arenas, each ``keys, values: [layers, kv_heads, arena_blocks * block_size, head_dim]``.
Block ``b`` is slots ``(b % arena_blocks) * block_size ..`` of arena ``b // arena_blocks``, in every layer and
KV head at once, so blocks with consecutive ids in one arena are consecutive slots: a block table reads as a
few *runs*, each one strided view ``[layers, kv_heads, tokens, head_dim]`` of an arena, and the attention
kernels take runs as their pieces (``csrc/pieces.h``) without a gather. The allocator prefers consecutive
blocks (first fit, then extending a request's last block) so that a request's table is usually one run;
measured in ``kvlink-rag bench-attention`` (BENCHMARKS.md, "KV block pool").

Sharing is a table entry: a prefix-tree node holds references to the blocks of its tokens and a request that
matches it reads them in place. No block is written by two requests: a request's own tokens go to blocks it
allocated; the only block shared *and* written is a lender's partial last block (the tree holds the prompt's
tokens of it, the lender appends its answer after them, in slots the tree never reads), so the copy that
vLLM's copy-on-write makes of a shared last block is never needed here: a request that extends a shared
prefix starts its own block instead (vLLM copies because its tables have no per-block token counts).

Arenas are created on first need (``torch.empty``: untouched pages cost nothing) up to ``max_blocks``; past
it the ``reclaimers`` (the prefix trees' LRU eviction) are asked for room before :class:`PoolExhausted`. An
arena whose last block is freed goes back to the allocator once it stayed empty for ``idle_s`` (all but the first
and one spare, whose touched pages the next request reuses; :meth:`BlockPool.trim`, which the scheduler calls when
idle), so a burst of long requests does not keep its memory long after it, and the next burst writes into pages
already touched: a fresh arena's first writes page-fault (~23,000 faults for a 47 MB half), which made the load of
stored documents into blocks 2x slower during a 16-client burst on the AVX512-BF16 EPYC while the pool grew or
re-created arenas given back between bursts (BENCHMARKS.md, session 2026-12-06).
"""

from __future__ import annotations

import inspect
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence

import torch

Run = tuple[torch.Tensor, torch.Tensor]  # (keys, values) [layers, kv_heads, tokens, head_dim] views
ARENA_IDLE_S = 30.0  # seconds an empty arena is kept for the next requests (service setting kv_pool_idle_s)


class PoolExhausted(RuntimeError):
    """The pool cannot give ``needed`` blocks: ``free`` are free and the pool holds its maximum."""

    def __init__(self, needed: int, free: int, max_blocks: int, block_bytes: int):
        super().__init__(f"the KV pool has {free} free blocks of {max_blocks} ({max_blocks * block_bytes >> 20} MiB) "
                         f"and this request needs {needed}; retry when running requests finish")
        self.needed, self.free = needed, free


class BlockPool:
    """Fixed-size KV blocks in lazily created arenas (see module docstring). Thread safe.

    Args:
        layers, kv_heads, head_dim: model shape.
        dtype, device: of the KV.
        block_size: tokens per block (16, vLLM's default).
        arena_blocks: blocks per arena (its tensors are allocated when first needed).
        max_blocks: the pool's size in blocks (0: arenas are added as long as memory lasts).
        idle_s: seconds an empty arena is kept before :meth:`trim` gives it back (0: at once).
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", block_size: int = 16, arena_blocks: int = 256,
                 max_blocks: int = 0, idle_s: float = ARENA_IDLE_S, clock: Callable[[], float] = time.monotonic):
        if block_size < 1 or arena_blocks < 1 or max_blocks < 0 or idle_s < 0:
            raise ValueError(f"block_size {block_size} and arena_blocks {arena_blocks} must be >= 1, max_blocks and "
                             f"idle_s {idle_s} >= 0")
        self.idle_s, self.clock = idle_s, clock
        self._empty_since: dict[int, float] = {}  # arena (not the first) -> when its last block was freed
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device = dtype, torch.device(device)
        self.block_size, self.max_blocks = block_size, max_blocks
        self.arena_blocks = min(arena_blocks, max_blocks) if max_blocks else arena_blocks
        self.arenas: list[Run | None] = []  # None: an arena given back to the allocator (its ids kept)
        self._free: list[bytearray] = []  # per arena, 1 = free
        self._free_in: list[int] = []  # free blocks per arena
        self._refs: list[int] = []  # per block id
        self.reclaimers: list[weakref.WeakMethod | Callable[[int], int]] = []
        self._lock = threading.RLock()

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (keys and values, every layer)."""
        layers, kv_heads, head_dim = self.shape
        return 2 * layers * kv_heads * self.block_size * head_dim * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def free_blocks(self) -> int:
        """Free blocks of the arenas allocated now."""
        return sum(self._free_in)

    @property
    def num_blocks(self) -> int:
        """Blocks of the arenas allocated now."""
        return sum(a is not None for a in self.arenas) * self.arena_blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens from a block's start."""
        return -(-tokens // self.block_size)

    def add_reclaimer(self, reclaim: Callable[[int], int]) -> None:
        """``reclaim(bytes)`` frees blocks (by dropping references, e.g. a prefix tree's LRU leaves) when the pool
        is full; held weakly when it is a bound method."""
        self.reclaimers = [r for r in self.reclaimers if not (isinstance(r, weakref.WeakMethod) and r() is None)]
        self.reclaimers.append(weakref.WeakMethod(reclaim) if inspect.ismethod(reclaim) else reclaim)

    # -- allocation ---------------------------------------------------------------------------------
    def allocate(self, n: int, after: int | None = None) -> list[int]:
        """``n`` block ids, each with one reference; consecutive where possible (first the blocks right
        after ``after``, a block the caller holds, then the first run of ``n`` free blocks).

        Raises:
            PoolExhausted: fewer than ``n`` blocks free at ``max_blocks``, after the reclaimers ran.
        """
        if n <= 0:
            return []
        with self._lock:
            self._make_room(n)
            out = self._extend(after, n) if after is not None else []
            while len(out) < n:
                out += self._take(n - len(out))
            for b in out:
                self._refs[b] = 1
            return out

    def _make_room(self, n: int) -> None:
        short = n - self.free_blocks
        while short > 0 and self._can_grow():
            self._add_arena()
            short = n - self.free_blocks
        if short > 0:
            for r in list(self.reclaimers):
                fn = r() if isinstance(r, weakref.WeakMethod) else r
                if fn is not None and n > self.free_blocks:
                    fn((n - self.free_blocks) * self.block_bytes)
        if n > self.free_blocks:
            raise PoolExhausted(n, self.free_blocks, self.num_blocks, self.block_bytes)

    def _can_grow(self) -> bool:
        return self.max_blocks == 0 or self.num_blocks + self.arena_blocks <= self.max_blocks

    def _add_arena(self) -> int:
        """A new arena (in the first slot an arena was given back from, else appended); returns its index."""
        layers, kv_heads, head_dim = self.shape
        slots = self.arena_blocks * self.block_size
        k = torch.empty(layers, kv_heads, slots, head_dim, dtype=self.dtype, device=self.device)
        a = next((i for i, x in enumerate(self.arenas) if x is None), len(self.arenas))
        if a == len(self.arenas):
            self.arenas.append(None)
            self._free.append(bytearray(self.arena_blocks))
            self._free_in.append(0)
            self._refs.extend([0] * self.arena_blocks)
        self.arenas[a] = (k, torch.empty_like(k))
        self._free[a][:] = b"\x01" * self.arena_blocks
        self._free_in[a] = self.arena_blocks
        return a

    def _emptied(self, a: int) -> None:
        """Arena ``a`` holds no block in use now: it is given back by :meth:`trim` once ``idle_s`` passed."""
        if a != 0:
            self._empty_since[a] = self.clock()
            if self.idle_s == 0:
                self.trim()

    def trim(self) -> int:
        """Give back the arenas empty for ``idle_s`` or longer, but the first and one spare (the lowest empty one:
        first fit takes it next); returns how many went. Thread safe; the scheduler calls it when idle."""
        with self._lock:
            empty = sorted(self._empty_since)
            now, gone = self.clock(), 0
            for a in empty[1:]:
                if now - self._empty_since[a] >= self.idle_s:
                    del self._empty_since[a]
                    self.arenas[a] = None
                    self._free[a][:] = bytes(self.arena_blocks)
                    self._free_in[a] = 0
                    gone += 1
            return gone

    def _extend(self, after: int, n: int) -> list[int]:
        a, local = divmod(after, self.arena_blocks)
        bm, out = self._free[a], []
        j = local + 1
        while len(out) < n and j < self.arena_blocks and bm[j]:
            bm[j] = 0
            out.append(a * self.arena_blocks + j)
            j += 1
        self._free_in[a] -= len(out)
        return out

    def _take(self, n: int) -> list[int]:
        """A run of ``n`` free blocks (first fit; a new arena rather than scattered blocks while the pool may
        grow), else the first free run (fewer than ``n``)."""
        want = b"\x01" * min(n, self.arena_blocks)
        for a, bm in enumerate(self._free):
            j = bm.find(want)
            if j >= 0:
                return self._mark(a, j, len(want))
        if self._can_grow():
            return self._mark(self._add_arena(), 0, len(want))
        for a, bm in enumerate(self._free):
            j = bm.find(b"\x01")
            if j >= 0:
                end = bm.find(b"\x00", j)
                return self._mark(a, j, min(n, (self.arena_blocks if end < 0 else end) - j))
        raise AssertionError("free_blocks counted a block no arena holds")

    def _mark(self, a: int, j: int, n: int) -> list[int]:
        self._empty_since.pop(a, None)
        self._free[a][j: j + n] = bytes(n)
        self._free_in[a] -= n
        return list(range(a * self.arena_blocks + j, a * self.arena_blocks + j + n))

    def incref(self, blocks: Iterable[int]) -> None:
        """One more reference to each of ``blocks`` (a prefix-tree node that keeps them)."""
        with self._lock:
            for b in blocks:
                if self._refs[b] <= 0:
                    raise ValueError(f"block {b} is free: a reference to it was dropped too often")
                self._refs[b] += 1

    def decref(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each of ``blocks``; a block without references is free again."""
        with self._lock:
            for b in blocks:
                if self._refs[b] <= 0:
                    raise ValueError(f"block {b} is already free")
                self._refs[b] -= 1
                if self._refs[b] == 0:
                    a, local = divmod(b, self.arena_blocks)
                    self._free[a][local] = 1
                    self._free_in[a] += 1
                    if self._free_in[a] == self.arena_blocks:
                        self._emptied(a)

    def refs(self, block: int) -> int:
        return self._refs[block]

    # -- addressing ---------------------------------------------------------------------------------
    def spans(self, blocks: Sequence[int], start: int, n: int) -> list[tuple[int, int, int]]:
        """``(arena, first slot, tokens)`` runs of the ``n`` tokens from token ``start`` of the sequence laid
        out in ``blocks`` (``start`` counts from the first block's first slot); consecutive blocks merge."""
        out: list[list[int]] = []
        bs, ab = self.block_size, self.arena_blocks
        pos, end = start, start + n
        while pos < end:
            b = blocks[pos // bs]
            a, local = divmod(b, ab)
            slot = local * bs + pos % bs
            take = min(end - pos, bs - pos % bs)
            if out and out[-1][0] == a and out[-1][1] + out[-1][2] == slot:
                out[-1][2] += take
            else:
                out.append([a, slot, take])
            pos += take
        return [tuple(s) for s in out]

    def runs(self, blocks: Sequence[int], start: int, n: int) -> list[Run]:
        """Views ``(k, v)`` ``[layers, kv_heads, tokens, head_dim]`` of the runs of :meth:`spans`."""
        return [(self.arenas[a][0][:, :, s: s + t], self.arenas[a][1][:, :, s: s + t])
                for a, s, t in self.spans(blocks, start, n)]

    def stats(self) -> dict:
        """``{block_size, blocks, free_blocks, used_bytes, capacity_bytes, max_blocks}`` (bytes)."""
        with self._lock:
            used = self.num_blocks - self.free_blocks
            return {"block_size": self.block_size, "blocks": self.num_blocks, "free_blocks": self.free_blocks,
                    "used_bytes": used * self.block_bytes, "capacity_bytes": self.num_blocks * self.block_bytes,
                    "max_blocks": self.max_blocks}


def kv_pool(lm) -> BlockPool:
    """The pool of ``lm``'s scheduler sequences (``lm.kv_dtype`` on the model's device), made on first use with
    no bound (:func:`configure_pool` sets one)."""
    if not isinstance(lm.kv_pool, BlockPool) or lm.kv_pool.dtype != lm.kv_dtype:
        configure_pool(lm, 0)
    return lm.kv_pool


def configure_pool(lm, max_bytes: int, block_size: int = 16, idle_s: float = ARENA_IDLE_S) -> BlockPool:
    """Give ``lm`` a new pool of at most ``max_bytes`` (0: unbounded) in blocks of ``block_size`` tokens, its empty
    arenas kept ``idle_s`` seconds; sequences made before keep the pool they were made in.

    Raises:
        ValueError: ``max_bytes`` holds less than one block, ``block_size`` < 1 or ``idle_s`` < 0.
    """
    cfg = lm.config
    pool = BlockPool(lm.num_layers, cfg.num_key_value_heads, lm.head_dim, lm.kv_dtype, lm.device, block_size,
                     idle_s=idle_s)
    if max_bytes:
        if max_bytes < pool.block_bytes:
            raise ValueError(f"a KV pool of {max_bytes} bytes holds no block of {pool.block_bytes} bytes")
        pool = BlockPool(*pool.shape, pool.dtype, pool.device, block_size, max_blocks=max_bytes // pool.block_bytes,
                         idle_s=idle_s)
    lm.kv_pool = pool
    return pool
