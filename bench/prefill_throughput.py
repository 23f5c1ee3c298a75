"""Precompute throughput: encode_document + store write against the raw model forward, tokens/s."""

from __future__ import annotations

import time

import torch

from kvlink_rag.engine import Engine
from kvlink_rag.types import Document
from store.blobs.blob_store import BlobStore


@torch.inference_mode()
def precompute_throughput(engine: Engine, blobs: BlobStore, docs: list[Document], int8: bool = False) -> dict:
    """Side by side on the same documents, alternating per document so noise hits both alike.

    raw: ``lm.decoder(input_ids)`` forward over each document's ids (what any server must spend);
    precompute: ``engine.encode`` (forward + RoPE removal + dtype cast) + ``blobs.put`` (atomic LMDB write).
    """
    raw_s = pre_s = 0.0
    tokens = 0
    for i, d in enumerate(docs):
        ids = engine.document_ids(d)
        tokens += ids.numel()
        t0 = time.perf_counter()
        engine.lm.decoder(input_ids=ids[None], use_cache=True)
        raw_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        kv = engine.encode(d)
        blobs.put(f"bench-precompute-{i}", kv, int8=int8)
        pre_s += time.perf_counter() - t0
    for i in range(len(docs)):
        blobs.delete(f"bench-precompute-{i}")
    return {"tokens": tokens, "raw_tokens_per_s": tokens / raw_s, "precompute_tokens_per_s": tokens / pre_s,
            "ratio": raw_s / pre_s}
