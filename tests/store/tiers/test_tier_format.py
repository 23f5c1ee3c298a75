"""Tier policy: a tier holding documents at a lower retention and int8 (the cold tier), its lookup semantics
(served only when it holds at least the request's retention), byte budgets, and the unchanged default path."""

from __future__ import annotations

import time

import pytest
import torch

from factories import random_kv, tiny_text_engine
from kvlink_rag.retention import kept_positions
from store.settings import StoreSettings
from kvlink_rag.types import Document, DocumentKV, LayeredDocuments, RetainedKV
from store.factory import open_store
from store.blobs.lmdb import LmdbBlobStore
from store.tiers.policies import FairPolicy
from store.records.quant import quantize_int8
from store.tiers.tier_format import HeldKV, TierFormat
from store.tiers.tier import CacheTier, entry_nbytes
from store.tiers.tiered import TieredCache

COLD = TierFormat(0.4, int8=True)


def scored_kv(seed: int = 0, tokens: int = 50, dtype=torch.bfloat16) -> DocumentKV:
    """A random document with importance scores (so retention follows a non-positional order)."""
    kv = random_kv(layers=3, heads=2, tokens=tokens, dim=16, dtype=dtype, seed=seed)
    imp = torch.rand(tokens, generator=torch.Generator().manual_seed(100 + seed))
    return DocumentKV(kv.keys, kv.values, kv.token_ids, kv.fingerprint, kv.encoding, imp)


def int8_tol(x: torch.Tensor) -> float:
    """Half a quantisation step of the widest group of ``x`` (per token), plus bf16 rounding of the result."""
    span = (x.float().amax(-1) - x.float().amin(-1)).max().item()
    return span / 255 / 2 + x.float().abs().max().item() * 2**-7


def test_cold_entry_holds_about_r_times_the_int8_bytes_of_a_full_entry():
    kv = scored_kv(tokens=200)
    full = entry_nbytes(kv)  # bf16: 3 * 2 * 200 * 16 * 2 * 2 bytes + ids
    tier = CacheTier("cold", 10 * full, fmt=COLD)
    held = tier.put("d", kv, "A")
    int8_whole = CacheTier("int8", 10 * full, fmt=TierFormat(1.0, int8=True)).put("d", kv, "A")
    assert isinstance(held, HeldKV) and held.positions.numel() == 80 and held.int8
    assert tier.stats()["used_bytes"] == held.nbytes
    kv_int8 = int8_whole.nbytes - int8_whole.token_ids.nbytes - int8_whole.positions.nbytes - kv.importance.nbytes
    kv_cold = held.nbytes - held.token_ids.nbytes - held.positions.nbytes - kv.importance.nbytes
    assert 0.40 <= kv_cold / kv_int8 <= 0.42  # 80 of 200 rows; the per-channel key scales are not cut
    assert 0.25 <= kv_int8 / kv.nbytes <= 0.6  # int8 + float16 scales vs bf16
    assert held.nbytes / full < 0.3  # what a cold entry costs next to a bf16 one, overheads included


@pytest.mark.parametrize("r", [0.1, 0.25, 0.4])
def test_request_at_or_below_the_held_retention_equals_the_store_read(lmdb_env, r):
    blobs = LmdbBlobStore(lmdb_env)
    kv = scored_kv()
    blobs.put("d", kv)
    cold = CacheTier("cold", 1 << 20, fmt=COLD)
    cache = TieredCache([cold], blobs)
    assert cache.get("d", "A") is not None and "d" in cold  # loaded whole, held at 0.4 int8
    got = cache.get("d", "A", retention=r)
    assert isinstance(got, RetainedKV) and got.doc_tokens == 50 and got.keys.dtype == torch.bfloat16
    pos, layers = blobs.iter_retained_layers("d", r)
    assert torch.equal(got.positions, pos)
    assert torch.equal(pos, kept_positions(kv.importance, 50, r))
    for i, (k, v) in enumerate(layers):  # k, v: [heads, kept, dim] read from the store's prefix
        assert (got.keys[i].float() - k.float()).abs().max() <= int8_tol(kv.keys[i].transpose(0, 1))
        assert (got.values[i].float() - v.float()).abs().max() <= int8_tol(kv.values[i])
        assert not torch.equal(got.values[i], v)  # int8, not a copy of the store's bf16
    assert cache.stats()["counters"] == {"load": 1, "hit_cold": 1}


