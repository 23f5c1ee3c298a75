"""The document index contract, run against the embedded (LMDB) and the Redis backend."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from store.backends import open_index
from store.index.embedded import EmbeddedIndex
from store.index.document_index import DocumentRecord, is_corrupt
from store.keys import content_hash, simhash64

# A real server; tests write under a unique key prefix and delete it afterwards.
REDIS_URL = os.environ.get("KVLINK_RAG_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _redis_or_skip():
    try:
        import redis
    except ImportError as e:  # pragma: no cover - redis is a dependency
        pytest.skip(f"redis-py not installed: {e}")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=5, decode_responses=True)
    try:
        client.ping()
    except redis.exceptions.RedisError as e:
        pytest.skip(f"Redis server at {REDIS_URL} does not answer ({e}); start one to run the Redis index tests")
    return client


@pytest.fixture(params=["embedded", "redis"])
def index(request, lmdb_env, clock):
    if request.param == "embedded":
        yield EmbeddedIndex(lmdb_env, clock=clock)
        return
    from store.index.redis import RedisIndex

    idx = RedisIndex(_redis_or_skip(), prefix=f"kvlink-test-{uuid.uuid4().hex}:", clock=clock)
    try:
        yield idx
    finally:
        idx.drop_all()
        assert not list(idx.r.scan_iter(match=f"{idx.prefix}*"))
        idx.close()


def rec(doc_id: str, tenant: str = "t1", text: str | None = None, **kw) -> DocumentRecord:
    text = text if text is not None else f"text of {doc_id}"
    kw.setdefault("simhash", simhash64(text))
    return DocumentRecord(doc_id=doc_id, tenant=tenant, content_hash=content_hash(text), **kw)


def test_upsert_get_round_trip(index, clock):
    r = rec("d1", title="Title é", cache_key="ck-1", num_tokens=42, nbytes=1234, metadata={"src": "nq", "n": [1, 2]})
    r.simhash = (1 << 64) - 5  # needs all 64 bits
    stored = index.upsert(r)
    assert stored.created == clock.t and stored.updated == clock.t
    got = index.get("t1", "d1")
    assert got == stored
    assert got.metadata == {"src": "nq", "n": [1, 2]} and got.simhash == (1 << 64) - 5 and got.status == "queued"
    assert index.get("t1", "nope") is None and index.get("t2", "d1") is None
    # Re-upsert keeps created and hits, refreshes updated.
    index.incr_hits("t1", "d1", 3)
    clock.advance(10)
    again = index.upsert(rec("d1", title="new"))
    assert (again.created, again.updated, again.hits, again.title) == (stored.created, clock.t, 3, "new")


def test_list_count_tenants(index):
    for d in ["b", "a", "c:1", "d é"]:
        index.upsert(rec(d))
    index.upsert(rec("z", tenant="t2"))
    assert [r.doc_id for r in index.list("t1")] == ["a", "b", "c:1", "d é"]
    assert [r.doc_id for r in index.list("t1", offset=1, limit=2)] == ["b", "c:1"]
    assert index.list("t1", offset=10) == []
    assert (index.count("t1"), index.count("t2"), index.count("t3")) == (4, 1, 0)
    assert index.tenants() == ["t1", "t2"]


def test_delete_removes_secondary_entries(index):
    r = index.upsert(rec("d1", cache_key="ck-1"))
    assert index.delete("t1", "d1") is True and index.delete("t1", "d1") is False
    assert index.get("t1", "d1") is None
    assert index.find_by_content_hash("t1", r.content_hash) == []
    assert index.find_by_cache_key("ck-1") == []
    assert index.near_duplicates(r.simhash, "t1") == []
    assert index.count("t1") == 0 and index.tenants() == []


def test_set_status_checks_version_and_updates_secondaries(index, clock):
    index.upsert(rec("d1", version=2, cache_key="old"))
    clock.advance(5)
    assert index.set_status("t1", "d1", "ready", version=1, cache_key="late") is None  # outdated worker
    done = index.set_status("t1", "d1", "ready", version=2, cache_key="new", num_tokens=77)
    assert (done.status, done.cache_key, done.num_tokens, done.updated) == ("ready", "new", 77, clock.t)
    assert index.get("t1", "d1") == done
    assert index.find_by_cache_key("new") == [("t1", "d1")] and index.find_by_cache_key("old") == []
    assert index.set_status("t1", "d1", "stale").status == "stale"  # no version: unconditional
    assert index.set_status("t1", "missing", "ready") is None
    with pytest.raises(ValueError):
        index.set_status("t1", "d1", "done")
    with pytest.raises(ValueError):
        index.set_status("t1", "d1", "ready", doc_id="other")
    with pytest.raises(ValueError):
        index.set_status("t1", "d1", "ready", colour="red")


def test_incr_hits(index):
    index.upsert(rec("d1"))
    assert index.incr_hits("t1", "d1") == 1
    assert index.incr_hits("t1", "d1", 4) == 5
    assert index.incr_hits("t1", "missing") is None and index.get("t1", "missing") is None
    threads = [threading.Thread(target=lambda: [index.incr_hits("t1", "d1") for _ in range(25)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert index.get("t1", "d1").hits == 105


def test_find_by_content_hash_and_cache_key(index):
    index.upsert(rec("a", text="same text", cache_key="k1"))
    index.upsert(rec("b", text="  same text\r\n", cache_key="k1"))  # same normalised text
    index.upsert(rec("c", text="other text", cache_key="k2"))
    index.upsert(rec("x:1", tenant="t:2", text="same text", cache_key="k1"))
    assert [r.doc_id for r in index.find_by_content_hash("t1", content_hash("same text"))] == ["a", "b"]
    assert [r.doc_id for r in index.find_by_content_hash("t:2", content_hash("same text"))] == ["x:1"]
    assert index.find_by_cache_key("k1") == [("t1", "a"), ("t1", "b"), ("t:2", "x:1")]


def test_near_duplicates_by_bands(index):
    base = 0x0123_4567_89AB_CDEF
    one_band = base ^ 0b111  # 3 bits, all in band 0: bands 1-3 still match
    spread3 = base ^ (1 | 1 << 16 | 1 << 32)  # 3 bits in 3 bands: band 3 matches
    spread4 = base ^ (1 | 1 << 16 | 1 << 32 | 1 << 48)  # 4 bits, one per band: no band matches
    for doc_id, h in [("base", base), ("one_band", one_band), ("spread3", spread3), ("spread4", spread4)]:
        index.upsert(rec(doc_id, simhash=h))
    index.upsert(rec("other-tenant", tenant="t2", simhash=base))
    index.upsert(rec("far", simhash=base ^ 0xFFFF_0000_FFFF_0000))
    assert index.near_duplicates(base, "t1") == [("base", 0), ("one_band", 3), ("spread3", 3)]
    assert index.near_duplicates(base, "t1", max_distance=1) == [("base", 0)]
    # Beyond the band radius the tenant is scanned.
    assert index.near_duplicates(base, "t1", max_distance=4) == [
        ("base", 0),
        ("one_band", 3),
        ("spread3", 3),
        ("spread4", 4),
    ]
    assert index.near_duplicates(base, "t3") == []


def test_near_duplicate_of_a_text_with_one_word_changed(index, texts):
    index.upsert(rec("amazon", text=texts.amazon))
    index.upsert(rec("photo", text=texts.photosynthesis))
    edited = texts.amazon.replace("seven million", "eight million")
    assert index.near_duplicates(simhash64(edited), "t1") == [("amazon", 3)]
    assert index.find_by_content_hash("t1", content_hash(edited)) == []  # only a hint, never a cache


def test_record_validation():
    with pytest.raises(ValueError):
        DocumentRecord(doc_id="", tenant="t")
    with pytest.raises(ValueError):
        DocumentRecord(doc_id="a\0b", tenant="t")
    with pytest.raises(ValueError):
        DocumentRecord(doc_id="a", tenant="t", status="done")
    with pytest.raises(ValueError):
        DocumentRecord(doc_id="a", tenant="t", simhash=-1)


def test_open_index_by_url(tmp_path, lmdb_env):
    idx = open_index(f"lmdb://{tmp_path / 'store'}", env=lmdb_env)
    assert isinstance(idx, EmbeddedIndex) and idx.env is lmdb_env
    idx2 = open_index(f"lmdb://{tmp_path / 'store'}")  # same folder: the same process-wide env
    assert idx2.env is lmdb_env
    with pytest.raises(ValueError):
        open_index("memcached://localhost")
    _redis_or_skip()
    prefix = f"kvlink-test-{uuid.uuid4().hex}:"
    r = open_index(f"{REDIS_URL}?prefix={prefix}")
    try:
        assert r.prefix == prefix
        r.upsert(rec("d1"))
        assert r.get("t1", "d1").doc_id == "d1"
    finally:
        r.drop_all()
        r.close()


def test_embedded_index_writes_survive_a_blob_store_at_its_limit(tmp_path, make_kv):
    from store.blobs.lmdb import LmdbBlobStore
    from store.lmdb_env import open_env

    env = open_env(tmp_path / "full", map_size=256 << 10, max_map_size=512 << 10)
    blobs = LmdbBlobStore(env)
    idx = EmbeddedIndex(env)
    for i in range(8):  # ~131 KB each: fills the 512 KiB map and evicts
        blobs.put(f"d{i}", make_kv(layers=2, heads=2, tokens=256, dim=16, seed=i))
    before = blobs.evictions
    for i in range(300):  # ~0.5 KB each (checksummed) in four sub-databases; blobs make room
        idx.upsert(rec(f"doc-{i:04d}", metadata={"pad": "x" * 250}))
    assert idx.count("t1") == 300 and blobs.evictions > before
    env.close()


def _flip(index, tenant: str, doc_id: str, old: str, new: str) -> None:
    """Change a few stored bytes of a record behind the index's back (one flipped character)."""
    if isinstance(index, EmbeddedIndex):
        key = f"{tenant}\0{doc_id}".encode()

        def write(txn):
            raw = bytes(txn.get(key, db=index._rec))
            assert old.encode() in raw
            txn.put(key, raw.replace(old.encode(), new.encode()), db=index._rec)

        index.env.write(write)
        return
    h = index.r.hgetall(index._doc(tenant, doc_id))
    name = next(k for k, v in h.items() if old in v)
    index.r.hset(index._doc(tenant, doc_id), name, h[name].replace(old, new))


