"""Hosts as apps with separate homes in one test process, sharing only Redis: a cache computed on one host is
a hit on another with no encode; an update on one host is never answered from another host's old cache;
a damaged, evicted, foreign or unreachable shared record is a recompute (or a clear 503), never a wrong answer."""

from __future__ import annotations

import json

import pytest

from store.records import codec
from store.blobs.redis import RedisBlobStore


def test_a_cache_precomputed_on_one_host_is_a_hit_on_another_with_no_encode(make_host, shared_server, documents):
    with make_host("a", shared_server.url()) as a:
        assert a.client.post("/v1/documents", json={"documents": documents}).status_code == 202
        for d in documents:
            a.ready(d["id"])
        with make_host("c", shared_server.url()) as c:
            assert not any(c.store.blobs.local.keys())  # an empty home
            body = c.query(["lighthouse", "paris"])
            assert [d["cache_hit"] for d in body["documents"]] == [True, True] and c.encodes == 0
            c.store.blobs.drain()
            assert c.store.blobs.events()["shared_hit"] == 2 and len(c.store.blobs.local.keys()) == 2
            assert body["answer"] == a.query(["lighthouse", "paris"])["answer"]
            top = c.client.post("/v1/query", json={"question": "Mount Erebus lava lake", "top_k": 1}).json()
            assert top["documents"][0]["id"] == "volcano" and top["documents"][0]["cache_hit"] is True
            assert c.client.get("/v1/documents/paris").json()["status"] == "ready"  # texts and records shared


def test_an_update_on_one_host_is_never_answered_from_another_hosts_old_cache(make_host, shared_server, documents):
    doc = documents[0]
    with make_host("a", shared_server.url()) as a, make_host("c", shared_server.url()) as c:
        a.client.post("/v1/documents", json=doc)
        old_key = a.ready(doc["id"])["cache_key"]
        first = c.query([doc["id"]])
        c.store.blobs.drain()
        assert first["documents"][0]["cache_hit"] and c.store.blobs.local.contains(old_key)

        a.client.put(f"/v1/documents/{doc['id']}", json={"text": doc["text"] + " It was rebuilt in 1902."})
        new = a.ready(doc["id"])
        assert new["version"] == 2 and new["cache_key"] != old_key
        assert c.store.blobs.local.contains(old_key)  # host C's disk still holds the old version's cache
        second = c.query([doc["id"]])
        c.store.blobs.drain()
        d = second["documents"][0]
        assert (d["version"], d["content_hash"], d["cache_hit"]) == (2, new["content_hash"], True) and c.encodes == 0
        assert c.store.blobs.local.contains(new["cache_key"])
        assert c.store.blobs.get(old_key) is None and not c.store.blobs.local.contains(old_key)  # fenced
        with make_host("d", shared_server.url()) as fresh:  # an empty host answers the same
            assert fresh.query([doc["id"]])["answer"] == second["answer"]


def test_a_truncated_or_newer_format_shared_record_is_a_counted_miss_and_recomputed(make_host, shared_server,
                                                                                    documents):
    doc = documents[1]
    with make_host("a", shared_server.url()) as a:
        a.client.post("/v1/documents", json=doc)
        key = a.ready(doc["id"])["cache_key"]
        reference = a.query([doc["id"]])["answer"]
        shared: RedisBlobStore = a.store.shared
        r = shared_server.client()
        gen = shared.meta(key)["redis"]["gen"]
        chunk = shared.layout.key(key, f"{gen}:L1:0")
        r.set(chunk, r.get(chunk)[:-16])  # truncated in the shared tier
        with make_host("c", shared_server.url()) as c:
            body = c.query([doc["id"]])
            assert body["documents"][0]["cache_hit"] is False and body["answer"] == reference and c.encodes == 1
            metrics = c.client.get("/metrics").text
            assert 'kvlink_blob_store_events_total{event="corrupt"} 1.0' in metrics
            assert "kvlink_checksum_failures_total 1.0" in metrics

        meta_key = shared.layout.key(key, "meta")  # the recompute stored it again; now mark it a newer format
        r.set(meta_key, json.dumps({**json.loads(r.get(meta_key)), "format_version": codec.FORMAT_VERSION + 1}))
        with make_host("e", shared_server.url()) as e:
            body = e.query([doc["id"]])
            assert body["documents"][0]["cache_hit"] is False and body["answer"] == reference and e.encodes == 1


