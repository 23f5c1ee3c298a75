"""The engine's store-backed cache: the cache contract, one write path, int8 served the same before and after
a restart."""

from __future__ import annotations

import torch

from factories import tiny_text_engine
from kvlink_rag.cache import DocumentCache
from store.settings import StoreSettings
from kvlink_rag.types import Document
from service.documents import DocumentService
from store.doc_cache import StoreCache
from store.factory import open_store
from store.blobs.lmdb import LmdbBlobStore


def test_int8_cache_serves_the_round_trip_from_memory_and_disk(tmp_path):
    settings = StoreSettings(home=tmp_path, store_int8=True, store_max_bytes=64 << 20)
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
    isolated = open_store(StoreSettings(home=tmp_path / "a", store_max_bytes=64 << 20)).cache
    shared = open_store(StoreSettings(home=tmp_path / "b", store_max_bytes=64 << 20,
                                 shared_cache_across_tenants=True)).cache
    assert isolated.for_tenant("A").key("fp", text) != isolated.for_tenant("B").key("fp", text)
    assert shared.for_tenant("A").key("fp", text) == shared.for_tenant("B").key("fp", text)
    assert isolated.key("fp", text) == shared.key("fp", text)  # the default tenant (CLI): unchanged keys


def test_store_cache_implements_the_document_cache_contract(tmp_path):
    cache = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20)).cache
    assert isinstance(cache, DocumentCache) and isinstance(cache.for_tenant("acme"), DocumentCache)
    assert all(name in vars(StoreCache) for name in ("key", "get", "put", "resolve", "stream"))


def test_every_cache_write_goes_through_store_cache_write(tmp_path, monkeypatch):
    """Precompute (catalog) and the query path (a document encoded on the spot) both write through
    ``StoreCache.write``: the blob store is never written to around it."""
    writes, puts = [], []

    def recorded(method, calls):
        def wrapper(self, key, kv, **kw):
            calls.append(key)
            return method(self, key, kv, **kw)
        return wrapper

    monkeypatch.setattr(StoreCache, "write", recorded(StoreCache.write, writes))
    monkeypatch.setattr(LmdbBlobStore, "put", recorded(LmdbBlobStore.put, puts))
    queue = []
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20),
                    enqueue=lambda *task: queue.append(task))
    engine = tiny_text_engine(tmp_path)
    engine.cache = st.cache.for_tenant("acme")
    DocumentService(st).ingest("acme", "a", "Ada Lovelace wrote the first published algorithm.")
    ready = DocumentService(st, engine).precompute(*queue.pop())
    _, hit = engine.get_or_encode(Document("Babbage designed the Analytical Engine in 1837."))
    assert not hit and len(writes) == 2 and writes[0] == ready.cache_key
    assert puts == writes and sorted(st.blobs.keys()) == sorted(writes)
