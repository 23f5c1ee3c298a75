"""POST /v1/query and /v1/chat/completions with ``retention`` and ``explain``: ranges, attribution shares,
passages as character offsets, and r=1 answering as before."""

from __future__ import annotations

import pytest

from api_helpers import wait_ready


@pytest.fixture
def ready(client, fixture_docs):
    client.post("/v1/documents", json={"documents": fixture_docs})
    for d in fixture_docs:
        wait_ready(client, d["id"])
    return {d["id"]: d for d in fixture_docs}


ASK = {"question": "Who kept the lighthouse lamp burning?", "document_ids": ["lighthouse", "paris"]}


def test_explain_returns_shares_that_sum_to_one_and_passages_inside_each_text(client, ready):
    r = client.post("/v1/query", json={**ASK, "explain": True, "attribution": "attention"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["attribution_method"] == "attention"
    shares = [d["attribution"] for d in body["documents"]]
    assert all(0 <= s <= 1 for s in shares) and 0 <= body["prefix_attribution"] <= 1
    assert abs(sum(shares) + body["prefix_attribution"] - 1) < 1e-4
    for d in body["documents"]:
        text = ready[d["id"]]["text"]
        assert 1 <= len(d["passages"]) <= 2
        for p in d["passages"]:
            assert 0 <= p["start"] < p["end"] <= len(text) and 0 < p["share"] <= 1
    plain = client.post("/v1/query", json=ASK).json()
    assert plain["answer"] == body["answer"]  # eager capture answers the same (float32)
    assert all(d["attribution"] is None for d in plain["documents"]) and plain["prefix_attribution"] is None


def test_full_retention_answers_as_before_and_partial_retention_is_served(client, ready):
    base = client.post("/v1/query", json=ASK).json()
    same = client.post("/v1/query", json={**ASK, "retention": 1.0}).json()
    assert same["answer"] == base["answer"] and same["context_tokens"] == base["context_tokens"]
    half = client.post("/v1/query", json={**ASK, "retention": 0.5, "explain": True})
    assert half.status_code == 200, half.text
    assert half.json()["context_tokens"] == base["context_tokens"]  # dropped tokens keep their positions


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, "x"])
def test_retention_outside_range_is_422(client, ready, bad):
    r = client.post("/v1/query", json={**ASK, "retention": bad})
    assert r.status_code == 422 and "retention" in r.text
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Who?"}],
                                                      "document_ids": ["paris"], "retention": bad})
    assert chat.status_code == 422 and "retention" in chat.text


def test_explain_with_full_prefill_is_422(client, ready):
    r = client.post("/v1/query", json={**ASK, "mode": "full", "explain": True})
    assert r.status_code == 422 and r.json()["error"]["code"] == "explain_unsupported"


def test_chat_kvlink_field_carries_the_attribution(client, ready):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": ASK["question"]}],
                                                  "document_ids": ASK["document_ids"], "explain": True,
                                                  "retention": 0.8, "attribution": "attention"})
    assert r.status_code == 200, r.text
    kv = r.json()["kvlink"]
    assert abs(sum(d["attribution"] for d in kv["documents"]) + kv["prefix_attribution"] - 1) < 1e-4


def test_explain_defaults_to_leave_one_out_whose_drops_give_the_shares(client, ready):
    r = client.post("/v1/query", json={**ASK, "explain": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["attribution_method"] == "leave_one_out"
    drops = [d["log_likelihood_drop"] for d in body["documents"]]
    positive = [max(x, 0.0) for x in drops]
    for d, p in zip(body["documents"], positive):
        assert abs(d["attribution"] - (p / sum(positive) if sum(positive) > 0 else 0.0)) < 1e-4
        assert 1 <= len(d["passages"]) <= 2  # the passages are the attention's
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": ASK["question"]}],
                                                     "document_ids": ASK["document_ids"], "explain": True})
    assert chat.json()["kvlink"]["attribution_method"] == "leave_one_out"


@pytest.mark.parametrize("extra", [{"attribution": "saliency", "explain": True}, {"attribution": "attention"}])
def test_an_unknown_attribution_or_one_without_explain_is_422(client, ready, extra):
    r = client.post("/v1/query", json={**ASK, **extra})
    assert r.status_code == 422 and "attribution" in r.text


def test_the_retention_setting_applies_when_a_query_names_none(make_client, fixture_docs):
    with make_client(retention=0.5) as c:
        c.post("/v1/documents", json={"documents": fixture_docs})
        for d in fixture_docs:
            wait_ready(c, d["id"])
        by_setting = c.post("/v1/query", json=ASK).json()
        explicit = c.post("/v1/query", json={**ASK, "retention": 0.5}).json()
        full = c.post("/v1/query", json={**ASK, "retention": 1.0}).json()
        plan = c.app_state.queries.plan("default", ASK["question"], ASK["document_ids"])
    assert plan.retention == 0.5  # served by the scheduler, like every query
    assert by_setting["answer"] == explicit["answer"]
    assert full["context_tokens"] == by_setting["context_tokens"]