def test_a_corrupt_record_is_reported_failed_and_the_tenant_keeps_working(index):
    index.upsert(rec("a", title="KIWI42", cache_key="ck-a"))
    index.upsert(rec("b", cache_key="ck-b"))
    index.upsert(rec("c", tenant="t2"))
    _flip(index, "t1", "a", "KIWI42", "KIWI92")
    bad = index.get("t1", "a")
    assert is_corrupt(bad) and bad.status == "failed" and bad.title == ""  # never the altered title
    assert bad.metadata["error"] == "corrupt index record (checksum mismatch); re-ingest the document"
    assert [(r.doc_id, r.status) for r in index.list("t1")] == [("a", "failed"), ("b", "queued")]
    assert index.get("t1", "b").cache_key == "ck-b" and index.count("t1") == 2 and index.get("t2", "c")
    assert index.corrupt_reads == 2
    assert index.set_status("t1", "a", "ready") is None  # only a re-ingest (upsert) replaces it
    index.incr_hits("t1", "a")
    assert is_corrupt(index.get("t1", "a"))
    assert index.find_by_content_hash("t1", content_hash("text of a")) == []
    # re-ingesting replaces it and drops every secondary entry the lost record had
    index.upsert(rec("a", text="a new text"))
    assert index.get("t1", "a").content_hash == content_hash("a new text")
    assert index.find_by_cache_key("ck-a") == [] and index.find_by_cache_key("ck-b") == [("t1", "b")]
    assert [d for d, _ in index.near_duplicates(simhash64("text of a"), "t1", max_distance=0)] == []
    # and deleting a corrupt record removes its secondary entries as well
    index.upsert(rec("z", title="KIWI42", cache_key="ck-z"))
    _flip(index, "t1", "z", "KIWI42", "KIWI92")
    assert is_corrupt(index.pop("t1", "z")) and index.find_by_cache_key("ck-z") == []


