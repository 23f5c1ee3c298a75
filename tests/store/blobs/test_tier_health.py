"""Circuit breakers of the shared tier: a paused Redis (SIGSTOP: connections are accepted, nothing answers)
costs one short socket timeout, then is skipped without a network call (reads are misses or local copies,
writes stay local), readiness names it, and a background probe closes the breaker once it answers again."""

from __future__ import annotations

import threading
import time

import pytest

from redis_servers import private_redis
from service_support import wait_for
from store.backends import open_blob_store
from store.blobs.blob_store import BlobStoreUnavailable
from store.blobs.lmdb import LmdbBlobStore
from store.tiers.shared import TieredBlobStore
from store.blobs.breakers import TierHealth

TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from private_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture
def tiered(server, tmp_path):
    shared = open_blob_store(server.url(6) + "?prefix=breaker:", timeout_s=TIMEOUT_S, probe_interval_s=0.2)
    store = TieredBlobStore(LmdbBlobStore(tmp_path / "local", max_map_size=64 << 20), shared)
    yield store
    for key in shared.keys():
        shared.delete(key)
    store.close()


def test_a_breaker_opens_on_a_failure_refuses_calls_and_a_probe_closes_it():
    answers = threading.Event()

    def probe(target):
        if not answers.is_set():
            raise ConnectionError("refused")

    health = TierHealth("redis://x", probe, probe_interval_s=0.05, whole="server")
    health.guard("server")  # closed: nothing happens
    health.failed("server", TimeoutError("Timeout reading from socket"))
    with pytest.raises(BlobStoreUnavailable, match="server skipped, circuit open .*Timeout reading"):
        health.guard("server")
    with pytest.raises(BlobStoreUnavailable):
        health.guard(None)  # a call touching every target
    assert "1 unreachable" in health.describe() and health.counters["skipped"] == 2
    time.sleep(0.2)
    assert health.is_open("server")  # still refused by the prober
    answers.set()
    wait_for(lambda: not health.is_open("server"), 5, interval=0.02, what="the prober closing the breaker")
    health.guard("server")
    assert health.counters["opened"] == 1 and health.counters["closed"] == 1 and health.describe() == ""
    health.close()


def test_a_whole_tier_breaker_refuses_every_target():
    health = TierHealth("c", lambda t: None, whole="cluster")
    health.failed("cluster", ConnectionError("no start-up node"))
    with pytest.raises(BlobStoreUnavailable, match="cluster skipped"):
        health.guard("127.0.0.1:7000")
    health.close()


def test_a_paused_shared_redis_costs_one_timeout_then_is_skipped_and_probed_back(server, tiered, make_kv, same_kv):
    kv, other = make_kv(seed=1), make_kv(seed=2)
    tiered.put("cached", kv)  # this host keeps a local copy too
    with server.paused():
        t0 = time.perf_counter()
        same_kv(tiered.get("cached"), kv)  # the local copy (content-addressed, checksummed) serves it
        assert time.perf_counter() - t0 < 10 * TIMEOUT_S  # one short timeout, not 3 retries x 10 s
        assert tiered.shared.health.is_open("server")
        t0 = time.perf_counter()
        assert tiered.get("uncached") is None  # a miss: the caller encodes it
        with pytest.raises(BlobStoreUnavailable, match="circuit open"):
            tiered.put("new", other)  # refused at once; the fresh encoding stays on this host
        same_kv(tiered.get("new"), other)
        assert time.perf_counter() - t0 < TIMEOUT_S  # no network call was made while the breaker is open
        assert tiered.events()["breaker_skipped"] >= 3 and tiered.events()["breaker_opened"] == 1
        with pytest.raises(BlobStoreUnavailable, match="server .*circuit open"):
            tiered.ping()  # readiness names the tier and its breaker
    wait_for(lambda: not tiered.shared.health.is_open("server"), 10, interval=0.05, what="breaker closed by a probe")
    tiered.ping()
    tiered.put("new", other)
    assert tiered.shared.contains("new") and tiered.events()["breaker_closed"] == 1


def _keys_on_two_nodes(store, cluster) -> tuple[str, str]:
    """Two cache keys whose records live on different nodes."""
    by_node: dict[int, str] = {}
    for i in range(200):
        key = f"doc{i}"
        by_node.setdefault(cluster.node_of(store.layout.key(key, "meta")).port, key)
        if len(by_node) >= 2:
            a, b = list(by_node.values())[:2]
            return a, b
    raise AssertionError("every key on one node")


def test_a_paused_cluster_node_opens_only_its_breaker_and_readiness_names_it(cluster, tmp_path, make_kv, same_kv):
    shared = open_blob_store(cluster.url + "?prefix=breaker:", timeout_s=TIMEOUT_S, probe_interval_s=0.2)
    tiered = TieredBlobStore(LmdbBlobStore(tmp_path / "local", max_map_size=64 << 20), shared)
    a, b = _keys_on_two_nodes(shared, cluster)
    kv_a, kv_b = make_kv(seed=1), make_kv(seed=2)
    shared.put(a, kv_a)
    shared.put(b, kv_b)
    victim = cluster.node_of(shared.layout.key(a, "meta"))
    name = f"127.0.0.1:{victim.port}"
    try:
        with victim.paused():
            t0 = time.perf_counter()
            assert tiered.get(a) is None  # its node does not answer: a miss (the caller encodes it)
            assert time.perf_counter() - t0 < 15  # bounded (was 172 s with redis-py's retries and 10 s timeouts)
            assert shared.health.open_targets().keys() == {name}  # that node only
            t0 = time.perf_counter()
            assert tiered.get(a) is None and time.perf_counter() - t0 < TIMEOUT_S  # skipped: no network call
            same_kv(tiered.get(b), kv_b)  # the other nodes still serve
            with pytest.raises(BlobStoreUnavailable, match=f"1 of 3 unreachable.*{name}"):
                tiered.ping()
        wait_for(lambda: not shared.health.open_targets(), 15, interval=0.05, what="breaker closed by a probe")
        same_kv(tiered.get(a), kv_a)
        tiered.ping()
    finally:
        tiered.close()
