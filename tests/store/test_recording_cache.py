"""RecordingCache: the cache contract forwarded explicitly, per-request hits and unstored reasons recorded."""

from __future__ import annotations

from factories import random_kv
from kvlink_rag.cache import DocumentCache, MemoryCache
from store.doc_cache import StoreCache
from store.blobs.lmdb import LmdbBlobStore
from store.lmdb_env import open_env
from store.recording_cache import RecordingCache
from store.tiers.tier import CacheTier
from store.tiers.tiered import TieredCache


def test_recording_cache_implements_the_contract_without_attribute_forwarding():
    rc = RecordingCache(MemoryCache())
    assert isinstance(rc, DocumentCache)
    assert all(name in vars(RecordingCache) for name in ("key", "get", "put", "resolve", "stream"))
    assert "__getattr__" not in vars(RecordingCache)


def test_hits_are_recorded_from_get_resolve_and_put():
    inner = MemoryCache()
    a, b = random_kv(seed=1), random_kv(seed=2)
    inner.put("a", a)
    rc = RecordingCache(inner)
    assert rc.key("fp", "text") == inner.key("fp", "text")
    assert rc.get("a") is a and rc.get("x") is None
    assert rc.resolve(["a", "b"]) == [a, None]
    assert rc.put("b", b) is None
    assert rc.hits == {"a": True, "x": False, "b": False} and rc.unstored == {}
    stream = rc.stream(["a", b])
    assert stream.num_tokens == [a.num_tokens, b.num_tokens]


def test_a_document_too_large_for_the_store_is_recorded_unstored(tmp_path):
    env = open_env(tmp_path / "tiny", map_size=256 << 10, max_map_size=512 << 10)
    blobs = LmdbBlobStore(env)
    rc = RecordingCache(StoreCache(TieredCache([CacheTier("host", 64 << 20)], blobs)))
    big = random_kv(layers=2, heads=2, tokens=4096, dim=16)  # 2 MiB of KV > the 512 KiB store
    reason = rc.put("big", big)
    assert reason is not None and "does not fit the document store" in reason
    assert rc.unstored == {"big": reason} and rc.hits == {"big": False}
    assert "big" not in blobs and rc.get("big") is big  # answered from the memory tier


def test_a_store_busy_with_an_older_reader_gives_a_busy_reason(tmp_path, monkeypatch):
    from store.doc_cache import BusyReason
    from store.lmdb_env import StoreBusyError

    blobs = LmdbBlobStore(open_env(tmp_path / "s"))
    rc = RecordingCache(StoreCache(TieredCache([CacheTier("host", 64 << 20)], blobs)))

    def busy(key, record):
        raise StoreBusyError("no room for k: pid 7 reads a snapshot older than the space freed")

    monkeypatch.setattr(blobs, "put_record", busy)
    kv = random_kv(seed=3)
    reason = rc.put("k", kv)
    assert isinstance(reason, BusyReason) and "pid 7 reads a snapshot older" in reason
    assert rc.unstored == {"k": reason} and rc.get("k") is kv  # answered from the memory tier
