"""Every entry a tier or the local LMDB store takes or loses is told to its CacheEvents listener."""

from factories import random_kv
from store.cache_events import NO_EVENTS, CacheEvents
from store.blobs.lmdb import LmdbBlobStore
from store.tiers.tier import CacheTier, entry_nbytes
from store.tiers.tiered import TieredCache


class Recorder:
    def __init__(self):
        self.log = []

    def stored(self, tier, key, tokens, nbytes):
        self.log.append(("stored", tier, key, tokens))

    def removed(self, tier, key):
        self.log.append(("removed", tier, key))


def test_inserts_evictions_demotions_and_removals_are_told():
    rec = Recorder()
    assert isinstance(rec, CacheEvents) and isinstance(NO_EVENTS, CacheEvents)
    size = entry_nbytes(random_kv(tokens=16))
    host = CacheTier("host", 2 * size, events=rec)
    lower = CacheTier("cold", 4 * size, events=rec)
    tiered = TieredCache([host, lower])
    for i in range(3):
        tiered.put(f"k{i}", random_kv(tokens=16, seed=i), "t")
    assert host.keys() == ["k1", "k2"] and "k0" in lower
    assert ("removed", "host", "k0") in rec.log and ("stored", "cold", "k0", 16) in rec.log
    assert [e for e in rec.log if e[:2] == ("stored", "host")] == [("stored", "host", f"k{i}", 16) for i in range(3)]
    tiered.invalidate("k1")
    assert rec.log[-2:] == [("removed", "host", "k1"), ("removed", "cold", "k1")]
    assert sorted(host.holdings()) == [("k2", 16)]


def test_the_local_store_tells_puts_deletes_and_evictions(lmdb_env):
    rec = Recorder()
    blobs = LmdbBlobStore(lmdb_env)
    blobs.cache_events = rec
    blobs.put("a", random_kv(tokens=8))
    assert blobs.delete("a") and not blobs.delete("a")
    assert rec.log == [("stored", "local", "a", 8), ("removed", "local", "a")]
    blobs.put("b", random_kv(tokens=8))
    blobs.evict(1)
    assert rec.log[-1] == ("removed", "local", "b")
