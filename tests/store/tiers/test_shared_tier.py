"""Local LMDB read-through in front of the shared Redis tier: writes reach both, reads fill the local tier
with the shared tier's exact bytes, a local copy the shared tier no longer vouches for is never served
(version fencing), and an unreachable shared tier is a miss, never an error or a wrong answer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from redis_servers import private_redis
from service_support import free_port
from store.backends import open_blob_store
from store.blobs.blob_store import BlobStoreUnavailable
from store.blobs.lmdb import LmdbBlobStore
from store.tiers.shared import TieredBlobStore


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from private_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture
def host(server, tmp_path, request):
    """``host(name)`` -> a tiered store with its own local LMDB folder over this test's shared prefix."""
    url = server.url(5) + f"?prefix=s-{request.node.name[:40]}:&chunk_bytes=500&batch_bytes=600"
    made = []

    def make(name: str, local_bytes: int = 64 << 20, shared_url: str = url) -> TieredBlobStore:
        store = TieredBlobStore(LmdbBlobStore(tmp_path / name, max_map_size=local_bytes), open_blob_store(shared_url))
        made.append(store)
        return store

    yield make
    shared = open_blob_store(url)
    for key in shared.keys():
        shared.delete(key)


def test_writes_reach_both_tiers_and_a_second_host_fills_its_local_tier_with_the_same_bytes(host, make_kv, same_kv):
    a, b = host("a"), host("b")
    kv = make_kv(seed=1, dtype=torch.bfloat16)
    nbytes = a.put("doc", kv, int8=True)
    assert a.local.meta("doc")["checksum"] == a.shared.meta("doc")["checksum"] and "redis" not in a.local.meta("doc")
    assert not b.local.contains("doc") and b.contains("doc")
    first = b.get("doc")  # from the shared tier, then kept locally
    assert b.local.meta("doc")["checksum"] == a.local.meta("doc")["checksum"]
    same_kv(b.get("doc"), first)  # from the local tier
    same_kv(first, a.get("doc"))
    assert b.events()["shared_hit"] == 1 and b.events()["local_hit"] == 1 and b.meta("doc")["nbytes"] == nbytes
    assert b.keys() == ["doc"] and b.stats()["local"]["documents"] == 1


def test_layers_stream_from_the_shared_tier_and_the_record_is_kept_locally(host, make_kv):
    a, b = host("a"), host("b")
    kv = make_kv(seed=2, layers=4)
    a.put("doc", kv)
    layers = list(b.iter_layers("doc"))
    b.drain()  # the local fill of a streamed record runs in the background
    assert torch.equal(torch.stack([k for k, _ in layers]), kv.keys) and b.local.contains("doc")
    assert torch.equal(b.get_ids("doc"), kv.token_ids)
    assert torch.equal(torch.stack([v for _, v in b.iter_layers("doc")]), kv.values)
    assert b.events() == {"shared_hit": 1, "local_hit": 1}


def test_a_local_copy_is_never_served_once_the_shared_tier_dropped_or_replaced_it(host, make_kv, same_kv):
    a, b = host("a"), host("b")
    a.put("old", make_kv(seed=1))
    assert b.get("old") is not None and b.local.contains("old")
    a.delete("old")  # e.g. the document was updated on host A and its old cache dropped
    assert b.local.contains("old")  # B's disk still has it ...
    assert b.get("old") is None and not b.local.contains("old")  # ... but never serves it
    assert b.events()["fenced"] == 1
    with pytest.raises(KeyError):
        list(b.iter_layers("old"))

    a.put("doc", make_kv(seed=1))
    b.get("doc")
    a.put("doc", make_kv(seed=9))  # another record under the key (another writer's bytes)
    same_kv(b.get("doc"), make_kv(seed=9))
    assert b.events()["fenced"] == 2


def test_a_record_missing_in_the_shared_tier_mid_stream_is_a_miss(server, host, make_kv):
    a, b = host("a"), host("b")
    a.put("doc", make_kv(seed=3, layers=4))
    shared = a.shared
    gen = shared.meta("doc")["redis"]["gen"]
    server.client(db=5).delete(shared.layout.key("doc", f"{gen}:L3:0"))  # evicted under maxmemory
    stream = b.iter_layers("doc")
    next(stream)
    with pytest.raises(KeyError):
        list(stream)
    assert not b.local.contains("doc") and not b.contains("doc") and b.get("doc") is None


def test_an_unreachable_shared_tier_is_a_miss_and_a_failed_write_keeps_the_local_copy(host, make_kv, same_kv):
    down = host("c", shared_url=f"redis://127.0.0.1:{free_port()}/0")
    kv = make_kv(seed=4)
    assert down.get("doc") is None and not down.contains("doc")
    with pytest.raises(BlobStoreUnavailable):
        down.put("doc", kv)
    assert down.local.contains("doc") and down.contains("doc")
    same_kv(down.get("doc"), kv)  # content-addressed key, checksummed bytes: safe to serve locally
    assert down.events()["shared_error"] >= 3
    with pytest.raises(BlobStoreUnavailable, match="127.0.0.1"):
        down.ping()


