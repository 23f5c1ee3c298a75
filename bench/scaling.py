"""Scaling: TTFT against the number of documents, and store size / lookup time against stored entries."""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch

from kvlink_rag.engine import Engine
from kvlink_rag.types import Document, DocumentKV
from store.backends import open_index
from store.index.document_index import DocumentRecord
from store.blobs.lmdb import LmdbBlobStore

from .ttft import ttft_full, ttft_linked


def ttft_by_documents(engine: Engine, question: str, pool: list[Document], counts: list[int], repeats: int) -> list[dict]:
    """Full vs linked TTFT for the first ``n`` documents of ``pool``, for each ``n`` in ``counts``."""
    rows = []
    for n in counts:
        docs = pool[:n]
        for d in docs:
            engine.get_or_encode(d)
        full = ttft_full(engine, question, docs, repeats)
        linked = ttft_linked(engine, question, docs, repeats)
        rows.append({"documents": n, "context_tokens": int(engine.prompt_ids(question, docs).numel()),
                     "full_s": full.median, "linked_s": linked["total"]["median_s"],
                     "speedup": full.median / linked["total"]["median_s"]})
    return rows


def _synthetic(i: int) -> DocumentKV:
    g = torch.Generator().manual_seed(i)
    k = torch.randn(2, 1, 4, 8, generator=g).to(torch.bfloat16)  # [layers, kv_heads, tokens, head_dim]
    return DocumentKV(k, k.clone(), torch.arange(4), "bench-synthetic", "isolated")


def store_scaling(root: Path, sizes: list[int], lookups: int = 200) -> list[dict]:
    """For each size: write that many synthetic entries (index record + tiny KV blob) into a fresh store,
    then time random index gets, near-duplicate queries and blob gets (median microseconds)."""
    rows = []
    for size in sizes:
        path = root / f"store-{size}"
        blobs = LmdbBlobStore(path, max_map_size=4 << 30)
        index = open_index(f"lmdb://{path}", env=blobs.env)
        rng = random.Random(size)
        t0 = time.perf_counter()
        for i in range(size):
            key = f"{i:016x}-{rng.getrandbits(64):016x}-{'0' * 64}"
            blobs.put(key, _synthetic(i))
            index.upsert(DocumentRecord(doc_id=f"d{i}", tenant="bench", simhash=rng.getrandbits(64), cache_key=key,
                                        status="ready"))
        write_s = time.perf_counter() - t0
        keys = blobs.keys()

        def timed(fn) -> float:
            ts = []
            for _ in range(lookups):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            return statistics.median(ts) * 1e6

        rows.append({
            "entries": size, "store_bytes": sum(f.stat().st_size for f in path.glob("*.mdb")),
            "write_s": write_s,
            "index_get_us": timed(lambda: index.get("bench", f"d{rng.randrange(size)}")),
            "near_duplicates_us": timed(lambda: index.near_duplicates(rng.getrandbits(64), "bench")),
            "blob_get_us": timed(lambda: blobs.get(keys[rng.randrange(len(keys))])),
        })
        blobs.close()
    return rows
