"""/v1/documents on the embedded default: ingest (one, batch), read, list, update, delete, limits."""

from __future__ import annotations

import json
import re

from api_helpers import parse_sse, wait_ready
from kvlink_rag.encodable import normalize_text
from store.keys import content_hash, simhash64

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

    wait_ready(client, "lighthouse")
    again = client.post("/v1/documents", json=fixture_docs[0]).json()  # same text, ready: nothing new
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
        assert "body.text: Field required" in err(c.post("/v1/documents", json={"title": "t"}), 422)
        assert "body.txt: Extra inputs" in err(c.post("/v1/documents", json={"txt": "x"}), 422)
        assert "body.id:" in err(c.post("/v1/documents", json={"id": "a/b", "text": "x"}), 422)
        bad = c.post("/v1/documents", content=b'{"text": ', headers={"content-type": "application/json"})
        assert bad.json()["error"]["code"] == "malformed_json" and "malformed JSON" in err(bad, 422)
        assert "empty" in err(c.post("/v1/documents", json={"text": "   "}), 422)
        assert c.get("/v1/documents").json()["total"] == 0  # nothing of the rejected batches was stored


def test_documents_that_can_never_be_queried_are_refused_at_ingest(make_client, tmp_path):
    """96-position model, 29-token prefix, K=5, shortest question 9 tokens, 1 new token: at most 52 tokens."""
    from factories import tiny_text_engine

    small = tiny_text_engine(tmp_path / "small", max_positions=96, max_new_tokens=4)
    with make_client(engine=small) as c:
        r = c.post("/v1/documents", json={"id": "long", "text": "word " * 80})  # 83 tokens
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "document_too_large"
        assert ("has 83 tokens; the limit is 52: the model's context of 96 positions less the 29-token prefix, "
                "5 link tokens, a question of at least 9 tokens and 1 new token") in r.json()["error"]["message"]
        for doc_id in ("a", "b"):
            assert c.post("/v1/documents", json={"id": doc_id, "text": "word " * 30}).status_code == 202  # 33 tokens
            wait_ready(c, doc_id)
        one = c.post("/v1/query", json={"question": "what is it?", "document_ids": ["a"], "max_new_tokens": 100})
        assert one.status_code == 200, one.text
        body = one.json()
        assert body["finish_reason"] == "length" and body["context_tokens"] + body["completion_tokens"] == 96
        streamed = c.post("/v1/query", json={"question": "what is it?", "document_ids": ["a"], "max_new_tokens": 100,
                                             "stream": True})
        done = json.loads(parse_sse(streamed.text)[-1][1])
        assert done["finish_reason"] == "length" and done["completion_tokens"] == body["completion_tokens"]
        both = c.post("/v1/query", json={"question": "what is it?", "document_ids": ["a", "b"]})
        assert both.status_code == 422, both.text
        assert both.json()["error"]["code"] == "context_too_long"
        assert "the prompt needs 117 tokens" in both.json()["error"]["message"]


def test_ids_that_an_http_client_could_not_address_are_refused_at_ingest(client):
    for bad in (".", "..", "a/b", "a\\b", "what?", "a#b", "100%", "tab\there", "x" * 201, "é" * 101):
        r = client.post("/v1/documents", json={"id": bad, "text": "Some text."})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid_request"
        message = r.json()["error"]["message"]
        assert "body.id:" in message and "invalid document id" in message  # the field, not the union tag
        batch = client.post("/v1/documents", json={"documents": [{"id": bad, "text": "Some text."}]})
        assert "body.documents.0.id:" in batch.json()["error"]["message"]
        q = client.post("/v1/query", json={"question": "what?", "document_ids": ["ok", bad]})
        assert q.status_code == 422 and "document_ids.1" in q.json()["error"]["message"], (bad, q.text)
    for good in ("...", "a.b", "a b", "naïve", "x" * 200, "é" * 100):
        assert client.post("/v1/documents", json={"id": good, "text": "Some text."}).status_code == 202, good
        assert client.get(f"/v1/documents/{good}").json()["id"] == good  # reachable as it was ingested


def test_list_offsets_are_bounded_and_past_the_end_is_empty_on_redis(make_client):
    from service_support import claimed_redis_db

    with claimed_redis_db() as url, make_client(index_url=url) as c:
        c.post("/v1/documents", json={"documents": [{"id": "a", "text": "One."}, {"id": "b", "text": "Two."}]})
        page = c.get("/v1/documents", params={"offset": 10**9, "limit": 1000})
        assert page.status_code == 200 and page.json()["documents"] == [] and page.json()["total"] == 2
        huge = c.get("/v1/documents", params={"offset": 2**63 - 1})
        assert huge.status_code == 422 and "offset" in huge.json()["error"]["message"]
        index = c.app_state.store.index
        assert index.list("default", offset=2**63 - 1, limit=1000) == []  # the index itself never overflows
        assert [r.doc_id for r in index.list("default", offset=1, limit=2**63)] == ["b"]


def test_a_record_stored_with_text_no_encoder_accepts_never_fails_a_listing(client, fixture_docs):
    from store.check import check_store

    client.post("/v1/documents", json={"documents": fixture_docs[:2]})
    for d in fixture_docs[:2]:
        wait_ready(client, d["id"])
    store = client.app_state.store  # as stored before the API refused {"metadata": {"k": "\ud800"}}
    store.index.set_status("default", "lighthouse", "ready", title="Skerry\ud800", metadata={"k": "\ud800", "n": 1})
    listing = client.get("/v1/documents")
    assert listing.status_code == 200, listing.text
    shown = {d["id"]: d for d in listing.json()["documents"]}
    assert set(shown) == {"lighthouse", "paris"} and shown["paris"]["title"] == fixture_docs[1]["title"]
    assert (shown["lighthouse"]["title"], shown["lighthouse"]["metadata"]) == ("Skerry\ufffd", {"k": "\ufffd", "n": 1})
    one = client.get("/v1/documents/lighthouse", params={"include_text": True})
    assert one.status_code == 200 and one.json()["metadata"] == {"k": "\ufffd", "n": 1} and one.json()["text"]
    stored = store.texts.get("default", "lighthouse")
    store.texts.put("default", "lighthouse", stored["version"], stored["text"], "Skerry\ud800", stored["metadata"])
    ask = {"question": "Who kept the lamp?", "document_ids": ["lighthouse"], "max_new_tokens": 1}
    r = client.post("/v1/query", json=ask)  # its title goes into the prompt: no tokenizer reads it
    assert r.status_code == 409 and r.json()["error"]["code"] == "document_unreadable", r.text
    assert client.post("/v1/query", json={**ask, "document_ids": ["paris"]}).status_code == 200
    assert check_store(store, min_age_s=0).unencodable == [("default", "lighthouse")]
    check_store(store, repair=True, min_age_s=0)
    assert client.post("/v1/query", json=ask).status_code == 200
    assert store.index.get("default", "lighthouse").metadata == {"k": "\ufffd", "n": 1}
    assert check_store(store, min_age_s=0).problems == 0
    def view(docs):
        return {d["id"]: (d["title"], d["metadata"], d["status"], d["version"]) for d in docs}

    assert view(client.get("/v1/documents").json()["documents"]) == view(shown.values())  # now what is stored
