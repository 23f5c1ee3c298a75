"""Redis (index and broker) stopped while the API runs: cached queries still answer, the rest is 503 with a
clear message, and everything recovers when Redis is back. Uses a private redis-server, never the
shared one."""

from __future__ import annotations

from api_helpers import service_settings
from api.main import create_app
from fastapi.testclient import TestClient
from service_support import PrivateRedis, wait_for


def test_queries_over_cached_documents_survive_redis_down_and_the_rest_recovers(tmp_path, tiny_engine, fixture_docs):
    redis_server = PrivateRedis(tmp_path / "redis")
    redis_server.start()
    settings = service_settings(tmp_path / "home", index_url=redis_server.url, broker_url=redis_server.url)
    try:
        with TestClient(create_app(settings, tiny_engine)) as c:
            assert c.get("/readyz").json()["mode"] == "celery"
            ingest = c.post("/v1/documents", json={"documents": fixture_docs})
            assert ingest.status_code == 202 and all(d["status"] == "queued" for d in ingest.json()["documents"])
            by_id = {"question": "Who kept the lighthouse lamp?", "document_ids": ["lighthouse", "paris"]}
            by_search = {"question": "Mount Erebus lava lake", "top_k": 1}
            assert c.post("/v1/query", json=by_id).status_code == 200  # no worker runs: encoded on the spot
            assert c.post("/v1/query", json=by_search).json()["documents"][0]["id"] == "volcano"
            assert c.get("/v1/documents/paris").json()["status"] == "ready"

            redis_server.stop()
            down = c.post("/v1/query", json=by_id)
            assert down.status_code == 200, down.text
            assert all(d["cache_hit"] for d in down.json()["documents"])
            assert c.post("/v1/query", json=by_search).json()["documents"][0]["cache_hit"] is True  # last BM25 index
            for resp in (c.get("/v1/documents/paris"), c.get("/v1/documents"),
                         c.post("/v1/documents", json={"id": "new", "text": "A new document."}),
                         c.delete("/v1/documents/paris")):
                assert resp.status_code == 503, resp.text
                err = resp.json()["error"]
                assert err["code"] == "redis_unavailable" and "queries that name cached documents" in err["message"]
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["index"].startswith("Redis unreachable")
            assert ready.json()["checks"]["queue"].startswith("Redis broker unreachable")

            redis_server.start()
            wait_for(lambda: c.get("/readyz").status_code == 200, 20, what="readiness after Redis restart")
            assert c.get("/v1/documents/paris").json()["status"] == "ready"  # the index came back with Redis
            added = c.post("/v1/documents", json={"id": "new", "text": "Lake Vostok lies under the Antarctic ice."})
            assert added.status_code == 202 and added.json()["queued"] is True
            again = c.post("/v1/query", json={"question": "What lies under the ice?", "document_ids": ["new"]})
            assert again.status_code == 200
    finally:
        redis_server.stop()
