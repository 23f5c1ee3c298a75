"""What POST /v1/query is refused with, and when: limits and out-of-range fields as 4xx naming the field, a
failure before the first token as an HTTP status and after it as an SSE error event, an overloaded scheduler
(full queue, KV pool too small) as 503 before any stream starts."""

from __future__ import annotations

import json

from api_helpers import parse_sse, wait_ready


def test_query_limits_are_clear_4xx(make_client, fixture_docs):
    with make_client(max_question_chars=50, max_top_k=3, max_new_tokens_limit=8, max_query_documents=2) as c:
        c.post("/v1/documents", json=fixture_docs[1])

        def err(body, status):
            r = c.post("/v1/query", json=body)
            assert r.status_code == status, r.text
            return r.json()["error"]["message"]

        q = "capital of France?"
        assert "60 characters; the limit is 50" in err({"question": "x" * 60, "top_k": 1}, 422)
        assert "top_k must be within 1..3" in err({"question": q, "top_k": 4}, 422)
        assert "either document_ids or top_k" in err({"question": q, "top_k": 1, "document_ids": ["paris"]}, 422)
        assert "max_new_tokens must be within 1..8" in err({"question": q, "top_k": 1, "max_new_tokens": 9}, 422)
        assert "3 document ids; the limit is 2" in err({"question": q, "document_ids": ["a", "b", "c"]}, 422)
        assert "unknown document id(s): nope, gone" in err({"question": q, "document_ids": ["nope", "gone"]}, 404)
        assert "k (link tokens per document) must be within 0..5" in err({"question": q, "top_k": 1, "k": 6}, 422)
        assert "unknown adapter 'lora-x'" in err({"question": q, "top_k": 1, "adapter": "lora-x"}, 404)
        assert "question: String should have at least 1 character" in err({"question": ""}, 422)
        assert "body.question: Field required" in err({"top_k": 1}, 422)
        assert "body.topk: Extra inputs are not permitted" in err({"question": q, "topk": 1}, 422)
        ok = c.post("/v1/query", json={"question": q, "top_k": 1, "k": 0, "adapter": "none", "max_new_tokens": 2})
        assert ok.status_code == 200 and ok.json()["completion_tokens"] <= 2


