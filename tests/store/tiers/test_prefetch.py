"""Layer-wise prefetch from LMDB: same linked result as in memory, overlap with compute, corrupt fallback."""

from __future__ import annotations

import time

import torch

from factories import tiny_text_engine
from store.settings import StoreSettings
from kvlink_rag.types import Document
from store.factory import open_store
from store.tiers.prefetch import prefetch_layers

DOCS = [Document("Ada Lovelace wrote the first published algorithm for Babbage's engine.", "Ada"),
        Document("The Analytical Engine was designed by Charles Babbage in 1837.", "Engine"),
        Document("Punched cards fed programs into Jacquard looms before computers.", "Cards")]
QUESTION = "Who designed the Analytical Engine?"


def _engine_with_store(tmp_path):
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20, host_cache_bytes=32 << 20))
    engine = tiny_text_engine(tmp_path)
    engine.cache = st.cache
    return st, engine


def test_streamed_from_lmdb_equals_in_memory_and_fills_the_tier(tmp_path):
    st, engine = _engine_with_store(tmp_path)
    first, hits0 = engine.link_context(QUESTION, DOCS)  # encodes, stores in LMDB and the host tier
    in_memory, hits1 = engine.link_context(QUESTION, DOCS)
    for key in [engine.cache_key(d) for d in DOCS]:
        st.tiered.invalidate(key)
    assert all(isinstance(it, str) for it in st.cache.resolve([engine.cache_key(d) for d in DOCS]))
    streamed, hits2 = engine.link_context(QUESTION, DOCS)
    assert (hits0, hits1, hits2) == (0, 3, 3)
    assert torch.equal(streamed.last_logits, in_memory.last_logits)
    assert torch.allclose(first.last_logits, streamed.last_logits, atol=1e-5)
    time.sleep(0.2)  # the reader thread fills the tier after the last layer
    assert all(not isinstance(it, str) and it is not None for it in st.cache.resolve([engine.cache_key(d) for d in DOCS]))


def test_reader_runs_ahead_of_the_consumer(tmp_path):
    st, engine = _engine_with_store(tmp_path)
    for d in DOCS:
        engine.get_or_encode(d)
    keys = [engine.cache_key(d) for d in DOCS]
    read_at: list[float] = []
    orig = st.blobs.iter_layers

    def timed(key, dtype=None):
        for kv in orig(key, dtype):
            read_at.append(time.perf_counter())
            yield kv

    st.blobs.iter_layers = timed
    src = prefetch_layers(st.blobs, keys, depth=2)
    consumed_at = []
    for _ in src.layers:
        time.sleep(0.05)  # "compute" on this layer
        consumed_at.append(time.perf_counter())
    n_layers = engine.lm.num_layers
    assert len(consumed_at) == n_layers and src.num_tokens == [engine.document_ids(d).numel() for d in DOCS]
    # the last layer of every document was read before the consumer finished its first layer
    last_layer_reads = read_at[-len(keys):]
    assert max(last_layer_reads) < consumed_at[0]


def test_corrupt_layer_falls_back_to_encoding_and_is_counted(tmp_path):
    st, engine = _engine_with_store(tmp_path)
    ref, _ = engine.link_context(QUESTION, DOCS)
    key = engine.cache_key(DOCS[1])
    st.tiered.invalidate(key)
    db = st.blobs.env.db(b"blobs")

    def flip(txn):
        buf = bytearray(txn.get(f"{key}/L1".encode(), db=db))
        buf[-5] ^= 0xFF
        txn.put(f"{key}/L1".encode(), bytes(buf), db=db)

    st.blobs.env.write(flip)
    ctx, hits = engine.link_context(QUESTION, DOCS)
    assert st.blobs.checksum_failures == 1 and hits == 0
    assert torch.allclose(ctx.last_logits, ref.last_logits, atol=1e-5)
    assert st.blobs.contains(key)  # re-encoded and stored again