def test_records_written_before_checksums_are_still_read(index):
    import json

    stored = index.upsert(rec("old", title="T", metadata={"m": 1}))
    if isinstance(index, EmbeddedIndex):
        index.env.write(lambda txn: txn.put(b"t1\0old", json.dumps(stored.to_dict()).encode(), db=index._rec))
    else:
        index.r.hdel(index._doc("t1", "old"), "_sum")
    assert index.get("t1", "old") == stored and index.corrupt_reads == 0


def test_swap_and_pop_return_the_record_they_replaced(index):
    first, before = index.swap(rec("d1", cache_key="ck-1"))
    assert before is None
    index.set_status("t1", "d1", "ready", cache_key="ck-2")  # a worker, after the caller's own read
    stored, replaced = index.swap(rec("d1", version=2))
    assert replaced.cache_key == "ck-2" and stored.version == 2 and stored.created == first.created
    assert index.pop("t1", "d1") == stored and index.pop("t1", "d1") is None


def test_a_chunked_documents_record_is_found_by_each_of_its_chunk_keys(index):
    index.upsert(rec("d1", cache_key="c1 c2 c3"))
    assert index.get("t1", "d1").cache_keys == ["c1", "c2", "c3"]
    assert [index.find_by_cache_key(k) for k in ("c1", "c2", "c3")] == [[("t1", "d1")]] * 3
    index.set_status("t1", "d1", "ready", cache_key="c1 c4 c3")  # an update replaced the middle chunk
    assert index.find_by_cache_key("c2") == [] and index.find_by_cache_key("c4") == [("t1", "d1")]
    index.pop("t1", "d1")
    assert [index.find_by_cache_key(k) for k in ("c1", "c3", "c4")] == [[], [], []]
