"""API keys map to tenants; a tenant cannot read, query or delete another tenant's documents."""

from __future__ import annotations

import logging

from api_helpers import wait_ready

A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}
KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}


def test_keys_are_required_and_must_be_known(make_client):
    with make_client(api_keys=KEYS) as c:
        missing = c.get("/v1/documents")
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
        wrong = c.get("/v1/documents", headers={"Authorization": "Bearer key-c"})
        assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "unknown API key"
        assert c.get("/v1/documents", headers=A).status_code == 200
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").json()["tenancy"] == "multi-tenant"


def test_tenant_a_cannot_read_query_or_delete_tenant_b_documents(make_client, fixture_docs):
    with make_client(api_keys=KEYS) as c:
        c.post("/v1/documents", json=fixture_docs[0], headers=A)  # lighthouse: A's only
        c.post("/v1/documents", json={"id": "paris", "text": "B's own note about Paris."}, headers=B)
        c.post("/v1/documents", json=fixture_docs[1], headers=A)  # same id "paris", other text, tenant A
        wait_ready(c, "lighthouse", headers=A)

        assert c.get("/v1/documents/lighthouse", headers=B).status_code == 404
        assert c.put("/v1/documents/lighthouse", json={"text": "hijack"}, headers=B).status_code == 404
        by_id = c.post("/v1/query", json={"question": "Who kept the lamp?", "document_ids": ["lighthouse"]}, headers=B)
        assert by_id.status_code == 404 and "lighthouse" in by_id.json()["error"]["message"]
        by_search = c.post("/v1/query", json={"question": "Skerry Point lighthouse keeper storm", "top_k": 3},
                           headers=B)
        assert by_search.status_code == 404 and by_search.json()["error"]["code"] == "no_matching_documents"
        assert c.delete("/v1/documents/lighthouse", headers=B).status_code == 404
        assert c.get("/v1/documents/lighthouse", headers=A).json()["status"] == "ready"  # untouched

        a_paris = c.get("/v1/documents/paris", params={"include_text": True}, headers=A).json()
        b_paris = c.get("/v1/documents/paris", params={"include_text": True}, headers=B).json()
        assert a_paris["text"].startswith("Paris is the capital") and b_paris["text"] == "B's own note about Paris."
        assert [d["id"] for d in c.get("/v1/documents", headers=B).json()["documents"]] == ["paris"]
        assert [d["id"] for d in c.get("/v1/documents", headers=A).json()["documents"]] == ["lighthouse", "paris"]
        answer = c.post("/v1/query", json={"question": "What is this note?", "document_ids": ["paris"]}, headers=B)
        assert answer.json()["documents"][0]["content_hash"] == b_paris["content_hash"]


def test_without_keys_the_server_is_single_tenant_and_says_so(make_client, caplog):
    with caplog.at_level(logging.WARNING, logger="api.state"), make_client() as c:
        c.post("/v1/documents", json={"id": "x", "text": "anything"}, headers={"Authorization": "Bearer whatever"})
        assert c.get("/v1/documents/x").status_code == 200  # any or no key: tenant 'default'
        assert c.app_state.store.index.get("default", "x") is not None
        assert c.get("/readyz").json()["tenancy"] == "single-tenant"
    assert any("single-tenant" in r.getMessage() for r in caplog.records)


def _first_query_hit_of_b(make_client, **settings) -> tuple[bool, bool]:
    """Tenant A ingests and queries a text (twice: encoded, then cached); tenant B ingests the same text and
    queries it once: ``(A's second query hit, B's first query hit)``."""
    text = {"id": "guess", "text": "The vault combination is KIWI42, changed every Monday."}
    query = {"question": "What is the combination?", "document_ids": ["guess"]}
    with make_client(api_keys=KEYS, precompute_threads=0, **settings) as c:  # caches only from queries
        assert c.post("/v1/documents", json=text, headers=A).status_code == 202
        assert c.post("/v1/query", json=query, headers=A).json()["documents"][0]["cache_hit"] is False
        a_hit = c.post("/v1/query", json=query, headers=A).json()["documents"][0]["cache_hit"]
        assert c.post("/v1/documents", json=text, headers=B).status_code == 202
        b = c.post("/v1/query", json=query, headers=B)
        assert b.status_code == 200, b.text
        return a_hit, b.json()["documents"][0]["cache_hit"]


def test_a_tenant_learns_nothing_from_another_tenants_caches(make_client):
    assert _first_query_hit_of_b(make_client) == (True, False)  # B's first use of the text is a miss


def test_tenants_that_trust_each_other_can_share_caches(make_client):
    assert _first_query_hit_of_b(make_client, shared_cache_across_tenants=True) == (True, True)


def test_fair_admission_counts_the_api_keys_tenant_in_the_metrics(make_client, fixture_docs):
    with make_client(api_keys=KEYS, admission_policy="fair") as c:
        c.post("/v1/documents", json=fixture_docs[1], headers=A)
        wait_ready(c, "paris", headers=A)
        c.post("/v1/query", json={"question": "capital of France?", "document_ids": ["paris"]}, headers=A)
        counters = dict(c.app_state.runtime.scheduler.policy.counters)
        text = c.get("/metrics").text
    assert set(counters) == {"tenant-a"} and counters["tenant-a"] > 0  # the key's tenant, not "default"
    assert f'kvlink_admission_tenant_tokens_total{{tenant="tenant-a"}} {counters["tenant-a"]}' in text