def test_held_keys_are_quantised_per_channel_and_values_per_token():
    kv = scored_kv()
    held = CacheTier("cold", 1 << 20, fmt=COLD).put("d", kv, "A")
    idx = held.positions
    ref = quantize_int8(kv.keys[:, :, idx], axis="channel")
    assert torch.equal(held.keys.q, ref.q) and held.keys.scale.shape == (3, 2, 1, 16)
    assert held.values.axis == "token" and held.values.scale.shape == (3, 2, 20, 1)


def test_higher_retention_falls_through_to_the_store_at_full_precision(lmdb_env):
    blobs = LmdbBlobStore(lmdb_env)
    kv = scored_kv()
    blobs.put("d", kv)
    cold = CacheTier("cold", 1 << 20, fmt=COLD)
    cold.put("d", kv, "A")
    assert cold.get("d", "A", retention=0.6) is None
    assert cold.get("d", "A", retention=1.0) is None  # r=1 never gets a partial entry
    assert cold.get("d", "A", retention=0.2, method="random") is None  # another order: not a subset
    st = cold.stats()
    assert (st["partial_misses"], st["misses"], st["hits"]) == (3, 3, 0)
    cache = TieredCache([cold], blobs)
    whole = cache.get("d", "A", retention=0.6)
    assert isinstance(whole, DocumentKV) and torch.equal(whole.keys, kv.keys) and torch.equal(whole.values, kv.values)
    assert cache.stats()["counters"] == {"load": 1}
    assert cold.stats()["entries_by_retention"] == {"0.4": 1}  # still held at 0.4, not replaced
    with pytest.raises(ValueError, match="cannot serve"):
        cold.entries["d"].kv.materialise(0.6)


def test_retained_part_streams_like_the_whole_document_cut_at_r():
    kv = scored_kv(dtype=torch.float32)
    tier = CacheTier("cold", 1 << 20, fmt=TierFormat(0.4))  # native dtype, retention only
    tier.put("d", kv, "A")
    got = tier.get("d", "A", retention=0.3)
    a = LayeredDocuments.from_documents([kv, got], retention=0.3)
    b = LayeredDocuments.from_documents([kv, kv], retention=0.3)
    assert a.num_tokens == b.num_tokens and a.layout_lengths == b.layout_lengths == [50, 50]
    for (ka, va), (kb, vb) in zip(a.layers, b.layers):
        assert torch.equal(ka, kb) and torch.equal(va, vb)  # no int8: exactly the same tokens
    with pytest.raises(ValueError, match="cannot serve"):
        LayeredDocuments.from_documents([got], retention=0.4)  # a part is never served short
    with pytest.raises(ValueError, match="retention 1"):
        LayeredDocuments.from_documents([got], retention=1.0)


def test_byte_budgets_hold_under_lru_and_fair_eviction_with_held_entries():
    unit = CacheTier("x", 1 << 30, fmt=COLD).put("d", scored_kv(), "A").nbytes
    cold = CacheTier("cold", 4 * unit, FairPolicy(), fmt=COLD)
    for i in range(6):
        cold.put(f"a{i}", scored_kv(seed=i), "A")  # tenant A floods
    assert cold.used_bytes <= cold.byte_budget and len(cold) == 4
    for i in range(3):
        cold.put(f"b{i}", scored_kv(seed=10 + i), "B")
    st = cold.stats()
    assert st["used_bytes"] <= st["byte_budget"] and st["usage"] == {"A": 2 * unit, "B": 2 * unit}
    assert st["entries_by_retention"] == {"0.4": 4} and st["format"] == {"retention": 0.4, "dtype": "int8"}


def test_host_evictions_are_demoted_into_the_cold_tier_and_cold_hits_not_promoted():
    kv0, kv1 = scored_kv(0), scored_kv(1)
    host = CacheTier("host", entry_nbytes(kv0))
    cold = CacheTier("cold", 10 * entry_nbytes(kv0), fmt=COLD)
    cache = TieredCache([host, cold])
    host.put("d0", kv0, "A")
    host.put("d1", kv1, "A")  # d0 demoted into cold at 0.4 int8
    assert host.keys() == ["d1"] and cold.keys() == ["d0"]
    assert cold.stats()["used_bytes"] < entry_nbytes(kv0) * 0.3
    assert cache.get("d0", "A") is None  # r=1: a partial miss everywhere, and no store
    got = cache.get("d0", "A", retention=0.4)
    assert isinstance(got, RetainedKV) and host.keys() == ["d1"]  # not promoted into the full tier
    cold.put("d2", scored_kv(2), "A")
    assert cold.keys() == ["d0", "d2"]


