"""CacheTier and TieredCache: sharing, counters, devices, promotion, demotion, blob loads."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from store.blobs.lmdb import LmdbBlobStore
from store.tiers.tier import CacheTier, entry_nbytes
from store.tiers.tiered import TieredCache


def test_get_shares_the_object_and_counts_per_tenant(make_kv, clock):
    tier = CacheTier("host", 10_000, clock=clock)
    kv = make_kv()
    assert tier.put("k", kv, "A") is kv  # same device: no copy
    assert tier.get("k", "A") is kv and tier.get("k", "B") is kv
    assert tier.get("other", "B") is None
    st = tier.stats()
    assert (st["hits"], st["misses"], st["inserts"], st["entries"]) == (2, 1, 1, 1)
    assert st["tenants"] == {"A": {"inserts": 1, "hits": 1}, "B": {"hits": 1, "misses": 1}}
    assert st["used_bytes"] == entry_nbytes(kv) == kv.nbytes + 16 * 8 and st["usage"] == {"A": entry_nbytes(kv)}


def test_too_large_is_rejected(make_kv):
    tier = CacheTier("device", 100)
    assert tier.put("k", make_kv(), "A") is None and len(tier) == 0
    assert tier.stats()["rejected"] == 1


def test_put_moves_to_the_tier_device(make_kv):
    tier = CacheTier("device", 10_000, device="meta")  # a device without storage, on any machine
    kv = make_kv()
    cached = tier.put("k", kv, "A")
    assert cached.keys.device.type == "meta" and cached.values.device.type == "meta"
    assert kv.keys.device.type == "cpu"  # the caller's copy is untouched
    assert tier.get("k", "A") is cached


@pytest.fixture
def blob_docs(lmdb_env, make_kv):
    blobs = LmdbBlobStore(lmdb_env)
    docs = {f"d{i}": make_kv(seed=i, dtype=torch.bfloat16) for i in range(4)}
    for k, kv in docs.items():
        blobs.put(k, kv)
    return blobs, docs


def test_tiered_loads_promotes_and_demotes(blob_docs, make_kv, same_kv, clock):
    blobs, docs = blob_docs
    unit = entry_nbytes(docs["d0"])
    device = CacheTier("device", 2 * unit, clock=clock)
    host = CacheTier("host", 3 * unit, clock=clock)
    cache = TieredCache([device, host], blobs)

    d0 = cache.get("d0", "A")
    same_kv(d0, docs["d0"])
    assert "d0" in device and "d0" in host
    assert cache.get("d0", "A") is d0  # served by the device tier, shared
    cache.get("d1", "A")
    cache.get("d2", "A")  # device full: d0 leaves the device tier (still on host)
    assert device.keys() == ["d1", "d2"] and host.keys() == ["d0", "d1", "d2"]
    again = cache.get("d0", "A")  # host hit, promoted to device (evicting d1)
    same_kv(again, docs["d0"])
    assert device.keys() == ["d2", "d0"]
    assert cache.get("missing", "A") is None
    assert cache.stats()["counters"] == {"load": 3, "hit_device": 1, "hit_host": 1, "miss": 1}
    assert device.stats()["evictions"] == 2 and host.stats()["evictions"] == 0


def test_demotion_puts_device_evictions_into_host(make_kv, clock):
    device = CacheTier("device", 2 * entry_nbytes(make_kv()), clock=clock)
    host = CacheTier("host", 10 * entry_nbytes(make_kv()), clock=clock)
    cache = TieredCache([device, host])
    for i in range(3):
        device.put(f"k{i}", make_kv(seed=i), "A")  # straight into the device tier only
    assert device.keys() == ["k1", "k2"] and host.keys() == ["k0"]
    assert cache.get("k0", "A") is not None and cache.stats()["counters"] == {"hit_host": 1}


def test_pinned_across_tiers(make_kv, clock):
    unit = entry_nbytes(make_kv())
    device = CacheTier("device", unit, clock=clock)
    cache = TieredCache([device])
    cache.put("a", make_kv(), "A")
    with cache.pinned(["a"]):
        assert cache.put("b", make_kv(seed=1), "A") is not None  # the original is returned
        assert device.keys() == ["a"]
    cache.put("b", make_kv(seed=1), "A")
    assert device.keys() == ["b"]
    cache.invalidate("b")
    assert len(device) == 0


def test_concurrent_misses_share_one_blob_load(make_kv):
    kv = make_kv()

    class SlowStore:
        calls = 0

        def get(self, key, dtype=None):
            SlowStore.calls += 1
            time.sleep(0.2)
            return kv

    cache = TieredCache([CacheTier("host", 10_000)], SlowStore())
    barrier = threading.Barrier(4)
    results = []

    def worker():
        barrier.wait()
        results.append(cache.get("k", "A"))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert SlowStore.calls == 1
    assert len(results) == 4 and all(r is kv for r in results)
    assert cache.stats()["counters"] == {"load": 1, "load_shared": 3}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_tier_over_host_tier(make_kv, same_kv):
    kv = make_kv(dtype=torch.bfloat16)
    unit = entry_nbytes(kv)
    device = CacheTier("device", unit, device="cuda")
    host = CacheTier("host", 4 * unit)
    cache = TieredCache([device, host])
    on_gpu = cache.put("a", kv, "A")
    assert on_gpu.keys.is_cuda and host.get("a", "A") is kv
    cache.put("b", make_kv(seed=1, dtype=torch.bfloat16), "A")  # evicts "a" from the device tier
    assert device.keys() == ["b"]
    same_kv(cache.get("a", "A"), kv)  # host hit, promoted back to the GPU
    assert cache.get("a", "A").keys.is_cuda
