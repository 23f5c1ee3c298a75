"""Stored texts and index records are verified like caches: one flipped byte makes the document ``failed``
with a clear error (never served, never taking the tenant down), is counted, and re-ingesting repairs it."""

from __future__ import annotations

import pytest

from api_helpers import wait_ready
from service_support import claimed_redis_db
from store.index.redis import RedisIndex

CODE = {"id": "code", "text": "The harbour door code is KIWI42.", "title": "Codes", "metadata": {"tag": "KIWI42"}}
OTHER = {"id": "tide", "text": "The harbour tide table is posted at the pier."}
BY_ID = {"question": "What is the harbour door code?", "document_ids": ["code"]}
SEARCH = {"question": "harbour tide pier code", "top_k": 3}


def _metric(client, kind: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'kvlink_corrupt_records_total{{kind="{kind}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no kvlink_corrupt_records_total for {kind}")


def _flip_text(store) -> None:
    key = b"default\0code"
    db = store.texts._db
    store.texts.env.write(lambda txn: txn.put(key, bytes(txn.get(key, db=db)).replace(b"KIWI42", b"KIWI92"), db=db))


def _flip_record(store) -> None:
    index = store.index
    if isinstance(index, RedisIndex):  # Redis: one field of the record's hash
        index.r.hset(index._doc("default", "code"), "metadata", '{"tag": "KIWI92"}')
        return
    key, db = b"default\0code", index._rec
    index.env.write(lambda txn: txn.put(key, bytes(txn.get(key, db=db)).replace(b"KIWI42", b"KIWI92"), db=db))


def _ingest(c) -> None:
    c.post("/v1/documents", json={"documents": [CODE, OTHER]})
    wait_ready(c, "code")
    wait_ready(c, "tide")


def _assert_repaired_by_reingest(c) -> None:
    assert c.post("/v1/documents", json=CODE).json()["queued"] is True
    assert wait_ready(c, "code")["metadata"] == {"tag": "KIWI42"}
    ok = c.post("/v1/query", json=BY_ID)
    assert ok.status_code == 200, ok.text


def test_a_flipped_byte_in_a_stored_text_is_never_served(client):
    _ingest(client)
    _flip_text(client.app_state.store)
    q = client.post("/v1/query", json=BY_ID)
    assert q.status_code == 409 and q.json()["error"]["code"] == "document_corrupt"
    assert "checksum mismatch" in q.json()["error"]["message"] and "re-ingest" in q.json()["error"]["message"]
    got = client.get("/v1/documents/code", params={"include_text": True}).json()
    assert got["status"] == "failed" and got["text"] is None and "corrupt" in got["metadata"]["error"]
    assert [d["id"] for d in client.get("/v1/documents").json()["documents"]] == ["code", "tide"]
    client.app_state.retrieval.invalidate("default")
    found = client.post("/v1/query", json=SEARCH)
    assert found.status_code == 200 and [d["id"] for d in found.json()["documents"]] == ["tide"]
    assert _metric(client, "text") >= 1
    _assert_repaired_by_reingest(client)


@pytest.fixture(params=["embedded", "redis"])
def backend_client(request, make_client):
    if request.param == "embedded":
        with make_client() as c:
            yield c
        return
    with claimed_redis_db() as url, make_client(index_url=url) as c:
        yield c


def test_a_flipped_byte_in_an_index_record_fails_that_document_only(backend_client):
    c = backend_client
    _ingest(c)
    _flip_record(c.app_state.store)
    got = c.get("/v1/documents/code")
    assert got.status_code == 200 and got.json()["status"] == "failed"
    assert got.json()["metadata"]["error"] == "corrupt index record (checksum mismatch); re-ingest the document"
    listed = c.get("/v1/documents").json()["documents"]
    assert [(d["id"], d["status"]) for d in listed] == [("code", "failed"), ("tide", "ready")]
    c.app_state.retrieval.invalidate("default")
    found = c.post("/v1/query", json=SEARCH)
    assert found.status_code == 200 and [d["id"] for d in found.json()["documents"]] == ["tide"]
    q = c.post("/v1/query", json=BY_ID)
    assert q.status_code == 409 and q.json()["error"]["code"] == "document_corrupt"
    assert _metric(c, "record") >= 1
    _assert_repaired_by_reingest(c)
