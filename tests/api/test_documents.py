"""/v1/documents on the embedded default: ingest (one, batch), read, list, update, delete, limits."""

from __future__ import annotations

import re

from api_helpers import wait_ready
from store.keys import content_hash, normalize_text, simhash64

LONG = ("The lighthouse on Skerry Point was built in 1851 and painted red and white. Its keeper, Ann Morrow, kept "
        "the lamp lit through the storms of the winter of 1867, when three ships ran aground on the reef to the "
        "north. The tower is 31 metres tall, has 140 steps, and its lens was made in Paris by Henry-Lepaute. It "
        "was automated in 1984 and is now a museum run by the county, open from April to October.")


def test_ingest_one_and_a_batch_answers_202_with_hashes_and_near_duplicates(client, fixture_docs):
    one = client.post("/v1/documents", json=fixture_docs[0])
    assert one.status_code == 202
    body = one.json()
    text = normalize_text(fixture_docs[0]["text"])
    assert body["id"] == "lighthouse" and body["version"] == 1 and body["queued"] is True
    assert body["status"] in ("queued", "ready")
    assert body["content_hash"] == content_hash(text)
    assert body["simhash"] == f"{simhash64(text):016x}" and re.fullmatch(r"[0-9a-f]{16}", body["simhash"])

    batch = client.post("/v1/documents", json={"documents": [{"id": "long", "text": LONG},
                                                             {"text": LONG.replace("museum", "gallery")}]})
    assert batch.status_code == 202
    first, second = batch.json()["documents"]
    assert first["near_duplicates"] == []
    assert re.fullmatch(r"[0-9a-f]{32}", second["id"])  # generated
    [dup] = second["near_duplicates"]
    assert dup["id"] == "long" and 0 < dup["distance"] <= 3

    again = client.post("/v1/documents", json=fixture_docs[0]).json()  # same text: nothing new
    assert again["queued"] is False and again["version"] == 1


def test_get_and_list_are_paged_and_ordered_by_id(client, fixture_docs):
    client.post("/v1/documents", json={"documents": fixture_docs})
    detail = wait_ready(client, "paris")
    assert detail["title"] == "Paris" and detail["num_tokens"] > 10 and detail["nbytes"] > 0
    assert detail["cache_key"] and detail["text"] is None
    with_text = client.get("/v1/documents/paris", params={"include_text": True}).json()
    assert with_text["text"] == normalize_text(fixture_docs[1]["text"])
    assert client.get("/v1/documents/lighthouse").json()["metadata"] == {"source": "fixture"}

    page = client.get("/v1/documents", params={"offset": 1, "limit": 2}).json()
    assert page["total"] == 4 and page["offset"] == 1 and page["limit"] == 2
    assert [d["id"] for d in page["documents"]] == ["paris", "photosynthesis"]
    assert client.get("/v1/documents", params={"limit": 5000}).status_code == 422


def test_update_invalidates_the_old_cache(client, fixture_docs):
    store = client.app_state.store
    client.post("/v1/documents", json=fixture_docs[1])
    old = wait_ready(client, "paris")
    assert old["cache_key"] in store.blobs

    new_text = "Paris is the capital of France. It hosted the Summer Olympics in 1900, 1924 and 2024."
    upd = client.put("/v1/documents/paris", json={"text": new_text})
    assert upd.status_code == 202 and upd.json()["version"] == 2 and upd.json()["queued"] is True
    new = wait_ready(client, "paris")
    assert new["version"] == 2 and new["content_hash"] == content_hash(new_text) and new["title"] == "Paris"
    assert new["cache_key"] != old["cache_key"]
    assert new["cache_key"] in store.blobs and old["cache_key"] not in store.blobs
    assert client.put("/v1/documents/nope", json={"text": "x"}).status_code == 404


def test_delete_removes_record_text_and_cache(client, fixture_docs):
    store = client.app_state.store
    client.post("/v1/documents", json=fixture_docs[3])
    key = wait_ready(client, "volcano")["cache_key"]
    assert key in store.blobs

    gone = client.delete("/v1/documents/volcano")
    assert gone.status_code == 200 and gone.json() == {"id": "volcano", "deleted": True}
    assert client.get("/v1/documents/volcano").status_code == 404
    assert key not in store.blobs and store.texts.get("default", "volcano") is None
    assert all(key not in tier for tier in store.tiered.tiers)
    q = client.post("/v1/query", json={"question": "Which volcano?", "document_ids": ["volcano"]})
    assert q.status_code == 404 and "volcano" in q.json()["error"]["message"]
    assert client.delete("/v1/documents/volcano").status_code == 404


def test_limits_and_malformed_requests_are_clear_4xx(make_client):
    with make_client(max_document_chars=300, max_document_tokens=20, max_batch_documents=2,
                     max_metadata_bytes=50) as c:
        def err(resp, status):
            assert resp.status_code == status, resp.text
            return resp.json()["error"]["message"]

        assert "400 characters; the limit is 300" in err(c.post("/v1/documents", json={"text": "a" * 400}), 413)
        assert "tokens; the limit is 20" in err(c.post("/v1/documents", json={"text": "word " * 50}), 413)
        three = {"documents": [{"text": "one"}, {"text": "two"}, {"text": "three"}]}
        assert "3 documents in one request; the limit is 2" in err(c.post("/v1/documents", json=three), 413)
        meta = {"text": "short", "metadata": {"blob": "x" * 100}}
        assert "metadata" in err(c.post("/v1/documents", json=meta), 413)
        dup = {"documents": [{"id": "a", "text": "one"}, {"id": "a", "text": "two"}]}
        assert "repeated in the batch: a" in err(c.post("/v1/documents", json=dup), 422)
        assert "body.document.text: Field required" in err(c.post("/v1/documents", json={"title": "t"}), 422)
        assert "body.document.txt: Extra inputs" in err(c.post("/v1/documents", json={"txt": "x"}), 422)
        assert "body.document.id" in err(c.post("/v1/documents", json={"id": "a/b", "text": "x"}), 422)
        bad = c.post("/v1/documents", content=b'{"text": ', headers={"content-type": "application/json"})
        assert bad.json()["error"]["code"] == "malformed_json" and "malformed JSON" in err(bad, 422)
        assert "empty" in err(c.post("/v1/documents", json={"text": "   "}), 422)
        assert c.get("/v1/documents").json()["total"] == 0  # nothing of the rejected batches was stored