def test_a_record_too_large_for_the_local_tier_is_still_served_from_the_shared_one(host, make_kv, same_kv):
    a, small = host("a"), host("small", local_bytes=1 << 20)
    kv = make_kv(seed=5, tokens=2048, heads=4, dim=32)  # ~2 MiB: over the 1 MiB local map
    a.put("big", kv)
    same_kv(small.get("big"), kv)
    assert not small.local.contains("big") and small.events()["fill_skipped"] == 1


def test_a_newer_format_in_the_shared_tier_is_a_miss_even_with_an_old_local_copy(server, host, make_kv):
    a, b = host("a"), host("b")
    a.put("doc", make_kv(seed=6))
    b.get("doc")
    r, key = server.client(db=5), a.shared.layout.key("doc", "meta")
    r.set(key, json.dumps({**json.loads(r.get(key)), "format_version": 99}))
    assert b.get("doc") is None and not b.local.contains("doc")


def test_a_vouched_local_copy_and_a_shared_stream_both_fill_in_stored_order(host, make_kv):
    """A local hit takes the local store's own stored-order fills (LMDB's staged path, inside its layer session);
    without a local copy the shared payloads fill the same way as they arrive; both give the record's layers."""
    from store.blobs.blob_store import DecodedLayer
    from store.tiers.shared_stream import SharedLayer

    a, b = host("a"), host("b")
    kv = make_kv(seed=4, layers=3, dtype=torch.bfloat16)
    a.put("doc", kv)
    for store, local in ((a, True), (b, False)):
        order, fills = store.iter_stored_layers("doc")
        assert order is None
        L, H, T, D = kv.keys.shape
        for i, fill in enumerate(fills):
            assert not isinstance(fill, DecodedLayer) and isinstance(fill, SharedLayer) is not local
            k, v = torch.empty(H, T, D, dtype=torch.bfloat16), torch.empty(H, T, D, dtype=torch.bfloat16)
            with store.layer_session():
                fill(k, v)
            assert torch.equal(k, kv.keys[i]) and torch.equal(v, kv.values[i])
        b.drain()
    assert a.events()["local_hit"] == 1 and b.events()["shared_hit"] == 1


def test_an_ordered_record_streams_from_the_shared_tier_as_staged_rows_in_stored_order(host, make_kv):
    """An importance-ordered record from the shared tier: its order, each layer's rows staged as views of the
    payload (no decode), the record then kept locally."""
    import dataclasses

    a, b = host("a"), host("b")
    kv = make_kv(seed=5, layers=3, tokens=37, dtype=torch.bfloat16)
    kv = dataclasses.replace(kv, importance=torch.rand(37, generator=torch.Generator().manual_seed(5)))
    a.put("doc", kv)
    ref = a.get("doc")
    order, fills = b.iter_stored_layers("doc")
    assert order is not None and sorted(order.tolist()) == list(range(37))
    L, H, T, D = ref.keys.shape
    for i, fill in enumerate(fills):
        k_parts, v_parts = [], []
        assert fill.stage(torch.bfloat16, (H, T, D), 0, k_parts, v_parts)
        (k,), (v,) = k_parts, v_parts
        rows = torch.from_numpy(np.array(k.raw)).view(torch.bfloat16).view(T, H, D).transpose(0, 1)
        assert k.token_major and torch.equal(rows, ref.keys[i][:, order])
    b.drain()
    assert b.local.contains("doc") and b.events()["shared_hit"] == 1


def test_a_corrupt_or_lost_layer_in_a_shared_stream_is_an_error_and_a_miss(server, host, make_kv):
    from store.records.errors import CorruptRecordError

    a, b = host("a"), host("b")
    kv = make_kv(seed=6, layers=4)
    a.put("doc", kv)
    shared = a.shared
    gen = shared.meta("doc")["redis"]["gen"]
    chunk = shared.layout.key("doc", f"{gen}:L1:0")
    data = bytearray(server.client(db=5).get(chunk))
    data[-1] ^= 0xFF
    server.client(db=5).set(chunk, bytes(data))
    _, fills = b.iter_stored_layers("doc")
    L, H, T, D = kv.keys.shape
    out = torch.empty(H, T, D), torch.empty(H, T, D)
    next(fills)(*out)
    with pytest.raises(CorruptRecordError):
        next(fills)(*out)
    b.drain()
    assert b.events()["corrupt"] == 1 and not b.contains("doc") and not b.local.contains("doc")

    a.put("lost", make_kv(seed=7, layers=4))
    gen = shared.meta("lost")["redis"]["gen"]
    server.client(db=5).delete(shared.layout.key("lost", f"{gen}:L3:0"))  # evicted under maxmemory
    _, fills = b.iter_stored_layers("lost")
    with pytest.raises(KeyError):
        for fill in fills:
            fill(*out)
    assert not b.local.contains("lost")
