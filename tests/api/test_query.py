"""POST /v1/query on the embedded default: answers from the cache, encoding on the spot, updates, SSE,
BM25 retrieval kept current, full prefill; what a query is refused with is in test_query_refusals.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from api_helpers import parse_sse, wait_ready
from store.keys import content_hash

TIMINGS = {"retrieval_s", "queue_wait_s", "cache_load_s", "link_s", "ttft_s", "total_s"}


def test_ingest_then_query_answers_from_the_cache(client, fixture_docs):
    client.post("/v1/documents", json={"documents": fixture_docs})
    for d in fixture_docs:
        wait_ready(client, d["id"])
    r = client.post("/v1/query", json={"question": "Who kept the lighthouse lamp burning?",
                                       "document_ids": ["lighthouse", "paris"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["id"] for d in body["documents"]] == ["lighthouse", "paris"]
    assert all(d["cache_hit"] for d in body["documents"]) and body["documents"][0]["title"] == "Skerry Point lighthouse"
    assert isinstance(body["answer"], str) and 1 <= body["completion_tokens"] <= 4
    t = body["timings"]
    assert set(t) == TIMINGS and all(v >= 0 for v in t.values())
    assert t["retrieval_s"] <= t["ttft_s"] <= t["total_s"] and t["link_s"] > 0
    assert body["context_tokens"] > sum(wait_ready(client, i)["num_tokens"] for i in ("lighthouse", "paris"))

    retrieved = client.post("/v1/query", json={"question": "Which river flows through the capital of France?",
                                               "top_k": 2}).json()
    assert retrieved["documents"][0]["id"] == "paris" and retrieved["documents"][0]["score"] > 0
    assert all(d["cache_hit"] for d in retrieved["documents"])


def test_missing_caches_are_encoded_on_the_spot_and_updates_serve_the_new_text(make_client, fixture_docs):
    with make_client(precompute_threads=0) as c:  # no background precompute: only queries encode
        store = c.app_state.store
        c.post("/v1/documents", json=fixture_docs[1])
        assert c.get("/v1/documents/paris").json()["status"] == "queued"
        ask = {"question": "What is the capital of France?", "document_ids": ["paris"]}

        first = c.post("/v1/query", json=ask).json()["documents"][0]
        assert first["cache_hit"] is False and first["version"] == 1
        detail = c.get("/v1/documents/paris").json()  # encoded now, stored, and the record says so
        assert detail["status"] == "ready" and detail["cache_key"] in store.blobs
        assert c.post("/v1/query", json=ask).json()["documents"][0]["cache_hit"] is True

        new_text = "Paris, on the Seine, is the capital of France and hosted the 2024 Summer Olympics."
        c.put("/v1/documents/paris", json={"text": new_text})
        after = c.post("/v1/query", json=ask).json()["documents"][0]
        assert after["version"] == 2 and after["content_hash"] == content_hash(new_text)
        assert after["cache_hit"] is False
        assert c.post("/v1/query", json=ask).json()["documents"][0]["cache_hit"] is True
        now = c.get("/v1/documents/paris").json()
        assert now["content_hash"] == content_hash(new_text) and now["version"] == 2 and now["status"] == "ready"
        assert now["cache_key"] != detail["cache_key"] and detail["cache_key"] not in store.blobs


def test_stream_sends_token_events_then_the_result(client, fixture_docs):
    client.post("/v1/documents", json=fixture_docs[2])
    wait_ready(client, "photosynthesis")
    ask = {"question": "What does photosynthesis release?", "document_ids": ["photosynthesis"]}
    whole = client.post("/v1/query", json=ask).json()
    r = client.post("/v1/query", json={**ask, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    kinds = [e for e, _ in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"token"}
    done = json.loads(events[-1][1])
    pieces = "".join(json.loads(d)["text"] for e, d in events if e == "token")
    assert pieces.strip() == done["answer"] == whole["answer"]  # greedy: same answer either way
    assert done["documents"][0]["cache_hit"] is True and set(done["timings"]) == TIMINGS


def test_retrieval_follows_ingest_update_and_delete(client):
    ask = {"question": "Where does the emperor penguin breed?", "top_k": 3}
    assert client.post("/v1/query", json=ask).json()["error"]["code"] == "no_documents"  # an empty tenant
    client.post("/v1/documents", json={"documents": [
        {"id": "birds", "text": "The emperor penguin breeds in the Antarctic winter on the sea ice."},
        {"id": "cars", "text": "Electric cars store energy in lithium batteries."}]})
    assert [d["id"] for d in client.post("/v1/query", json=ask).json()["documents"]] == ["birds"]
    unrelated = client.post("/v1/query", json={"question": "Zebras?", "top_k": 3}).json()["error"]
    assert unrelated["code"] == "no_matching_documents" and "document_ids" in unrelated["message"]
    client.put("/v1/documents/cars", json={"text": "The emperor penguin is the tallest penguin; it breeds inland."})
    assert {d["id"] for d in client.post("/v1/query", json=ask).json()["documents"]} == {"birds", "cars"}
    client.delete("/v1/documents/birds")
    assert [d["id"] for d in client.post("/v1/query", json=ask).json()["documents"]] == ["cars"]


def test_concurrent_queries_and_ingests_share_the_engine_safely(client, fixture_docs):
    client.post("/v1/documents", json={"documents": fixture_docs})
    for d in fixture_docs:
        wait_ready(client, d["id"])
    asks = [{"question": f"Tell me about {d['title']}", "document_ids": [d["id"]]} for d in fixture_docs] * 3

    def ask(body):
        return client.post("/v1/query", json=body).json()

    def ingest(i):
        return client.post("/v1/documents", json={"id": f"extra-{i}", "text": f"Extra note number {i}."}).status_code

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(ask, asks))
        codes = list(pool.map(ingest, range(6)))
    assert codes == [202] * 6
    for body, res in zip(asks, answers, strict=True):
        assert [d["id"] for d in res["documents"]] == body["document_ids"] and res["documents"][0]["cache_hit"]
    texts = [a["answer"] for a in answers]
    assert texts[:4] == texts[4:8] == texts[8:]  # greedy: the same answer however requests interleave


def test_named_adapters_are_listed_and_chosen_per_query_without_re_encoding(make_client, fixture_docs, tiny_engine,
                                                                            tmp_path):
    from factories import save_adapter

    links = tmp_path / "home" / "links"  # $KVLINK_RAG_HOME/links of the app below
    save_adapter(tiny_engine, links, "tenant-a", seed=3)
    save_adapter(tiny_engine, links, "foreign", seed=4, fingerprint="e" * 64)
    with make_client() as c:
        c.post("/v1/documents", json=fixture_docs[0])
        wait_ready(c, fixture_docs[0]["id"])
        listed = c.get("/v1/adapters").json()
        assert listed["adapters"] == ["default", "none", "foreign", "tenant-a"] and listed["default"]["k"] == 5
        ask = {"question": "Who kept the lamp?", "document_ids": ["lighthouse"], "max_new_tokens": 2}
        r = c.post("/v1/query", json={**ask, "adapter": "tenant-a"})
        assert r.status_code == 200, r.text
        assert r.json()["documents"][0]["cache_hit"] is True  # the base-model cache serves any adapter
        assert "must be within 0..3" in c.post("/v1/query", json={**ask, "adapter": "tenant-a", "k": 4}).json()["error"]["message"]
        bad = c.post("/v1/query", json={**ask, "adapter": "foreign"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "adapter_mismatch"
        assert "made for model eeeeeeeeeeee" in bad.json()["error"]["message"]


def test_a_document_larger_than_the_whole_store_is_answered_uncached(make_client, tmp_path):
    from factories import tiny_text_engine
    from service_support import wait_for

    big = tiny_text_engine(tmp_path / "big", layers=8, kv_dtype="float32", max_new_tokens=4,  # 2 KiB of KV a token
                           chunk_tokens=0)  # one cache for the whole document (chunks of 512 tokens would fit)
    # the smallest store; no prefix tree (it would serve the second query's document from memory)
    with make_client(engine=big, store_max_bytes=1 << 20, host_cache_bytes=1 << 20, prefix_cache_bytes=0) as c:
        assert c.post("/v1/documents", json={"id": "huge", "text": "word " * 700}).status_code == 202  # ~1.4 MB of KV

        def failed():
            d = c.get("/v1/documents/huge").json()
            return d if d["status"] == "failed" else None

        assert "does not fit the document store" in wait_for(failed, 60, what="precompute failed")["metadata"]["error"]
        ask = {"question": "Which word is repeated?", "document_ids": ["huge"]}
        for _ in range(2):  # neither LMDB nor the memory tier can hold it: encoded for every query
            r = c.post("/v1/query", json=ask)
            assert r.status_code == 200, r.text
            assert r.json()["documents"][0]["cache_hit"] is False and r.json()["completion_tokens"] >= 1
        events = parse_sse(c.post("/v1/query", json={**ask, "stream": True}).text)
        assert events[-1][0] == "done" and json.loads(events[-1][1])["documents"][0]["cache_hit"] is False
        assert c.get("/v1/documents/huge").json()["status"] == "failed" and c.app_state.store.blobs.keys() == []


def test_full_prefill_mode_answers_the_same_prompt_without_caches(client, fixture_docs, tiny_engine):
    from kvlink_rag.types import Document

    ids = ["lighthouse", "paris"]
    client.post("/v1/documents", json={"documents": fixture_docs[:2]})
    hits_before = [wait_ready(client, i)["hits"] for i in ids]
    ask = {"question": "Who kept the lighthouse lamp burning?", "document_ids": ids, "mode": "full"}
    metrics_before = client.get("/metrics").text
    r = client.post("/v1/query", json=ask)
    assert r.status_code == 200, r.text
    body = r.json()
    stored = [client.get(f"/v1/documents/{i}", params={"include_text": True}).json() for i in ids]
    with client.app_state.model_lock:  # the same prompt ids, fully prefilled by the engine itself
        expected = tiny_engine.answer_full(ask["question"], [Document(d["text"], d["title"] or None) for d in stored])
    assert [d["id"] for d in body["documents"]] == ids and [d["cache_hit"] for d in body["documents"]] == [False] * 2
    assert body["answer"] == expected.text and body["completion_tokens"] == len(expected.token_ids)
    assert body["context_tokens"] == expected.context_tokens
    assert body["timings"]["cache_load_s"] == 0 and body["timings"]["link_s"] > 0

    events = parse_sse(client.post("/v1/query", json={**ask, "stream": True}).text)
    done = json.loads(events[-1][1])
    assert [e for e, _ in events][-1] == "done" and done["answer"] == expected.text
    assert "".join(json.loads(d)["text"] for e, d in events if e == "token").strip() == expected.text
    assert [d["cache_hit"] for d in done["documents"]] == [False] * 2
    assert body["cached_tokens"] == done["cached_tokens"] == 0  # the repeat is cold too: no prefix-tree read
    assert [client.get(f"/v1/documents/{i}").json()["hits"] for i in ids] == hits_before  # no cache was used
    for series in ("kvlink_ttft_seconds_count", 'kvlink_query_documents_total{cache="miss"}'):
        assert _metric(client.get("/metrics").text, series) == _metric(metrics_before, series)  # not counted
    linked = client.post("/v1/query", json={**ask, "mode": "linked"}).json()
    assert [d["cache_hit"] for d in linked["documents"]] == [True] * 2
    assert _metric(client.get("/metrics").text, "kvlink_ttft_seconds_count") == 1  # only the linked query

    bad = client.post("/v1/query", json={**ask, "mode": "prefill"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
    assert "body.mode: Input should be 'linked' or 'full'" in bad.json()["error"]["message"]


def test_full_prefill_mode_refuses_a_prompt_longer_than_the_context(make_client, tmp_path):
    from factories import tiny_text_engine

    small = tiny_text_engine(tmp_path / "small", max_positions=96, max_new_tokens=4)
    with make_client(engine=small) as c:
        for doc_id in ("a", "b"):  # 33 tokens each: one fits, both with the 29-token prefix do not
            assert c.post("/v1/documents", json={"id": doc_id, "text": "word " * 30}).status_code == 202
        ask = {"question": "what is it?", "mode": "full"}
        assert c.post("/v1/query", json={**ask, "document_ids": ["a"]}).status_code == 200
        r = c.post("/v1/query", json={**ask, "document_ids": ["a", "b"]})
        assert r.status_code == 422 and r.json()["error"]["code"] == "context_too_long"
        assert "exceeds the model's context of 96 positions" in r.json()["error"]["message"]
        r = c.post("/v1/query", json={**ask, "document_ids": ["a", "b"], "stream": True})
        assert r.status_code == 422 and r.json()["error"]["code"] == "context_too_long"


def _metric(text: str, series: str) -> float:
    """The value of ``series`` in a Prometheus exposition ``text`` (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0
