"""Importance-ordered records: round trips, prefix reads that need only the kept tokens' bytes, chunk
checksums, old records read in positional order, and LMDB streams at a retention below 1."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvlink_rag.retention import kept_positions, retention_order
from kvlink_rag.types import LayeredDocuments
from store.records import codec, ordered_layout
from store.records.layer_decode import decode_layer_into, decode_layers_into
from store.records.errors import CorruptRecordError
from store.doc_cache import StoreCache
from store.blobs.lmdb import LmdbBlobStore
from store.tiers.prefetch import prefetch_layers
from store.tiers.tier import CacheTier
from store.tiers.tiered import TieredCache


def _scored(make_kv, seed: int = 0, tokens: int = 40, dtype=torch.float32):
    kv = make_kv(tokens=tokens, dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    return dataclasses.replace(kv, importance=torch.rand(tokens, generator=g))


@pytest.fixture
def blobs(lmdb_env, clock):
    store = LmdbBlobStore(lmdb_env, clock=clock)
    yield store
    store.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ordered_record_reads_back_bit_exact_in_positional_order(blobs, make_kv, same_kv, dtype):
    kv = _scored(make_kv, dtype=dtype)
    blobs.put("doc", kv)
    meta = blobs.meta("doc")
    assert meta["format_version"] == codec.FORMAT_VERSION and len(meta["token_order"]) == 40
    assert len(meta["checksum"]["chunks"]) == 3 and len(meta["checksum"]["chunks"][0]) == ordered_layout.CHUNKS
    got = blobs.get("doc")
    same_kv(got, kv)
    # the stored scores are their rank: the same keep order as the original scores
    assert torch.equal(kept_positions(got.importance, 40, 0.3), kept_positions(kv.importance, 40, 0.3))
    for (k, v), i in zip(blobs.iter_layers("doc"), range(3)):
        assert torch.equal(k, kv.keys[i]) and torch.equal(v, kv.values[i])


def test_whole_document_gather_refuses_a_layer_that_does_not_fit_its_outputs(make_kv):
    kv = _scored(make_kv)
    meta, _, layers = codec.encode_document(kv)
    keys, values = torch.empty_like(kv.keys), torch.empty_like(kv.values)
    decode_layers_into(layers, meta, keys, values)  # the fast path: rows gathered straight into place
    assert torch.equal(keys, kv.keys) and torch.equal(values, kv.values)
    inverse = torch.argsort(ordered_layout.token_order(meta))
    with pytest.raises(CorruptRecordError, match="does not fit"):
        ordered_layout.gather_layer_into(layers[0], inverse, keys[0, :, :-1], values[0, :, :-1])


def test_int8_ordered_record_equals_the_positional_int8_round_trip(blobs, make_kv):
    kv = _scored(make_kv)
    blobs.put("ordered", kv, int8=True)
    blobs.put("plain", dataclasses.replace(kv, importance=None), int8=True)
    a, b = blobs.get("ordered", torch.float32), blobs.get("plain", torch.float32)
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    pos, layers = blobs.iter_retained_layers("ordered", 0.4, torch.float32)
    for i, (k, v) in enumerate(layers):
        assert torch.equal(k, b.keys[i][:, pos]) and torch.equal(v, b.values[i][:, pos])


def test_prefix_read_needs_only_the_kept_tokens_bytes(make_kv):
    kv = _scored(make_kv)
    meta, _, layers = codec.encode_document(kv)
    buf = bytearray(layers[0])
    data, tensors = ordered_layout._tensors(bytes(buf))
    cut = ordered_layout.chunk_bounds(40)[4]  # r = 0.4 reads chunks 0..3: tokens [0, 16)
    untouched = 0
    for name, _, _, start, end in tensors:
        row = (end - start) // 40
        buf[data + start + cut * row:data + end] = b"\xff" * (end - start - cut * row)  # garbage past the prefix
        untouched += end - start - cut * row
    assert 0.55 < untouched / len(buf) < 0.65  # 60% of the layer's bytes are never read at r = 0.4
    k, v = ordered_layout.decode_ordered_prefix(bytes(buf), meta, 0, 0.4, torch.float32)
    pos = ordered_layout.retained_positions(meta, 0.4)
    assert torch.equal(pos, kept_positions(kv.importance, 40, 0.4)) and pos.numel() == 16
    assert torch.equal(k, kv.keys[0][:, pos]) and torch.equal(v, kv.values[0][:, pos])
    with pytest.raises(CorruptRecordError):
        ordered_layout.decode_ordered_prefix(bytes(buf), meta, 0, 0.5, torch.float32)  # touches a bad chunk
    with pytest.raises(CorruptRecordError):
        decode_layer_into(bytes(buf), meta, 0, torch.empty(2, 40, 8), torch.empty(2, 40, 8))


def test_record_without_scores_keeps_positional_order(blobs, make_kv):
    kv = make_kv(tokens=20)
    blobs.put("old", kv)
    assert "token_order" not in blobs.meta("old") and blobs.get("old").importance is None
    pos, layers = blobs.iter_retained_layers("old", 0.5)
    assert pos.tolist() == list(range(10))
    assert torch.equal(next(layers)[0], kv.keys[0][:, :10])


def test_lmdb_stream_at_partial_retention_equals_the_in_memory_selection(blobs, make_kv):
    docs = [_scored(make_kv, seed=s, tokens=n) for s, n in ((1, 40), (2, 13))]
    blobs.put("a", docs[0])
    memory = LayeredDocuments.from_documents(docs, retention=0.6)
    streamed = prefetch_layers(blobs, ["a", docs[1]], retention=0.6)
    assert streamed.num_tokens == memory.num_tokens == [24, 8] and streamed.doc_lengths == [40, 13]
    assert all(torch.equal(a, b) for a, b in zip(streamed.positions, memory.positions))
    for (k1, v1), (k2, v2) in zip(streamed.layers, memory.layers):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_store_cache_stream_at_full_retention_streams_every_token_as_stored(blobs, make_kv):
    docs = [_scored(make_kv, seed=s) for s in (1, 2)]
    cache = StoreCache(TieredCache([CacheTier("host", 1 << 20)], blob_store=blobs))
    for i, kv in enumerate(docs):
        blobs.put(f"d{i}", kv)
    streamed = cache.stream(["d0", "d1"], retention=1.0)
    # every token, in the records' stored (retention) order, the order carried as positions: no gather
    orders = [retention_order(kv.importance, kv.num_tokens) for kv in docs]
    assert [p.tolist() for p in streamed.positions] == [o.tolist() for o in orders]
    assert streamed.num_tokens == streamed.layout_lengths == [kv.num_tokens for kv in docs]
    for i, (k, v) in enumerate(streamed.layers):
        assert torch.equal(k, torch.cat([kv.keys[i][:, o] for kv, o in zip(docs, orders)], dim=1))
        assert torch.equal(v, torch.cat([kv.values[i][:, o] for kv, o in zip(docs, orders)], dim=1))


def test_token_order_is_a_fresh_tensor_each_call_and_a_bad_order_still_raises():
    import pytest

    from store.records.errors import CorruptRecordError
    from store.records.ordered_layout import token_order

    meta = {"shape": [2, 1, 4, 8], "token_order": [2, 0, 3, 1]}
    first = token_order(meta)
    first[0] = 99  # a caller's change never reaches the next reader
    assert token_order(meta).tolist() == [2, 0, 3, 1]
    for _ in range(2):  # not memoised as good
        with pytest.raises(CorruptRecordError):
            token_order({"shape": [2, 1, 4, 8], "token_order": [0, 0, 3, 1]})
