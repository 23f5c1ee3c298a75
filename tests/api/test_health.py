"""/healthz, /readyz, /metrics and the OpenAPI document."""

from __future__ import annotations

import re
import time

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


def metrics_after_two_queries(client, fixture_docs) -> str:
    """Ingest ``paris``, ask about it twice, return the /metrics text."""
    client.post("/v1/documents", json=fixture_docs[1])
    wait_ready(client, "paris")
    for _ in range(2):
        client.post("/v1/query", json={"question": "capital of France?", "document_ids": ["paris"]})
    return client.get("/metrics").text


def test_metrics_count_requests_ttft_cache_tiers_and_queue(client, fixture_docs):
    text = metrics_after_two_queries(client, fixture_docs)
    assert _sample(text, "kvlink_request_duration_seconds_count", method="POST", route="/v1/query", status=200) == 2
    assert _sample(text, "kvlink_request_duration_seconds_count", method="POST", route="/v1/documents",
                   status=202) == 1
    assert _sample(text, "kvlink_ttft_seconds_count") == 2 and _sample(text, "kvlink_ttft_seconds_sum") > 0
    assert _sample(text, "kvlink_query_stage_seconds_count", stage="link_s") == 2
    assert _sample(text, "kvlink_query_documents_total", cache="hit") == 2
    host = client.app_state.store.tiered.tiers[-1].stats()
    assert _sample(text, "kvlink_cache_hits_total", tier="host") == host["hits"]
    assert host["hits"] + host["misses"] >= 1  # the second query's document came from the prefix tree
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


def test_documents_streamed_from_lmdb_count_as_lmdb_hits(make_client, fixture_docs):
    with make_client(host_cache_bytes=0) as c:  # no memory tier: the query streams the document from LMDB
        c.post("/v1/documents", json=fixture_docs[1])
        wait_ready(c, "paris")
        r = c.post("/v1/query", json={"question": "capital of France?", "document_ids": ["paris"]})
        assert r.status_code == 200 and r.json()["documents"][0]["cache_hit"] is True
        text = c.get("/metrics").text
        assert _sample(text, "kvlink_cache_hits_total", tier="lmdb") == 1
        assert _sample(text, "kvlink_cache_misses_total", tier="lmdb") == 0


def test_health_and_readiness_answer_while_60_queries_wait_for_a_busy_model(tmp_path, tiny_engine, fixture_docs):
    """Waiting queries hold no worker thread: the probes answer at once (latency printed, not asserted)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from api.main import create_app
    from api_helpers import service_settings
    from service_support import LiveServer, wait_for

    app = create_app(service_settings(tmp_path / "home"), tiny_engine)
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        http.post("/v1/documents", json=fixture_docs[1])
        wait_ready(http, "paris")
        state = app.state.service
        ask = {"question": "What is the capital of France?", "document_ids": ["paris"], "max_new_tokens": 2}
        with ThreadPoolExecutor(60) as pool:
            with state.model_lock:  # the model is busy (as with a long answer or precompute)
                futures = [pool.submit(http.post, "/v1/query", json={**ask, "stream": i % 2 == 1}) for i in range(60)]
                model = state.gates.model
                # the batching scheduler takes them all in (their threads wait for tokens); it needs the lock to run
                wait_for(lambda: model.borrowed_tokens == 60, 60, what="60 queries waiting for the model")
                t0 = time.perf_counter()
                health = http.get("/healthz")
                t1 = time.perf_counter()
                ready = http.get("/readyz")
                t2 = time.perf_counter()
                metrics = http.get("/metrics")
                print(f"\nwith 60 queries waiting: /healthz {1000 * (t1 - t0):.1f} ms, "
                      f"/readyz {1000 * (t2 - t1):.1f} ms")
                assert health.status_code == 200 and health.json() == {"status": "ok"}
                assert ready.status_code == 200 and ready.json()["checks"] == {"model": "ok", "store": "ok"}
                assert metrics.status_code == 200 and "kvlink_request_duration_seconds" in metrics.text
                assert http.get("/v1/documents").json()["total"] == 1  # sync routes keep their threads too
                assert not any(f.done() for f in futures)
            answers = [f.result() for f in futures]
        assert [r.status_code for r in answers] == [200] * 60
        assert all(r.text.rstrip().splitlines()[-1].startswith("data: ") for r in answers[1::2])
        assert all("event: done" in r.text for r in answers[1::2])


def test_metrics_labels_come_from_a_closed_set(client):
    import random

    rng = random.Random(0)
    for i in range(300):
        method = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(rng.randint(3, 12)))
        path = rng.choice(["/v1/query", "/healthz", f"/nope/{i}", f"/v1/documents/{i}"])
        assert client.request(method, path).status_code in (404, 405)
    text = client.get("/metrics").text
    series = [line for line in text.splitlines() if line.startswith("kvlink_request_duration_seconds_count")]
    assert len(series) == 4, series  # one per route template (or unmatched) and status, all method "other"
    assert {re.search(r'route="([^"]*)"', line).group(1) for line in series} == {
        "/v1/query", "/healthz", "unmatched", "/v1/documents/{doc_id}"}
    assert all('method="other"' in line for line in series)


def test_scheduler_metrics_count_steps_batches_waits_and_the_prefix_tree(client, fixture_docs):
    text = metrics_after_two_queries(client, fixture_docs)
    assert _sample(text, "kvlink_queue_wait_seconds_count") == 2 and _sample(text, "kvlink_batch_size_count") >= 2
    assert _sample(text, "kvlink_scheduler_running") == 0 and _sample(text, "kvlink_scheduler_waiting") == 0
    info = next(line for line in text.splitlines() if line.startswith("kvlink_cache_config_info"))
    assert 'kv_cache_dtype="auto"' in info and 'kv_dtype="' in info and 'weight_format="' in info
    tree = client.app_state.runtime.scheduler.tree.stats()
    assert _sample(text, "kvlink_prefix_tree_bytes") == tree["bytes"] > 0
    assert _sample(text, "kvlink_cache_used_bytes", tier="prefix") == tree["bytes"]
    assert _sample(text, "kvlink_prefix_tree_hit_tokens_total") == tree["hit_tokens"] > 0  # the second query


def test_readiness_answers_at_once_while_the_index_redis_is_paused(make_client, tmp_path):
    from redis_servers import private_redis
    from service_support import wait_for

    servers = private_redis(tmp_path / "index-redis")
    server = next(servers)
    try:
        with make_client(index_url=server.url(0), readiness_timeout_s=0.5, readiness_interval_s=0.1) as c:
            assert c.get("/readyz").status_code == 200
            with server.paused():  # SIGSTOP: connections are accepted, nothing answers
                times = []

                def not_ready():
                    t0 = time.perf_counter()
                    r = c.get("/readyz")
                    times.append(time.perf_counter() - t0)
                    return r if r.status_code == 503 else None

                r = wait_for(not_ready, 10, interval=0.05, what="/readyz reporting the paused index")
                assert r.json()["checks"]["index"].startswith("Redis unreachable: ")  # a timeout: no answer
                assert r.json()["checks"]["store"] == "ok" and max(times) < 1.0  # it was 4 s (target 0.1 s)
                assert c.get("/healthz").json() == {"status": "ok"}
            wait_for(lambda: c.get("/readyz").status_code == 200, 10, what="readiness once Redis answers")
    finally:
        server.stop()
