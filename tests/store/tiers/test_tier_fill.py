"""The memory-tier filler: fills in order on one low-priority thread, queues a key once while it waits, and
logs (never raises) a failed read."""

from __future__ import annotations

import threading

from store.tiers.tier_fill import _TierFiller


def test_fills_each_key_once_while_it_waits_and_skips_what_is_gone():
    filler = _TierFiller()
    gate = threading.Event()
    got: list[tuple[str, object]] = []

    def get(key):
        gate.wait(5)
        return None if key == "gone" else f"kv-{key}"

    def on_loaded(key, kv):
        got.append((key, kv))

    for key in ("a", "b", "a", "gone", "b"):
        filler.submit(key, get, on_loaded)
    gate.set()
    filler.join()
    assert got == [("a", "kv-a"), ("b", "kv-b")]
    filler.submit("a", get, on_loaded)  # done before: queued again
    filler.join()
    assert got[-1] == ("a", "kv-a")


def test_a_failed_read_is_logged_and_the_next_fill_still_runs(caplog):
    filler = _TierFiller()
    got = []

    def get(key):
        if key == "bad":
            raise OSError("disk gone")
        return key

    filler.submit("bad", get, lambda k, kv: got.append(k))
    filler.submit("ok", get, lambda k, kv: got.append(k))
    filler.join()
    assert got == ["ok"] and "filling the memory tiers with bad failed" in caplog.text


def test_close_drops_the_fills_not_begun_and_ends_the_thread():
    filler = _TierFiller()
    started, gate = threading.Event(), threading.Event()
    got = []

    def get(key):
        started.set()
        gate.wait(5)
        return key

    filler.submit("first", get, lambda k, kv: got.append(k))
    filler.submit("second", get, lambda k, kv: got.append(k))
    assert started.wait(5)
    closer = threading.Thread(target=filler.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert not closer.is_alive() and not filler.thread.is_alive()
    assert got == ["first"]  # the fill in progress finished, the one waiting was dropped
    filler.submit("third", get, lambda k, kv: got.append(k))  # closed: nothing more is queued
    assert got == ["first"] and filler.queue.unfinished_tasks == 0


def test_a_key_waits_once_per_store_cache_across_streams(tmp_path):
    """The store cache hands its bound method to every stream: equal, so a key queued by one stream and asked
    again by the next is filled once."""
    from store.blobs.lmdb import LmdbBlobStore
    from store.doc_cache import StoreCache
    from store.tiers.tier import CacheTier
    from store.tiers.tiered import TieredCache

    cache = StoreCache(TieredCache([CacheTier("host", 1 << 20)], blob_store=LmdbBlobStore(str(tmp_path))))
    assert cache._loaded == cache._loaded and cache._loaded is not cache._loaded
    filler, gate, reads = _TierFiller(), threading.Event(), []

    def get(key):
        gate.wait(5)
        reads.append(key)
        return None

    filler.submit("busy", get, cache._loaded)  # the thread waits on this one
    filler.submit("k", get, cache._loaded)
    filler.submit("k", get, cache._loaded)
    gate.set()
    filler.join()
    assert reads == ["busy", "k"]

