"""KV load bandwidth from LMDB (page cache warm) against a plain memory copy of the same bytes."""

from __future__ import annotations

from kvlink_rag.types import DocumentKV
from store.blob_store import BlobStore

from .timing import measure


def load_bandwidth(blobs: BlobStore, items: dict[str, DocumentKV], repeats: int = 5) -> dict:
    """Bytes/s of ``blobs.get`` for every key in ``items`` vs ``clone`` of the same tensors in memory.

    ``items`` maps cache keys (already stored, read once so the page cache is warm) to the in-memory
    documents; the copy baseline clones those documents' K and V (the same logical bytes as loaded).
    Returns payload bytes on disk, logical KV bytes, both timings and GB/s.
    """
    keys = list(items)
    for k in keys:  # warm the page cache
        blobs.get(k)
    stored = sum(int(blobs.meta(k)["nbytes"]) for k in keys)
    logical = sum(kv.nbytes for kv in items.values())
    load = measure(lambda: [blobs.get(k) for k in keys], repeats)
    tensors = [t for kv in items.values() for t in (kv.keys, kv.values)]
    copy = measure(lambda: [t.clone() for t in tensors], repeats)
    return {"stored_bytes": stored, "kv_bytes": logical, "load": load.as_dict(), "copy": copy.as_dict(),
            "load_gbps": logical / load.median / 1e9, "copy_gbps": logical / copy.median / 1e9,
            "load_vs_copy": copy.median / load.median}


def bytes_per_token(blobs: BlobStore, keys: list[str]) -> float:
    """Stored payload bytes per token over ``keys``."""
    metas = [blobs.meta(k) for k in keys]
    return sum(int(m["nbytes"]) for m in metas) / sum(int(m["num_tokens"]) for m in metas)

