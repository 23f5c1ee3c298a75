"""The engine's store-backed cache: int8 served the same before and after a restart."""

from __future__ import annotations

import torch

from factories import tiny_text_engine
from kvlink_rag.engine import Document
from kvlink_rag.settings import Settings
from store.factory import open_store


def test_int8_cache_serves_the_round_trip_from_memory_and_disk(tmp_path):
    settings = Settings(home=tmp_path, model="unused", store_int8=True, store_max_bytes=64 << 20)
    st = open_store(settings)
    engine = tiny_text_engine(tmp_path)
    engine.cache = st.cache
    doc = Document("Int8 caches hold one byte per element plus scales.", "Quant")
    fresh = engine.encode(doc)
    key = engine.cache_key(doc)
    st.cache.put(key, fresh)
    from_tier = st.cache.get(key)
    from_disk = st.blobs.get(key, fresh.dtype)
    assert torch.equal(from_tier.keys, from_disk.keys) and torch.equal(from_tier.values, from_disk.values)
    err = (from_disk.keys.float() - fresh.keys.float()).abs().max() / fresh.keys.float().abs().max()
    assert 0 < err < 0.02  # quantised, and close
    assert st.blobs.meta(key)["dtype"] == "int8"


def test_tenant_views_key_the_same_text_apart_unless_shared(tmp_path):
    text = "The door code is KIWI42."
    isolated = open_store(Settings(home=tmp_path / "a", model="unused", store_max_bytes=64 << 20)).cache
    shared = open_store(Settings(home=tmp_path / "b", model="unused", store_max_bytes=64 << 20,
                                 shared_cache_across_tenants=True)).cache
    assert isolated.for_tenant("A").key("fp", text) != isolated.for_tenant("B").key("fp", text)
    assert shared.for_tenant("A").key("fp", text) == shared.for_tenant("B").key("fp", text)
    assert isolated.key("fp", text) == shared.key("fp", text)  # the default tenant (CLI): unchanged keys
