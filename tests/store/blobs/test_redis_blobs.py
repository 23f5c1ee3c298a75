"""The Redis blob store (the shared tier) on a private redis-server and on a real 3-node Redis Cluster: the
LMDB record layout and checksums, values split under a size limit, generations replaced whole, and every
damaged, missing, newer or unreachable record a miss."""

from __future__ import annotations

import json

import pytest
import torch

from redis_servers import RedisClusterNodes, need_redis_server, private_redis
from service_support import free_port
from store.records import codec
from store.backends import open_blob_store
from store.blobs.blob_store import BlobStore, BlobStoreUnavailable, encode_record
from store.records.errors import CorruptRecordError
from store.blobs.lmdb import LmdbBlobStore
from store.blobs.redis import RedisBlobStore

CHUNK = 700  # bytes: every layer of the test documents is split into several values


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from private_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture
def blobs(server, request):
    store = open_blob_store(server.url(3) + f"?prefix=t-{request.node.name[:40]}:&chunk_bytes={CHUNK}&batch_bytes=2000")
    yield store
    for key in store.keys():
        store.delete(key)
    store.close()


def _values(server, store: RedisBlobStore, key: str) -> dict[bytes, bytes]:
    r = server.client(db=3)
    return {k: r.get(k) for k in r.scan_iter(match=f"{store.prefix}kv:{{{key}}}:*")}


@pytest.mark.parametrize("int8", [False, True])
def test_records_round_trip_bit_exact_in_values_under_the_chunk_size(server, blobs, make_kv, same_kv, tmp_path, int8):
    assert isinstance(blobs, RedisBlobStore) and isinstance(blobs, BlobStore)
    kv = make_kv(layers=3, tokens=40, dtype=torch.bfloat16, seed=1)
    nbytes = blobs.put("doc", kv, int8=int8)
    lmdb = LmdbBlobStore(tmp_path / "lmdb", max_map_size=64 << 20)
    assert lmdb.put("doc", kv, int8=int8) == nbytes  # the same codec bytes as LMDB's
    same_kv(blobs.get("doc"), lmdb.get("doc"))
    layers = list(blobs.iter_layers("doc"))
    assert torch.equal(torch.stack([k for k, _ in layers]), lmdb.get("doc").keys)
    assert torch.equal(blobs.get_ids("doc"), kv.token_ids)
    meta = blobs.meta("doc")
    assert meta["checksum"] == lmdb.meta("doc")["checksum"] and meta["nbytes"] == nbytes
    assert all(n > 1 for n in meta["redis"]["chunks"][1:])  # layers split into several values
    values = _values(server, blobs, "doc")
    assert len(values) == 1 + sum(meta["redis"]["chunks"])
    assert max(len(v) for k, v in values.items() if not k.endswith(b":meta")) <= CHUNK
    assert all(server.client(db=3).ttl(k) == -1 for k in values)  # committed: no pending expiry left
    assert blobs.keys() == ["doc"] and blobs.entries()["doc"]["nbytes"] == nbytes and "doc" in blobs


def test_a_replaced_record_leaves_one_generation_and_delete_leaves_nothing(server, blobs, make_kv, same_kv):
    blobs.put("doc", make_kv(seed=1))
    first = set(_values(server, blobs, "doc"))
    blobs.put("doc", make_kv(seed=2))
    second = set(_values(server, blobs, "doc"))
    assert len(first) == len(second) and first & second == {f"{blobs.prefix}kv:{{doc}}:meta".encode()}
    same_kv(blobs.get("doc"), make_kv(seed=2))
    assert blobs.delete("doc") and _values(server, blobs, "doc") == {} and not blobs.delete("doc")
    assert blobs.get("doc") is None and "doc" not in blobs
    with pytest.raises(KeyError):
        list(blobs.iter_layers("doc"))


def _chunk(blobs: RedisBlobStore, key: str, part: str) -> str:
    return blobs.layout.key(key, f"{blobs.meta(key)['redis']['gen']}:{part}:0")


def test_a_truncated_chunk_is_a_counted_miss_and_the_record_is_deleted(server, blobs, make_kv):
    blobs.put("doc", make_kv(seed=1))
    r = server.client(db=3)
    r.set(_chunk(blobs, "doc", "L1"), r.get(_chunk(blobs, "doc", "L1"))[:-5])
    assert blobs.get("doc") is None
    assert blobs.checksum_failures == 1 and blobs.events()["corrupt"] == 1 and "doc" not in blobs
    assert _values(server, blobs, "doc") == {}
    blobs.put("doc", make_kv(seed=1))
    r.set(_chunk(blobs, "doc", "L2"), b"x" * 10)
    with pytest.raises(CorruptRecordError):
        list(blobs.iter_layers("doc"))
    assert "doc" not in blobs and blobs.checksum_failures == 2


