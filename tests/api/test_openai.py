"""The official openai client against /v1/chat/completions on a real uvicorn server."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from api.main import create_app
from api_helpers import service_settings, wait_ready
from service_support import LiveServer


@pytest.fixture
def server(tmp_path, tiny_engine, fixture_docs):
    app = create_app(service_settings(tmp_path / "home", api_keys={"key-a": "tenant-a"}), tiny_engine)
    with LiveServer(app) as srv:
        with httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer key-a"}) as http:
            http.post("/v1/documents", json={"documents": fixture_docs})
            wait_ready(http, "volcano", headers=None)
            srv.http = http
            yield srv


def test_openai_client_chat_completion_streaming_and_errors(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="key-a", max_retries=0)
    question = "Which volcano has a lava lake?"
    reference = server.http.post("/v1/query", json={"question": question, "document_ids": ["volcano"]}).json()

    done = client.chat.completions.create(
        model="kvlink-rag", max_tokens=4,
        messages=[{"role": "user", "content": question}], extra_body={"document_ids": ["volcano"]})
    choice = done.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == reference["answer"]
    assert choice.finish_reason in ("stop", "length")
    assert done.usage.completion_tokens == reference["completion_tokens"]
    assert done.usage.prompt_tokens == reference["context_tokens"]
    extra = done.model_extra["kvlink"]
    assert extra["documents"][0]["id"] == "volcano" and extra["documents"][0]["cache_hit"] is True
    instructed = client.chat.completions.create(  # a client's system text goes before the question
        model="kvlink-rag", max_tokens=4, extra_body={"document_ids": ["volcano"]},
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}])
    assert instructed.usage.prompt_tokens == reference["context_tokens"] + 5  # "Answer briefly.\n\n"

    chunks = list(client.chat.completions.create(model="kvlink-rag", max_tokens=4, stream=True,
                                                 messages=[{"role": "user", "content": question}],
                                                 extra_body={"document_ids": ["volcano"]}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == reference["answer"] and chunks[-1].choices[0].finish_reason in ("stop", "length")

    retrieved = client.chat.completions.create(model="kvlink-rag", max_tokens=2, extra_body={"top_k": 1},
                                               messages=[{"role": "user", "content": "Mount Erebus lava lake"}])
    assert retrieved.model_extra["kvlink"]["documents"][0]["id"] == "volcano"
    assert [m.id for m in client.models.list().data] == ["kvlink-rag"]

    with pytest.raises(openai.NotFoundError, match="unknown document id"):
        client.chat.completions.create(model="kvlink-rag", messages=[{"role": "user", "content": question}],
                                       extra_body={"document_ids": ["nope"]})
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
            model="kvlink-rag", messages=[{"role": "user", "content": question}])


def test_chat_fields_are_range_checked_and_a_failing_stream_ends_with_an_error_then_done(client, fixture_docs,
                                                                                         monkeypatch):
    from api_helpers import parse_sse

    client.post("/v1/documents", json=fixture_docs[3])
    wait_ready(client, "volcano")
    ask = {"model": "kvlink-rag", "messages": [{"role": "user", "content": "Which volcano has a lava lake?"}],
           "document_ids": ["volcano"], "max_tokens": 2}

    def refused(**fields):
        r = client.post("/v1/chat/completions", json={**ask, **fields})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
        return r.json()["error"]["message"]

    for stream in (False, True):
        assert "body.seed: Input should be less than or equal to 18446744073709551615" in refused(seed=2**64,
                                                                                                  stream=stream)
    assert "body.n: Input should be greater than or equal to 1" in refused(n=0)
    assert "stop strings must not be empty" in refused(stop=["\n", ""])
    assert "body.max_tokens" in refused(max_tokens=0)
    assert "body.messages" in refused(messages=[{"role": "user", "content": "x"}] * 1025)
    assert "invalid document id" in refused(document_ids=[".."])
    ok = client.post("/v1/chat/completions", json={**ask, "seed": 2**64 - 1, "n": 1, "stop": None})
    assert ok.status_code == 200, ok.text

    def broken(plan):
        yield "token", "Ere"
        raise RuntimeError("boom")

    monkeypatch.setattr(client.app_state.queries, "stream", broken)
    data = [d for _, d in parse_sse(client.post("/v1/chat/completions", json={**ask, "stream": True}).text)]
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["code"] == "internal_error" and "RuntimeError: boom" in error["message"]
    assert [json.loads(d)["choices"][0]["delta"] for d in data[:2]] == [{"role": "assistant", "content": ""},
                                                                          {"content": "Ere"}]


def test_a_multi_turn_chat_prefills_only_its_new_message_and_bad_lists_are_refused(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="key-a", max_retries=0)
    question = "Which volcano has a lava lake?"
    first = client.chat.completions.create(model="kvlink-rag", max_tokens=4, extra_body={"document_ids": ["volcano"]},
                                           messages=[{"role": "user", "content": question}])
    turns = [{"role": "user", "content": question}, {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "How high is it?"}]
    second = client.chat.completions.create(model="kvlink-rag", max_tokens=4, messages=turns,
                                            extra_body={"document_ids": ["volcano"]})
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    bad = {"must contain a user message": [{"role": "system", "content": "hi"}],
           "unknown role": [{"role": "wizard", "content": "hi"}, {"role": "user", "content": "x"}],
           "start with a user message and end with one": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
           "two user messages in a row": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
           "has 2001 characters": [{"role": "user", "content": "x" * 2001}]}
    for message, messages in bad.items():
        r = server.http.post("/v1/chat/completions", json={"messages": messages, "document_ids": ["volcano"]})
        assert r.status_code == 422 and message in r.json()["error"]["message"], (message, r.text)


def test_a_model_naming_an_adapter_answers_with_it_and_models_lists_the_adapters(tmp_path, tiny_engine, fixture_docs):
    from factories import save_adapter

    links = tmp_path / "home" / "links"
    path = save_adapter(tiny_engine, links, "tenant-a", seed=3)
    app = create_app(service_settings(tmp_path / "home"), tiny_engine)
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url) as http:
        http.post("/v1/documents", json={"documents": fixture_docs})
        wait_ready(http, "volcano", headers=None)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        listed = {m.id: m for m in client.models.list().data}
        assert list(listed) == ["kvlink-rag", "tenant-a"]
        assert listed["tenant-a"].model_extra["parent"] == "kvlink-rag" and listed["tenant-a"].model_extra["root"] == str(path)
        ask = {"question": "Which volcano has a lava lake?", "document_ids": ["volcano"], "max_new_tokens": 4,
               "ignore_eos": True}

        def chat(model, **extra):
            return client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": ask["question"]}],
                                                  extra_body={"document_ids": ["volcano"], "ignore_eos": True, **extra})

        query = http.post("/v1/query", json={**ask, "adapter": "tenant-a"}).json()["answer"]
        default = http.post("/v1/query", json=ask).json()["answer"]
        assert query != default and chat("tenant-a").choices[0].message.content == query
        assert chat("kvlink-rag", adapter="tenant-a").choices[0].message.content == query
        assert chat("kvlink-rag").choices[0].message.content == chat("gpt-4o").choices[0].message.content == default
        with pytest.raises(openai.NotFoundError, match="unknown adapter 'nope'"):
            chat("kvlink-rag", adapter="nope")
        with pytest.raises(openai.UnprocessableEntityError, match="model 'tenant-a' is an adapter and adapter is 'none'"):
            chat("tenant-a", adapter="none")
        assert chat("tenant-a", adapter="tenant-a").choices[0].message.content == query
        with pytest.raises(openai.UnprocessableEntityError, match="model 'tenant-a' is a query-side adapter"):
            client.completions.create(model="tenant-a", prompt="Hello", max_tokens=2)  # a raw prompt takes none
        assert client.completions.create(model="gpt-4o", prompt="Hello", max_tokens=2).choices[0].text is not None
