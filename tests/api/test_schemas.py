"""Request bodies at the door (api.schemas): strict types, text that is not valid Unicode refused in every
string field of every route, and the edges of every numeric field (a 200 or a 422, never a 500)."""

from __future__ import annotations

import json

import pytest

from api_helpers import parse_sse, wait_ready

ASK = {"question": "What is the capital of France?", "document_ids": ["paris"], "max_new_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "document_ids": ["paris"],
        "max_tokens": 2}
BAD = "\ud800"  # a lone surrogate: Python's json reads the escape "\ud800" without complaint


def nested(levels: int) -> dict:
    """``{"a": {"a": ... 1}}``: ``levels`` dicts, one inside the other."""
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def post(client, path: str, body: dict, method: str = "POST"):
    """Send ``body`` as JSON with escapes (``json.dumps``), as a client sending ``\\ud800`` would."""
    return client.request(method, path, content=json.dumps(body), headers={"content-type": "application/json"})


def refused(client, path: str, body: dict, method: str = "POST") -> str:
    """The message of the 422 ``invalid_request`` that ``body`` gets (asserted)."""
    r = post(client, path, body, method)
    assert r.status_code == 422, (path, body, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json") and r.json()["error"]["code"] == "invalid_request"
    return r.json()["error"]["message"]


@pytest.fixture
def paris(client, fixture_docs):
    client.post("/v1/documents", json=fixture_docs[1])
    wait_ready(client, "paris")
    return client


def test_text_that_is_not_valid_unicode_is_refused_in_every_field_of_the_document_routes(paris):
    c = paris
    doc = {"id": "m", "text": "x"}
    cases = {  # body -> the field the message names
        "body.metadata.k": {**doc, "metadata": {"k": BAD}},  # the input
        "body.metadata": {**doc, "metadata": {"k" + BAD: 1}},
        "body.metadata.a.b.1": {**doc, "metadata": {"a": {"b": ["ok", "x" + BAD]}}},
        "body.text": {**doc, "text": "ab" + BAD},
        "body.title": {**doc, "title": BAD},
        "body.id": {**doc, "id": "m" + BAD},
        "body.documents.1.title": {"documents": [{"text": "fine"}, {"text": "y", "title": BAD}]},
    }
    for field, body in cases.items():
        message = refused(c, "/v1/documents", body)
        assert message.startswith(f"{field}") and "lone surrogate U+D800" in message, message
    assert "body.metadata.k: nan is not a JSON number" in refused(c, "/v1/documents", {**doc, "metadata": {"k": float("nan")}})
    for field in ("text", "title"):
        assert f"body.{field}: lone surrogate" in refused(c, "/v1/documents/paris", {"text": "t", field: BAD}, "PUT")
    assert "body.metadata.k" in refused(c, "/v1/documents/paris", {"text": "t", "metadata": {"k": BAD}}, "PUT")
    assert "nested deeper than 32 levels" in refused(c, "/v1/documents", {**doc, "metadata": nested(33)})
    listing = c.get("/v1/documents")
    assert listing.status_code == 200 and [d["id"] for d in listing.json()["documents"]] == ["paris"]
    assert c.get("/v1/documents/paris").json()["version"] == 1  # nothing was stored or changed
    assert post(c, "/v1/documents", {**doc, "metadata": nested(32)}).status_code == 202  # as deep as allowed
    assert c.get("/v1/documents").status_code == 200 and c.get("/v1/documents/m").json()["metadata"] == nested(32)


def test_text_that_is_not_valid_unicode_is_refused_in_queries_and_every_chat_message(paris):
    c = paris
    for stream in (False, True):  # before any stream starts
        assert "body.question: lone surrogate U+D800 at character 1" in refused(
            c, "/v1/query", {**ASK, "question": "a" + BAD, "stream": stream})
    assert "body.document_ids.0" in refused(c, "/v1/query", {**ASK, "document_ids": [BAD]})
    assert "body.adapter" in refused(c, "/v1/query", {**ASK, "adapter": BAD})
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Capital?"}]
    for i, turn in enumerate(turns):  # every role
        for stream in (False, True):
            messages = [dict(t) for t in turns]
            messages[i]["content"] = "x" + BAD
            message = refused(c, "/v1/chat/completions", {**CHAT, "messages": messages, "stream": stream})
            assert message.startswith(f"body.messages.{i}.content: lone surrogate"), message
    parts = [{"type": "text", "text": "Capital "}, {"type": "text", "text": BAD}]
    assert refused(c, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": parts}]}).startswith(
        "body.messages.0.content.1.text: lone surrogate")
    for field, body in {"body.messages.0.role": {**CHAT, "messages": [{"role": BAD, "content": "x"}]},
                        "body.messages.0.name": {**CHAT, "messages": [{"role": "user", "content": "x", "name": BAD}]},
                        "body.model": {**CHAT, "model": BAD}, "body.user": {**CHAT, "user": BAD},
                        "body.document_ids.1": {**CHAT, "document_ids": ["paris", BAD]}}.items():
        assert refused(c, "/v1/chat/completions", body).startswith(field)
    ok = post(c, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Capital?"}, {"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert ok.status_code == 200, ok.text


def test_loose_types_are_refused_naming_the_field_and_integers_still_count_as_numbers(paris):
    c = paris
    for field, value in (("stream", "yes"), ("explain", "yes"), ("top_k", "3"), ("stream", 1), ("max_new_tokens", 2.0),
                         ("temperature", "1"), ("temperature", True), ("seed", "7"), ("document_ids", "paris"),
                         ("question", 5)):
        body = {**ASK, field: value} if field != "top_k" else {"question": "Capital?", "top_k": value}
        assert refused(c, "/v1/query", body).startswith(f"body.{field}: Input should be a valid"), (field, value)
    for field, value in (("stream", "yes"), ("max_tokens", "3"), ("n", "1"), ("top_p", "1")):
        assert refused(c, "/v1/chat/completions", {**CHAT, field: value}).startswith(f"body.{field}: "), field
    assert refused(c, "/v1/chat/completions", {**CHAT, "logprobs": "no"}).startswith("body.logprobs: Input should be a valid boolean")
    # presence_penalty is an OpenAI field this server does not implement: refused by name whatever its value's type
    assert "presence_penalty is not supported" in refused(c, "/v1/chat/completions", {**CHAT, "presence_penalty": "no"})
    assert refused(c, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}).startswith(
        "body.messages.0.content")
    for field, value in (("text", 5), ("title", 5), ("metadata", "x"), ("id", 7)):
        assert refused(c, "/v1/documents", {"id": "z", "text": "t", field: value}).startswith(f"body.{field}")
    for body in ({**ASK, "temperature": 1, "top_p": 1, "seed": 3, "retention": 1, "recompute_ratio": 0},
                 {**ASK, "temperature": 0}):
        r = post(c, "/v1/query", body)  # JSON integers for float fields are numbers, as in OpenAI's API
        assert r.status_code == 200, r.text
    assert post(c, "/v1/chat/completions", {**CHAT, "temperature": 1, "top_p": 1}).status_code == 200
    assert c.get("/v1/documents", params={"limit": "2", "offset": "0"}).status_code == 200  # query strings parse


def test_every_numeric_query_field_at_its_edges_is_a_200_or_a_422_naming_it(paris):
    c = paris
    eng = c.app_state.engine
    loaded_k = eng.link_tokens.k if eng.link_tokens is not None else 0
    greedy = post(c, "/v1/query", ASK).json()["answer"]
    accepted = [("temperature", 0), ("temperature", 1e-300), ("temperature", 5e-324), ("temperature", 1e-5),
                ("temperature", 5), ("top_p", 1e-300), ("top_p", 5e-324), ("top_p", 1), ("seed", 0),
                ("seed", 2**64 - 1), ("max_new_tokens", 1), ("k", 0), ("k", loaded_k), ("retention", 1e-300),
                ("retention", 1), ("recompute_ratio", 0), ("recompute_ratio", 1e-300), ("recompute_ratio", 1)]
    for field, value in accepted:
        extra = {"temperature": 1.0} if field in ("top_p", "seed") else {}
        r = post(c, "/v1/query", {**ASK, **extra, field: value})
        assert r.status_code == 200, (field, value, r.text)
        if (field, value) in (("temperature", 1e-300), ("temperature", 5e-324), ("top_p", 1e-300)):
            assert r.json()["answer"] == greedy  # greedy, or the nucleus of the top token alone
    refusals = [("temperature", -1e-300), ("temperature", 5.000001), ("temperature", 1e309), ("top_p", 0),
                ("top_p", 1.0000001), ("top_p", -5e-324), ("seed", -1), ("seed", 2**64), ("max_new_tokens", 0),
                ("max_new_tokens", 2**70), ("k", -1), ("k", 1025), ("retention", 0), ("retention", 1.0000001),
                ("recompute_ratio", -1e-300), ("recompute_ratio", 1.0000001)]
    for field, value in refusals:
        assert f"body.{field}" in refused(c, "/v1/query", {**ASK, field: value}), (field, value)
    s = c.app_state.settings
    over = {"max_new_tokens": s.max_new_tokens_limit + 1, "k": loaded_k + 1}
    for field, value in over.items():  # limits of the settings: checked when the query is planned
        r = post(c, "/v1/query", {**ASK, field: value})
        assert r.status_code == 422 and field in r.json()["error"]["message"], r.text
    for top_k, status in ((1, 200), (s.max_top_k, 200), (s.max_top_k + 1, 422), (0, 422)):
        assert post(c, "/v1/query", {"question": "Capital?", "top_k": top_k, "max_new_tokens": 1}).status_code == status


def test_numeric_chat_and_listing_fields_at_their_edges(paris):
    c = paris
    for field, value, status in (("temperature", 1e-300, 200), ("top_p", 1e-300, 200), ("max_tokens", 1, 200),
                                 ("max_completion_tokens", 0, 422), ("n", 1, 200), ("n", 10**30, 422),
                                 ("seed", 2**64 - 1, 200), ("temperature", 5.5, 422), ("top_p", 0.0, 422)):
        r = post(c, "/v1/chat/completions", {**CHAT, "temperature": 1.0, field: value})
        assert r.status_code == status, (field, value, r.text)
        if status == 200:
            events = parse_sse(post(c, "/v1/chat/completions", {**CHAT, "temperature": 1.0, field: value,
                                                               "stream": True}).text)
            assert events[-1][1] == "[DONE]" and not any('"error"' in d for _, d in events)
    for params, status in (({"offset": 10**9}, 200), ({"offset": 10**9 + 1}, 422), ({"offset": -1}, 422),
                           ({"limit": 1000}, 200), ({"limit": 1001}, 422), ({"limit": 0}, 422),
                           ({"limit": "1e3"}, 422), ({"offset": str(2**70)}, 422)):
        assert c.get("/v1/documents", params=params).status_code == status, params


def test_guidellms_chat_body_validates_continuous_usage_stats_included():
    """guidellm 0.8.1 sends vLLM's ``stream_options.continuous_usage_stats``, ``stop: null``, ``ignore_eos``."""
    from api.schemas import ChatIn

    body = ChatIn.model_validate_json(json.dumps({
        "model": "kvlink-rag", "messages": [{"role": "user", "content": "hello"}], "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "max_completion_tokens": 16,
        "stop": None, "ignore_eos": True, "min_tokens": 16}))
    assert body.stream_options.include_usage and body.stream_options.continuous_usage_stats
