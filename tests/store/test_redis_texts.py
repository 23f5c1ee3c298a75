"""Texts in Redis beside a Redis index: every host reads them; checksummed like the LMDB texts; the store
opens them when the index URL is Redis."""

from __future__ import annotations

import pytest

from store.settings import StoreSettings
from redis_servers import private_redis
from store.factory import open_store
from store.integrity import CorruptEntry
from store.redis_texts import RedisTextStore
from store.texts import TextStore


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from private_redis(tmp_path_factory.mktemp("redis"))


def test_texts_round_trip_page_in_key_order_and_a_flipped_byte_is_reported(server):
    texts = RedisTextStore.from_url(server.url(6) + "?prefix=tx:")
    assert texts.empty()
    texts.put("t", "code", 3, "The door code is KIWI42.", "Codes", {"src": "memo"})
    texts.put("t", "a:b/c", 1, "Another text.")
    assert texts.get("t", "code") == {"version": 3, "text": "The door code is KIWI42.", "title": "Codes",
                                      "metadata": {"src": "memo"}}
    r, key = server.client(db=6), texts._key("t", "code")
    r.set(key, r.get(key).replace(b"KIWI42", b"KIWI92"))
    with pytest.raises(CorruptEntry, match="checksum mismatch"):
        texts.get("t", "code")
    assert texts.corrupt_reads == 1
    for i in range(300):  # more than one page
        texts.put("u", f"d{i:04d}", 1, f"text {i}")
    rows = list(texts.items())
    assert [(t, d) for t, d, _ in rows][:2] == [("t", "a:b/c"), ("t", "code")] and len(rows) == 302
    assert isinstance(rows[1][2], CorruptEntry) and rows[2][2]["text"] == "text 0"
    assert texts.delete("t", "code") and not texts.delete("t", "code") and texts.get("t", "code") is None
    assert not texts.empty()


def test_the_store_keeps_texts_in_redis_with_a_redis_index_and_in_lmdb_without(server, tmp_path):
    st = open_store(StoreSettings(home=tmp_path / "a", index_url=server.url(7), store_max_bytes=64 << 20))
    assert isinstance(st.texts, RedisTextStore) and st.shared is None
    st.texts.put("t", "d", 1, "shared text")
    other = open_store(StoreSettings(home=tmp_path / "b", index_url=server.url(7), store_max_bytes=64 << 20))
    assert other.texts.get("t", "d")["text"] == "shared text"  # another home, the same texts
    server.client(db=7).flushdb()
    assert isinstance(open_store(StoreSettings(home=tmp_path / "c", store_max_bytes=64 << 20)).texts,
                      TextStore)


def test_texts_are_mirrored_locally_for_a_redis_outage_and_seeded_from_a_local_store(tmp_path, lmdb_env):
    from redis_servers import RedisServer

    server = RedisServer(tmp_path / "redis").start()
    local = TextStore(lmdb_env)
    local.put("t", "old", 1, "written before texts moved to Redis")
    texts = RedisTextStore.from_url(server.url(0), local=local)
    assert texts.seed_from_local() == 1 and texts.get("t", "old")["text"].startswith("written before")
    assert texts.seed_from_local() == 0  # Redis has texts now
    texts.put("t", "mine", 1, "written here")
    other = RedisTextStore.from_url(server.url(0))
    other.put("t", "theirs", 2, "written on another host")
    assert texts.get("t", "theirs")["version"] == 2  # read once: mirrored
    other.put("t", "gone", 1, "deleted on the other host")
    texts.get("t", "gone")
    other.delete("t", "gone")
    assert texts.get("t", "gone") is None and texts.last_known("t", "gone")["version"] == 1  # Redis decides
    assert texts.delete("t", "gone") and texts.last_known("t", "gone") is None  # a delete here clears the mirror
    server.stop()
    assert texts.get("t", "mine")["text"] == "written here" and texts.get("t", "theirs")["version"] == 2
    import redis

    with pytest.raises(redis.exceptions.ConnectionError):
        texts.get("t", "never-read-here")  # not a 404: the service answers 503