def test_a_tier_refuses_an_entry_held_in_another_format():
    held = CacheTier("x", 1 << 20, fmt=COLD).put("d", scored_kv(), "A")
    for fmt in (TierFormat(), TierFormat(0.5, int8=True), TierFormat(0.4)):
        with pytest.raises(ValueError, match="holds"):
            CacheTier("y", 1 << 20, fmt=fmt).put("d", held, "A")
    assert CacheTier("z", 1 << 20, fmt=COLD).put("d", held, "A") is held


def test_default_tier_path_is_unchanged():
    kv = scored_kv()
    tier = CacheTier("host", 1 << 20)
    assert tier.format.lossless and tier.put("k", kv, "A") is kv and tier.get("k", "A") is kv
    assert tier.get("k", "A", retention=0.4) is kv  # a whole document serves any retention, cut by the caller
    assert tier.stats()["entries_by_retention"] == {"1": 1} and tier.stats()["partial_misses"] == 0


def test_engine_serves_cold_documents_at_low_retention_and_r1_from_the_store(tmp_path):
    doc = Document("The cold tier holds forty percent of the tokens of this document in int8 bytes. " * 3, "Cold")
    base = dict(store_max_bytes=64 << 20, host_cache_bytes=0)
    plain = open_store(StoreSettings(home=tmp_path / "a", **base))
    tiered = open_store(StoreSettings(home=tmp_path / "b", cold_cache_bytes=1 << 20, **base))
    assert [t.name for t in tiered.tiered.tiers] == ["host", "cold"]
    engine = tiny_text_engine(tmp_path)
    engine.cache = plain.cache
    key = engine.cache_key(doc)
    kv = engine.encode(doc)
    plain.cache.put(key, kv)
    ref1, _ = engine.link_context("What does the cold tier hold?", [doc], retention=1.0)
    ref4, _ = engine.link_context("What does the cold tier hold?", [doc], retention=0.4)
    engine.cache = tiered.cache
    tiered.cache.put(key, kv)
    cold = tiered.tiered.tiers[1]
    assert key in cold and key not in tiered.tiered.tiers[0]
    got4, hits = engine.link_context("What does the cold tier hold?", [doc], retention=0.4)
    assert hits == 1 and cold.stats()["hits"] == 1
    assert (got4.last_logits - ref4.last_logits).abs().max() < 0.05 * ref4.last_logits.abs().max()
    got1, hits = engine.link_context("What does the cold tier hold?", [doc], retention=1.0)
    assert hits == 1 and cold.stats()["partial_misses"] == 1  # read whole from the store
    assert torch.equal(got1.last_logits, ref1.last_logits)


def test_a_retained_store_read_fills_the_cold_tier_when_it_covers_the_held_retention(tmp_path):
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20, host_cache_bytes=0,
                             cold_cache_bytes=1 << 20))
    kv = scored_kv()
    st.blobs.put("d", kv)
    cold = st.tiered.tiers[-1]
    for r, filled in ((0.2, False), (0.5, True)):  # a read at 0.2 lacks tokens the 0.4 tier holds
        items = st.cache.resolve(["d"], r)
        assert items == ["d"]
        list(st.cache.stream(items, r).layers)
        for _ in range(100):  # the reader thread fills the tier after the last layer
            if "d" in cold:
                break
            time.sleep(0.02)
        assert ("d" in cold) is filled
    got = st.cache.resolve(["d"], 0.4)[0]
    pos, layers = st.blobs.iter_retained_layers("d", 0.4)
    assert isinstance(got, RetainedKV) and torch.equal(got.positions, pos)
    for i, (k, v) in enumerate(layers):
        assert (got.values[i].float() - v.float()).abs().max() <= int8_tol(kv.values[i])
    assert torch.equal(cold.entries["d"].kv.token_ids, kv.token_ids)
    list(st.cache.stream(["d"], 0.5, "random").layers)  # other methods fill nothing (not the stored order)


def test_store_reads_count_as_lmdb_hits_at_every_retention(tmp_path):
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20, host_cache_bytes=0))
    st.blobs.put("d", scored_kv())
    for n, r in enumerate((0.4, 0.7, 1.0), start=1):
        items = st.cache.resolve(["d"], r)
        assert items == ["d"]  # only LMDB has it (no host tier)
        list(st.cache.stream(items, r).layers)
        for _ in range(100):  # counted by the reader thread after the last layer
            if st.tiered.stats()["counters"].get("load") == n:
                break
            time.sleep(0.02)
        assert st.tiered.stats()["counters"].get("load") == n
    assert st.cache.resolve(["absent"], 0.4) == [None] and st.tiered.stats()["counters"]["miss"] == 1