def test_a_host_with_another_model_never_uses_the_shared_caches(make_host, shared_server, documents):
    doc = documents[2]
    with make_host("a", shared_server.url()) as a:
        a.client.post("/v1/documents", json=doc)
        first_key = a.ready(doc["id"])["cache_key"]
        with make_host("other", shared_server.url(), seed=1) as other:  # another model: another fingerprint
            assert other.query([doc["id"]])["documents"][0]["cache_hit"] is False and other.encodes == 1
            assert other.engine.cache_key(_document(doc)) != first_key


def test_maxmemory_eviction_in_the_shared_tier_makes_the_next_query_recompute(make_host, shared_server, documents):
    doc = documents[3]
    r = shared_server.client()
    with make_host("a", shared_server.url()) as a:
        a.client.post("/v1/documents", json=doc)
        key = a.ready(doc["id"])["cache_key"]
        reference = a.query([doc["id"]])["answer"]
        r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + (2 << 20))
        filler = 0
        while a.store.shared.contains(key) and _complete(a.store.shared, key) and filler < 2000:
            r.set(f"filler:{filler}", b"x" * (64 << 10))  # another tenant's traffic fills the tier
            filler += 1
        assert int(r.info("stats")["evicted_keys"]) > 0 and not (a.store.shared.contains(key)
                                                                 and _complete(a.store.shared, key))
        with make_host("c", shared_server.url()) as c:
            body = c.query([doc["id"]])
            assert body["documents"][0]["cache_hit"] is False and body["answer"] == reference and c.encodes == 1
            assert c.query([doc["id"]])["documents"][0]["cache_hit"] is True  # stored again


def _document(doc: dict):
    from kvlink_rag.types import Document

    return Document(doc["text"], doc["title"])


def _complete(shared: RedisBlobStore, key: str) -> bool:
    meta = shared.meta(key)
    return meta is not None and all(shared.r.exists(k) for k in shared.layout.all_chunk_keys(key, meta))


def test_an_unreachable_shared_tier_at_start_is_a_503_readiness_naming_it(make_host, documents):
    from service_support import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    with make_host("a", url) as a:
        ready = a.client.get("/readyz")
        check = ready.json()["checks"]["shared_store"]
        assert ready.status_code == 503 and check.startswith("shared cache tier unreachable") and url[:-2] in check
        a.client.post("/v1/documents", json=documents[0])
        body = a.query([documents[0]["id"]])  # no shared tier: encoded here, kept on this host
        assert body["answer"] and a.encodes >= 1


@pytest.mark.parametrize("when", ["mid_query", "before_query"])
def test_a_cluster_node_stopped_gives_a_recompute_or_a_503_never_a_wrong_answer(make_host, cluster, documents, when):
    with make_host("a", cluster.url + "?batch_bytes=1") as a:
        a.client.post("/v1/documents", json={"documents": documents})
        keys = [a.ready(d["id"])["cache_key"] for d in documents]
        ids = [d["id"] for d in documents]
        reference = a.query(ids)["answer"]
        victim = cluster.node_of(a.store.shared.layout.key(keys[0], "meta"))
        with make_host("c", cluster.url + "?batch_bytes=1") as c:
            if when == "before_query":
                victim.stop()
            else:
                _stop_on_first_layer(c.store.shared, victim)
            r = c.client.post("/v1/query", json={"question": "Who kept the lamp burning?", "document_ids": ids})
            assert r.status_code in (200, 503), r.text
            if r.status_code == 200:
                assert r.json()["answer"] == reference and c.encodes >= 1
            else:
                assert r.json()["error"]["code"] == "redis_unavailable"
            assert victim.proc is None  # the node really is gone
            again = c.query(ids)  # answered: what the lost shard held is recomputed here
            assert again["answer"] == reference


def _stop_on_first_layer(shared: RedisBlobStore, node) -> None:
    """Stop ``node`` right after the shared tier returned its first layer payload to this host."""
    fetch = shared.reads.fetch

    def fetch_then_stop(key, meta, parts):
        got = fetch(key, meta, parts)
        if parts[0][0].startswith("L") and node.proc is not None:
            node.stop()
        return got

    shared.reads.fetch = fetch_then_stop
