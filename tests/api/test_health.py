"""/healthz, /readyz, /metrics and the OpenAPI document."""

from __future__ import annotations

from api_helpers import wait_ready


def _sample(text: str, name: str, **labels) -> float:
    """Value of one Prometheus sample (labels must match exactly those given, in any order)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, value = line.rsplit(" ", 1)
        metric, _, rest = head.partition("{")
        got = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv) if rest else {}
        if metric == name and {k: v.strip('"') for k, v in got.items()} == {k: str(v) for k, v in labels.items()}:
            return float(value)
    raise KeyError(f"{name}{labels} not in metrics")


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"model": "ok", "store": "ok"}, "mode": "embedded",
                            "tenancy": "single-tenant"}
    spec = client.get("/openapi.json").json()
    assert {"/v1/documents", "/v1/documents/{doc_id}", "/v1/query", "/v1/chat/completions", "/metrics"} <= set(spec["paths"])


def test_metrics_count_requests_ttft_cache_tiers_and_queue(client, fixture_docs):
    client.post("/v1/documents", json=fixture_docs[1])
    wait_ready(client, "paris")
    for _ in range(2):
        client.post("/v1/query", json={"question": "capital of France?", "document_ids": ["paris"]})
    text = client.get("/metrics").text
    assert _sample(text, "kvlink_request_duration_seconds_count", method="POST", route="/v1/query", status=200) == 2
    assert _sample(text, "kvlink_request_duration_seconds_count", method="POST", route="/v1/documents",
                   status=202) == 1
    assert _sample(text, "kvlink_ttft_seconds_count") == 2 and _sample(text, "kvlink_ttft_seconds_sum") > 0
    assert _sample(text, "kvlink_query_stage_seconds_count", stage="link_s") == 2
    assert _sample(text, "kvlink_query_documents_total", cache="hit") == 2
    host = client.app_state.store.tiered.tiers[-1].stats()
    assert _sample(text, "kvlink_cache_hits_total", tier="host") == host["hits"] >= 1
    assert _sample(text, "kvlink_cache_hit_ratio", tier="host") == host["hits"] / (host["hits"] + host["misses"])
    assert _sample(text, "kvlink_cache_evictions_total", tier="lmdb") == 0
    assert _sample(text, "kvlink_checksum_failures_total") == 0
    assert _sample(text, "kvlink_precompute_queue_depth") == 0


def test_a_corrupt_cache_is_counted_recomputed_and_the_query_still_answers(make_client, fixture_docs):
    with make_client(host_cache_bytes=0) as c:  # no memory tier: every query reads LMDB
        store = c.app_state.store
        c.post("/v1/documents", json=fixture_docs[2])
        key = wait_ready(c, "photosynthesis")["cache_key"]
        layer = f"{key}/L0".encode()
        db = store.blobs._db

        def corrupt(txn):
            raw = bytearray(txn.get(layer, db=db))
            raw[-1] ^= 0xFF
            txn.put(layer, bytes(raw), db=db)

        store.blobs.env.write(corrupt)
        r = c.post("/v1/query", json={"question": "What is photosynthesis?", "document_ids": ["photosynthesis"]})
        assert r.status_code == 200 and r.json()["documents"][0]["cache_hit"] is False
        assert store.blobs.checksum_failures == 1 and key in store.blobs  # re-encoded and stored again
        assert _sample(c.get("/metrics").text, "kvlink_checksum_failures_total") == 1