def test_fields_out_of_range_are_refused_where_they_enter(client, fixture_docs):
    client.post("/v1/documents", json=fixture_docs[1])
    wait_ready(client, "paris")
    ask = {"question": "What is the capital of France?", "document_ids": ["paris"], "max_new_tokens": 2}

    def refused(body, raw: bytes | None = None):
        r = client.post("/v1/query", json=body) if raw is None else client.post(
            "/v1/query", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_request"
        return r.json()["error"]["message"]

    for stream in (False, True):  # refused before any stream starts
        assert "body.seed: Input should be less than or equal to 18446744073709551615" in refused(
            {**ask, "seed": 2**64, "stream": stream})
    assert "body.seed" in refused({**ask, "seed": -1})
    assert "body.max_new_tokens" in refused({**ask, "max_new_tokens": 2**70})
    assert "body.temperature" in refused({}, b'{"question": "q", "top_k": 1, "temperature": NaN}')
    assert "body.top_p" in refused({}, b'{"question": "q", "top_k": 1, "top_p": Infinity}')
    assert "body.top_k" in refused({"question": "q", "top_k": 0})
    assert "body.k" in refused({**ask, "k": 10**6})
    assert "body.adapter" in refused({**ask, "adapter": "a" * 65})
    ok = client.post("/v1/query", json={**ask, "seed": 2**64 - 1, "temperature": 1.0})
    assert ok.status_code == 200, ok.text


def test_any_failure_inside_a_stream_ends_it_with_an_error_event(client, fixture_docs, monkeypatch):
    from kvlink_rag.engine import Engine
    from kvlink_rag.types import ContextTooLong

    client.post("/v1/documents", json=fixture_docs[1])
    wait_ready(client, "paris")
    ask = {"question": "What is the capital of France?", "document_ids": ["paris"]}
    queries = client.app_state.queries

    def broken(plan):
        yield "token", "Par"
        raise RuntimeError("boom")

    monkeypatch.setattr(queries, "stream", broken)
    r = client.post("/v1/query", json={**ask, "stream": True})
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["token", "error"]
    assert json.loads(events[-1][1]) == {"error": {"code": "internal_error", "message": "internal error: RuntimeError: "
                                                   "boom", "type": "server_error"}}
    monkeypatch.undo()

    def too_long(self, *args, **kwargs):
        raise ContextTooLong("prompt of 3000 tokens exceeds the model's 2048")

    monkeypatch.setattr(Engine, "link_context", too_long)
    monkeypatch.setattr("kvlink_rag.runtime.admit.admit", too_long)  # the batching scheduler's way in
    for stream in (True, False):  # known before the first token: an HTTP status, before any stream starts
        r = client.post("/v1/query", json={**ask, "stream": stream})
        assert r.status_code == 422 and r.json()["error"]["code"] == "context_too_long", r.text
        assert r.headers["content-type"].startswith("application/json")

    def other_value_error(self, *args, **kwargs):
        raise ValueError("Overflow when unpacking long long")  # e.g. from inside torch: not the client's prompt

    monkeypatch.setattr(Engine, "link_context", other_value_error)
    monkeypatch.setattr("kvlink_rag.runtime.admit.admit", other_value_error)
    monkeypatch.setattr(client._transport, "raise_server_exceptions", False)  # answer the 500 as a server would
    for stream in (False, True):
        r = client.post("/v1/query", json={**ask, "stream": stream})
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"


def test_a_full_scheduler_queue_answers_503_with_retry_after(make_client, fixture_docs):
    with make_client(max_waiting_requests=0) as c:  # no request may wait: every query is turned away
        c.post("/v1/documents", json=fixture_docs[1])
        wait_ready(c, "paris")
        chat = {"messages": [{"role": "user", "content": "Capital?"}], "document_ids": ["paris"]}
        for path, body in (("/v1/query", {"question": "Capital?", "document_ids": ["paris"]}),
                           ("/v1/chat/completions", chat)):
            for stream in (False, True):  # a stream is refused before it starts: no 200 for clients to retry
                r = c.post(path, json={**body, "stream": stream})
                assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", (path, stream, r.text)
                assert int(r.headers["Retry-After"]) >= 1 and "retry in" in r.json()["error"]["message"]


def test_a_query_larger_than_the_kv_pool_answers_503_and_the_pool_is_whole_after(make_client, fixture_docs, tiny_engine):
    from kvlink_rag.runtime.block_pool import configure_pool

    block = configure_pool(tiny_engine.lm, 0).block_bytes
    try:
        with make_client(kv_pool_bytes=2 * block) as c:  # two blocks: no linked query fits
            c.post("/v1/documents", json=fixture_docs[1])
            wait_ready(c, "paris")
            for stream in (False, True):  # refused before a stream starts, as a full queue is
                r = c.post("/v1/query", json={"question": "Capital?", "document_ids": ["paris"], "stream": stream})
                assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
                assert "out of KV memory" in r.json()["error"]["message"] and "free blocks of 2" in r.json()["error"]["message"]
            pool = c.app_state.runtime.scheduler.stats()["kv_pool"]
            assert pool["free_blocks"] == pool["blocks"] == 2  # nothing held by the refused requests
    finally:
        configure_pool(tiny_engine.lm, 0)



def test_a_query_past_the_context_is_refused_before_any_document_is_encoded_or_stored(make_client, tmp_path,
                                                                                        monkeypatch):
    from factories import tiny_text_engine
    from kvlink_rag.engine_documents import EngineDocuments

    small = tiny_text_engine(tmp_path / "small", max_positions=96, max_new_tokens=4)
    encoded, encode = [], EngineDocuments.encode
    monkeypatch.setattr(EngineDocuments, "encode", lambda self, doc: encoded.append(doc) or encode(self, doc))
    with make_client(engine=small, precompute_threads=0) as c:  # nothing cached: a query would encode them
        for doc_id in ("a", "b"):  # 33 tokens each: one fits, both with the prefix and link tokens do not
            assert c.post("/v1/documents", json={"id": doc_id, "text": "word " * 30}).status_code == 202
        ask = {"question": "what is it?", "document_ids": ["a", "b"]}
        chat = {"messages": [{"role": "user", "content": "what is it?"}], "document_ids": ["a", "b"]}
        for path, body in (("/v1/query", ask), ("/v1/query", {**ask, "retention": 0.5}),  # retention reads first
                           ("/v1/query", {**ask, "recompute_ratio": 0.5}), ("/v1/chat/completions", chat)):
            for stream in (False, True):
                r = c.post(path, json={**body, "stream": stream})
                assert r.status_code == 422 and r.json()["error"]["code"] == "context_too_long", (path, r.text)
                message = r.json()["error"]["message"]
                assert "2 documents 66, link tokens 10" in message and "context holds 96 tokens" in message, message
                assert path.endswith("completions") or message == (
                    "the prompt needs 117 tokens (prefix 29, 2 documents 66, link tokens 10, question 12) plus 1 new "
                    "token(s); the model's context holds 96 tokens (the longest, #1, has 33 tokens)")
        assert encoded == [] and c.app_state.store.blobs.keys() == []
        assert [c.get(f"/v1/documents/{d}").json()["status"] for d in ("a", "b")] == ["queued", "queued"]
