"""Layer-wise prefetch from LMDB: same linked result as in memory, overlap with compute, corrupt fallback."""

from __future__ import annotations

import time

import pytest
import torch

from factories import tiny_text_engine
from store.settings import StoreSettings
from kvlink_rag.types import Document
from store.factory import open_store
from store.tiers.prefetch import prefetch_layers
from store.blobs.lmdb_records import decode_layer_stored_into as _DECODE
from store.tiers.tier_fill import TIER_FILLER

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
    # the records stream in their stored (importance) order with the positions as data: the same attention,
    # summed in another order (float32 rounding apart)
    assert torch.allclose(streamed.last_logits, in_memory.last_logits, atol=1e-5)
    assert torch.allclose(first.last_logits, streamed.last_logits, atol=1e-5)
    keys = [engine.cache_key(d) for d in DOCS]
    TIER_FILLER.join()  # the tiers are filled after the last layer, by a low-priority thread
    held = st.cache.resolve(keys)
    assert all(not isinstance(it, str) and it is not None for it in held)
    for key, kv in zip(keys, held):  # the tier holds each document in position order, as stored
        assert torch.equal(kv.keys, st.blobs.get(key).keys) and torch.equal(kv.values, st.blobs.get(key).values)


def test_ordered_records_stream_as_stored_with_their_positions(tmp_path):
    st, engine = _engine_with_store(tmp_path)
    kvs = [engine.get_or_encode(d)[0] for d in DOCS]
    keys = [engine.cache_key(d) for d in DOCS]
    metas = [st.blobs.meta(k) for k in keys]
    assert all("token_order" in m for m in metas)  # the default records are importance-ordered
    src = prefetch_layers(st.blobs, keys)
    assert src.positions is not None
    for j, m in enumerate(metas):
        assert src.offsets(j).tolist() == m["token_order"]
    bounds = [0]
    for kv in kvs:
        bounds.append(bounds[-1] + kv.num_tokens)
    for i, (k, v) in enumerate(src.layers):  # k, v: [kv_heads, tokens, head_dim], row r at offsets[r]
        for j, kv in enumerate(kvs):
            order = src.offsets(j)
            assert torch.equal(k[:, bounds[j]:bounds[j + 1]], kv.keys[i][:, order])
            assert torch.equal(v[:, bounds[j]:bounds[j + 1]], kv.values[i][:, order])


def test_reader_runs_ahead_of_the_consumer(tmp_path):
    st, engine = _engine_with_store(tmp_path)
    for d in DOCS:
        engine.get_or_encode(d)
    keys = [engine.cache_key(d) for d in DOCS]
    read_at: list[float] = []
    orig = st.blobs.iter_stored_layers

    def timed(key):
        order, fills = orig(key)

        def stamped(fill):
            def run(k_out, v_out, *writers):  # a LayerFill: the writers and start passed on
                fill(k_out, v_out, *writers)
                read_at.append(time.perf_counter())
            return run

        return order, (stamped(f) for f in fills)

    st.blobs.iter_stored_layers = timed
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


@pytest.mark.parametrize("blocks", [torch.bfloat16, torch.float32])
def test_a_fill_with_writers_mixes_staged_and_decoded_documents_row_for_row(lmdb_env, clock, make_kv, monkeypatch,
                                                                           blocks):
    """Keyed bfloat16 records (staged: one write per writer and layer; widened on the way into float32 blocks), an
    int8 record (decoded on its own) and a document in memory, in one fill: each lands at its rows, keys rotated at
    them, as the writers write one."""
    import dataclasses

    from kvlink_rag.linking.rope import apply_rope
    from kvlink_rag.linking.rope_rows import block_writers
    from store.blobs import lmdb_records
    from store.blobs.lmdb import LmdbBlobStore

    decoded = []
    monkeypatch.setattr(lmdb_records, "decode_layer_stored_into",
                        lambda buf, meta, *a, **kw: decoded.append(meta["dtype"]) or _DECODE(buf, meta, *a, **kw))
    blobs = LmdbBlobStore(lmdb_env, clock=clock)
    kvs = [make_kv(tokens=n, dtype=torch.bfloat16, seed=s) for n, s in ((9, 0), (14, 1), (6, 2), (11, 3))]
    kvs[0] = dataclasses.replace(kvs[0], importance=torch.rand(9, generator=torch.Generator().manual_seed(5)))
    blobs.put("a", kvs[0])
    blobs.put("b", kvs[1], int8=True)
    blobs.put("c", kvs[2])
    items = ["a", "b", kvs[3], "c"]
    # position order, as the store serves them (the int8 record dequantised straight to the blocks' dtype)
    ref = [blobs.get("a"), blobs.get("b", dtype=blocks), kvs[3], blobs.get("c")]
    src = prefetch_layers(blobs, items, depth=0)
    L, H, _, D = kvs[0].keys.shape
    total = sum(src.num_tokens)
    cos, sin = torch.randn(total, D), torch.randn(total, D)
    keys, values = block_writers(cos, sin)
    starts = [0, 9, 23, 34]
    for i in range(L):
        k, v = torch.zeros(H, total + 2, D, dtype=blocks), torch.zeros(H, total + 2, D, dtype=blocks)
        src.fill(i, k[:, 1:1 + total], v[:, 1:1 + total], keys, values)
        for j, (kv, a) in enumerate(zip(ref, starts)):
            n, order = kv.num_tokens, src.offsets(j)
            want_k = apply_rope(kv.keys[i][:, order].float(), cos[a:a + n], sin[a:a + n]).to(blocks)
            assert torch.equal(k[:, 1 + a:1 + a + n], want_k)
            assert torch.equal(v[:, 1 + a:1 + a + n], kv.values[i][:, order].to(blocks))
        assert k[:, 0].abs().sum() == 0 and k[:, -1].abs().sum() == 0
    assert decoded == ["int8"] * L  # the bfloat16 records went as their rows, in either block dtype
    TIER_FILLER.join()
    blobs.close()
