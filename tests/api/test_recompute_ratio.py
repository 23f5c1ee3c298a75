"""POST /v1/query with CacheBlend's ``recompute_ratio``: range checks, the single-request path, ratio 0
answering as plain reuse, and the setting as the default."""

from __future__ import annotations

import pytest

from api_helpers import wait_ready

ASK = {"question": "Who kept the lighthouse lamp burning?", "document_ids": ["lighthouse", "paris"]}


@pytest.fixture
def ready(client, fixture_docs):
    client.post("/v1/documents", json={"documents": fixture_docs})
    for d in fixture_docs:
        wait_ready(client, d["id"])
    return client


def test_recompute_is_served_and_ratio_zero_answers_as_plain_reuse(ready):
    base = ready.post("/v1/query", json=ASK).json()
    zero = ready.post("/v1/query", json={**ASK, "recompute_ratio": 0}).json()
    assert zero["answer"] == base["answer"]
    blended = ready.post("/v1/query", json={**ASK, "recompute_ratio": 0.3})
    assert blended.status_code == 200, blended.text
    assert blended.json()["context_tokens"] == base["context_tokens"]  # the same layout, a part recomputed
    plan = ready.app_state.queries.plan("default", ASK["question"], ASK["document_ids"], recompute_ratio=0.3)
    assert plan.recompute_ratio == 0.3  # served by the scheduler, like every query


@pytest.mark.parametrize("bad", [-0.1, 1.5, "x"])
def test_recompute_ratio_outside_range_is_422(ready, bad):
    r = ready.post("/v1/query", json={**ASK, "recompute_ratio": bad})
    assert r.status_code == 422 and "recompute_ratio" in r.text


@pytest.mark.parametrize("extra", [{"mode": "full"}, {"explain": True}])
def test_recompute_with_full_prefill_or_explain_is_422(ready, extra):
    r = ready.post("/v1/query", json={**ASK, "recompute_ratio": 0.2, **extra})
    assert r.status_code == 422 and r.json()["error"]["code"] == "recompute_unsupported"


def test_the_recompute_setting_applies_when_a_query_names_none(make_client, fixture_docs):
    with make_client(recompute_ratio=0.25) as c:
        c.post("/v1/documents", json={"documents": fixture_docs})
        for d in fixture_docs:
            wait_ready(c, d["id"])
        served = c.post("/v1/query", json=ASK)
        plan = c.app_state.queries.plan("default", ASK["question"], ASK["document_ids"])
        off = c.app_state.queries.plan("default", ASK["question"], ASK["document_ids"], recompute_ratio=0)
        full = c.app_state.queries.plan("default", ASK["question"], ASK["document_ids"], mode="full")
    assert served.status_code == 200, served.text
    assert plan.recompute_ratio == 0.25  # served by the scheduler, like every query
    assert off.recompute_ratio == 0 and full.recompute_ratio == 0


def test_chat_takes_a_recompute_ratio_with_the_same_checks(ready):
    chat = {"messages": [{"role": "user", "content": ASK["question"]}], "document_ids": ASK["document_ids"]}
    zero = ready.post("/v1/chat/completions", json={**chat, "recompute_ratio": 0}).json()
    blended = ready.post("/v1/chat/completions", json={**chat, "recompute_ratio": 0.3})
    assert blended.status_code == 200, blended.text
    plain = ready.post("/v1/query", json=ASK).json()
    assert zero["choices"][0]["message"]["content"] == plain["answer"]
    assert blended.json()["usage"]["prompt_tokens"] == zero["usage"]["prompt_tokens"]
    bad = ready.post("/v1/chat/completions", json={**chat, "recompute_ratio": 1.5})
    assert bad.status_code == 422 and "recompute_ratio" in bad.text
