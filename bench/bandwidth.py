"""KV load bandwidth from a blob store (LMDB page cache warm, or the shared Redis tier) against a real floor:
a copy of the same bytes into preallocated, already-touched buffers with the same thread count."""

from __future__ import annotations

import numpy as np
import torch

from kvlink_rag.types import DocumentKV
from store.blobs.blob_store import BlobStore

from .timing import Timing, measure


def _bytes(t: torch.Tensor) -> np.ndarray:
    """A flat uint8 numpy view of a contiguous CPU tensor (no copy)."""
    return t.contiguous().view(torch.uint8).view(-1).numpy()


def copy_floor(tensors: list[torch.Tensor], repeats: int) -> Timing:
    """Seconds to copy ``tensors`` into preallocated buffers whose pages were touched beforehand, one thread
    (numpy ``copyto``, the same single-threaded memcpy the codec's decode does into its outputs): what any
    load of these bytes must spend, without the allocation and page faults ``torch.clone`` pays."""
    src = [_bytes(t) for t in tensors]
    dst = [np.ones_like(s) for s in src]  # allocated and touched (written) before timing

    def run() -> None:
        for s, d in zip(src, dst, strict=True):
            np.copyto(d, s)

    return measure(run, repeats)


def copy_floor_threads(tensors: list[torch.Tensor], repeats: int) -> Timing:
    """Seconds to copy ``tensors`` into preallocated, touched buffers with torch's threads (``copy_``, which splits a
    large copy over the intra-op threads): the floor of a load that spreads its writes over the same threads, as the
    batched load into blocks does (:meth:`kvlink_rag.rows.RowWriter.write_many`)."""
    src = [t.contiguous() for t in tensors]
    dst = [torch.ones_like(t) for t in src]  # allocated and touched before timing

    def run() -> None:
        for s, d in zip(src, dst, strict=True):
            d.copy_(s)

    return measure(run, repeats)


def load_bandwidth(blobs: BlobStore, items: dict[str, DocumentKV], repeats: int = 5) -> dict:
    """Bytes/s of ``blobs.get`` for every key in ``items`` against :func:`copy_floor` (and ``clone``, which
    allocates) of the same tensors.

    ``items`` maps cache keys (already stored, read once first so caches are warm) to the in-memory documents.
    Returns payload bytes stored, logical KV bytes, the timings and GB/s; ``load_vs_copy`` is floor / load
    (1.0 = the load runs at memcpy speed).
    """
    keys = list(items)
    for k in keys:  # warm the page cache (LMDB) or the connections (Redis)
        blobs.get(k)
    stored = sum(int(blobs.meta(k)["nbytes"]) for k in keys)
    logical = sum(kv.nbytes for kv in items.values())
    load = measure(lambda: [blobs.get(k) for k in keys], repeats)
    tensors = [t for kv in items.values() for t in (kv.keys, kv.values)]
    floor = copy_floor(tensors, repeats)
    clone = measure(lambda: [t.clone() for t in tensors], repeats)
    return {"stored_bytes": stored, "kv_bytes": logical, "load": load.as_dict(), "copy": floor.as_dict(),
            "clone": clone.as_dict(), "load_gbps": logical / load.median / 1e9, "copy_gbps": logical / floor.median / 1e9,
            "clone_gbps": logical / clone.median / 1e9, "load_vs_copy": floor.median / load.median}


def bytes_per_token(blobs: BlobStore, keys: list[str]) -> float:
    """Stored payload bytes per token over ``keys``."""
    metas = [blobs.meta(k) for k in keys]
    return sum(int(m["nbytes"]) for m in metas) / sum(int(m["num_tokens"]) for m in metas)


def stream_into_blocks(blobs: BlobStore, keys: list[str], repeats: int = 5) -> dict:
    """Seconds to stream the keyed documents' layers (``prefetch_layers`` at retention 1, the query path's load,
    no memory-tier fill) into one request's KV blocks of the records' dtype, written straight into them through
    the load path's row writers as the scheduler's ``_rotate_into`` does: values and keys copied (``stream``), and
    keys rotated at their positions on the way as a query needs them (``stream_rope``), each against
    :func:`copy_floor` of the same KV bytes (one thread: the load path's figure, issue 24: >= 0.70 of the floor)
    and :func:`copy_floor_threads` (torch's threads, as many as the load's batched writes use).

    Returns:
        ``{"kv_bytes", "tokens", "threads", "stream", "stream_rope", "copy", "copy_threads": Timing, "stream_gbps",
        "copy_gbps", "copy_threads_gbps", "stream_vs_copy", "stream_rope_vs_copy", "stream_vs_copy_threads"}``.
    """
    from kvlink_rag.linking.rope_rows import block_writers, copy_rows
    from kvlink_rag.runtime.kv_sequence import SequenceKV
    from store.records.codec import target_dtype
    from store.tiers.prefetch import prefetch_layers

    metas = [blobs.meta(k) for k in keys]
    L, H, _, D = metas[0]["shape"]
    dtype, tokens = target_dtype(metas[0], None), sum(m["shape"][2] for m in metas)
    seq = SequenceKV([], L, H, D, dtype, capacity=tokens)  # its pool's arena is kept (and touched) across runs
    pool = seq.pool
    angles = torch.randn(tokens, D), torch.randn(tokens, D)  # any tables: the cost does not depend on them

    def run(writers) -> None:  # as the scheduler's _rotate_into
        s = SequenceKV([], L, H, D, dtype, capacity=tokens, pool=pool)
        docs = prefetch_layers(blobs, keys)
        runs = s.own_runs(0, tokens)
        if docs.fill is not None and len(runs) == 1:
            for i in range(L):  # straight into the blocks: [kv_heads, tokens, head_dim] views
                docs.fill(i, runs[0][0][i], runs[0][1][i], *writers)
        else:
            for i, (k, v) in enumerate(docs.layers):  # k, v: [kv_heads, tokens, head_dim] into the blocks
                s.write(i, k, v)
        s.commit(tokens)
        s.release()

    seq.release()
    stream = measure(lambda: run((copy_rows, copy_rows)), repeats)
    stream_rope = measure(lambda: run(block_writers(*angles)), repeats)
    kvs = [blobs.get(k) for k in keys]
    tensors = [t for kv in kvs for t in (kv.keys, kv.values)]
    floor, floor_threads = copy_floor(tensors, repeats), copy_floor_threads(tensors, repeats)
    nbytes = sum(kv.nbytes for kv in kvs)
    return {"kv_bytes": nbytes, "tokens": tokens, "threads": torch.get_num_threads(), "stream": stream.as_dict(),
            "stream_rope": stream_rope.as_dict(), "copy": floor.as_dict(), "copy_threads": floor_threads.as_dict(),
            "stream_gbps": nbytes / stream.median / 1e9, "copy_gbps": nbytes / floor.median / 1e9,
            "copy_threads_gbps": nbytes / floor_threads.median / 1e9, "stream_vs_copy": floor.median / stream.median,
            "stream_rope_vs_copy": floor.median / stream_rope.median,
            "stream_vs_copy_threads": floor_threads.median / stream.median}