def test_an_evicted_chunk_is_a_counted_miss_and_the_record_is_deleted(server, blobs, make_kv):
    blobs.put("doc", make_kv(seed=1))
    server.client(db=3).delete(_chunk(blobs, "doc", "L0"))  # what maxmemory eviction does to one value
    assert blobs.get("doc") is None and blobs.events()["missing"] == 1 and "doc" not in blobs
    blobs.put("doc", make_kv(seed=1))
    server.client(db=3).delete(_chunk(blobs, "doc", "L2"))
    got = blobs.iter_layers("doc")
    next(got), next(got)  # layers 0 and 1 came in their own round trips
    with pytest.raises(KeyError):
        next(got)
    assert blobs.events()["missing"] == 2 and "doc" not in blobs


def test_a_record_of_a_newer_format_or_a_garbled_meta_is_a_miss(server, blobs, make_kv):
    blobs.put("doc", make_kv(seed=1))
    r, meta_key = server.client(db=3), blobs.layout.key("doc", "meta")
    meta = json.loads(r.get(meta_key))
    r.set(meta_key, json.dumps({**meta, "format_version": codec.FORMAT_VERSION + 1}))
    assert blobs.get("doc") is None and blobs.meta("doc") is None and blobs.events()["newer_format"] == 2
    assert "doc" in blobs  # left alone for the newer release
    r.set(meta_key, b"{not json")
    assert blobs.get("doc") is None and blobs.checksum_failures == 1 and "doc" not in blobs


def test_an_unreachable_server_raises_blob_store_unavailable_naming_it(make_kv):
    url = f"redis://127.0.0.1:{free_port()}/0"
    blobs = open_blob_store(url)
    for call in (blobs.ping, lambda: blobs.get("doc"), lambda: blobs.put("doc", make_kv()), lambda: blobs.contains("d")):
        with pytest.raises(BlobStoreUnavailable, match=url.rsplit("/", 1)[0]):
            call()


def test_urls_choose_the_backend_and_its_options():
    store = open_blob_store("redis://127.0.0.1:1/4?prefix=x:&chunk_bytes=4096&batch_bytes=8192&pending_ttl_s=60")
    layout = store.layout
    assert (store.prefix, layout.chunk_bytes, layout.batch_bytes, layout.pending_ms) == ("x:", 4096, 8192, 60_000)
    cluster = open_blob_store(f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}?prefix=c:")
    assert cluster.prefix == "c:"  # no connection yet: a cluster client connects when first used
    with pytest.raises(BlobStoreUnavailable, match="redis\\+cluster://127.0.0.1"):
        cluster.ping()
    with pytest.raises(ValueError, match="redis\\+cluster://"):
        open_blob_store("memcached://host:1")
    with pytest.raises(ValueError, match="braces"):
        RedisBlobStore(None, prefix="{x}")


def test_a_real_three_node_cluster_spreads_documents_and_a_lost_node_loses_only_its_own(tmp_path, make_kv, same_kv):
    need_redis_server()
    cluster = RedisClusterNodes(tmp_path / "cluster").start()
    try:
        blobs = open_blob_store(cluster.url + f"?chunk_bytes={CHUNK}")
        docs = {f"doc{i}": make_kv(seed=i) for i in range(12)}
        for key, kv in docs.items():
            blobs.put(key, kv)
        assert blobs.keys() == sorted(docs)
        per_node = [n.client().dbsize() for n in cluster.nodes]
        assert sum(1 for n in per_node if n) >= 2  # hash tags spread documents over the shards
        for key, kv in docs.items():
            same_kv(blobs.get(key), kv)
        lost = cluster.node_of(blobs.layout.key("doc0", "meta"))
        lost.stop()
        for key, kv in docs.items():
            try:
                same_kv(blobs.get(key), kv)  # on a live shard: served exactly
            except BlobStoreUnavailable as e:
                assert cluster.url.split("//")[1].split(",")[0] in str(e)
        with pytest.raises(BlobStoreUnavailable):
            blobs.get("doc0")
    finally:
        cluster.stop()


def test_encode_record_is_what_both_backends_store(make_kv, tmp_path):
    kv = make_kv(seed=4)
    rec = encode_record(kv)
    lmdb = LmdbBlobStore(tmp_path / "lmdb", max_map_size=64 << 20)
    assert lmdb.put_record("doc", rec) == rec.meta["nbytes"] == sum(map(len, rec.layers)) + len(rec.ids)
    assert torch.equal(lmdb.get("doc").keys, kv.keys)


def test_an_importance_ordered_record_round_trips_with_its_importance(blobs, make_kv, same_kv, tmp_path):
    import dataclasses

    kv = make_kv(seed=7, tokens=24, dtype=torch.bfloat16)
    kv = dataclasses.replace(kv, importance=torch.rand(24, generator=torch.Generator().manual_seed(1)))
    blobs.put("doc", kv)
    lmdb = LmdbBlobStore(tmp_path / "lmdb", max_map_size=64 << 20)
    lmdb.put("doc", kv)
    got, ref = blobs.get("doc"), lmdb.get("doc")
    same_kv(got, ref)
    assert (got.importance is None) == (ref.importance is None)
    if ref.importance is not None:
        assert torch.equal(got.importance, ref.importance)
