"""OpenAI/vLLM client features against a real uvicorn server with the official openai client: stop
strings (chat, /v1/query, completions; streamed and not), legacy completions, stream_options.include_usage,
ignore_eos / min_tokens, refused OpenAI fields, vLLM's /health, a plain chat without documents."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from api.main import create_app
from api_helpers import parse_sse, service_settings, wait_ready, openai_server
from service_support import LiveServer

QUESTION = "Which volcano has a lava lake?"
VOLCANO = {"document_ids": ["volcano"]}


@pytest.fixture
def server(tmp_path, tiny_engine, fixture_docs):
    with openai_server(tmp_path / "home", tiny_engine, fixture_docs) as srv:
        yield srv


def _stop_of(text: str) -> tuple[str, str]:
    """A 2-character stop string inside ``text`` (not at its start) and the text before its first occurrence."""
    for i in range(2, len(text) - 2):
        s = text[i:i + 2]
        if not any(c.isspace() for c in s) and text.find(s) == i:
            return s, text[:i]
    raise AssertionError(f"no stop string candidate in {text!r}")


def _chat(client, stream=False, **extra):
    body = {**VOLCANO, "ignore_eos": True, **extra.pop("extra_body", {})}
    return client.chat.completions.create(model="kvlink-rag", messages=[{"role": "user", "content": QUESTION}],
                                          max_tokens=12, stream=stream, extra_body=body, **extra)


def test_chat_stop_strings_end_the_answer_before_them_streamed_or_not(server):
    free = _chat(server.client)
    assert free.usage.completion_tokens == 12 and free.choices[0].finish_reason == "length"  # ignore_eos: all 12
    stop, before = _stop_of(free.choices[0].message.content)
    stopped = _chat(server.client, stop=stop)
    assert stopped.choices[0].message.content == before.strip() and stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < 12
    listed = _chat(server.client, stop=["never-generated", stop])
    assert listed.choices[0].message.content == before.strip()
    chunks = list(_chat(server.client, stream=True, stop=stop))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == before.strip() and stop not in text
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage is None  # usage only when asked


def test_query_stop_strings_on_the_scheduler_and_the_single_request_path(server):
    ask = {"question": QUESTION, **VOLCANO, "max_new_tokens": 12, "ignore_eos": True}
    free = server.http.post("/v1/query", json=ask).json()
    assert free["completion_tokens"] == 12
    stop, before = _stop_of(free["answer"])
    for extra in ({}, {"explain": True}):  # explain runs on the single-request path
        r = server.http.post("/v1/query", json={**ask, "stop": stop, **extra}).json()
        assert r["answer"] == before.strip() and r["finish_reason"] == "stop", (extra, r)
    events = parse_sse(server.http.post("/v1/query", json={**ask, "stop": [stop], "stream": True}).text)
    text = "".join(json.loads(d)["text"] for e, d in events if e == "token")
    assert text.strip() == before.strip() and json.loads(events[-1][1])["finish_reason"] == "stop"
    for bad, message in (({"stop": ["x", ""]}, "must not be empty"), ({"min_tokens": 13}, "min_tokens must be within 0..12"),
                         ({"stop": ["s"] * 17}, "at most 16")):
        r = server.http.post("/v1/query", json={**ask, **bad})
        assert r.status_code == 422 and message in r.json()["error"]["message"], r.text


def test_include_usage_sends_a_last_chunk_without_choices_only_when_asked(server):
    chunks = list(_chat(server.client, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.prompt_tokens == _chat(server.client).usage.prompt_tokens
    off = list(_chat(server.client, stream=True, stream_options={"include_usage": False}))
    assert all(c.usage is None and c.choices for c in off)


def test_legacy_completions_continue_a_raw_prompt(server):
    client = server.client
    done = client.completions.create(model="kvlink-rag", prompt="The capital of France is", max_tokens=10,
                                     extra_body={"ignore_eos": True})
    assert done.object == "text_completion" and done.usage.completion_tokens == 10
    tok = server.http.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 1}).json()
    assert tok["usage"]["prompt_tokens"] == 5  # the raw prompt's tokens alone: no system prompt, no template
    ids = client.completions.create(model="kvlink-rag", prompt=[[504, 3575, 282, 4649, 314]], max_tokens=10,
                                    extra_body={"ignore_eos": True})
    assert ids.usage.prompt_tokens == 5
    text = done.choices[0].text
    stop, before = _stop_of(text)
    stopped = client.completions.create(model="kvlink-rag", prompt="The capital of France is", max_tokens=10,
                                        stop=stop, extra_body={"ignore_eos": True})
    assert stopped.choices[0].text == before and stopped.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model="kvlink-rag", prompt="The capital of France is", max_tokens=10,
                                            stream=True, stop=[stop], stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == before
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 5
    for bad, message in (({"prompt": ["a", "b"]}, "a batch of 2 prompts"), ({"prompt": ""}, "prompt is empty"),
                         ({"prompt": [10**9]}, "outside the vocabulary"), ({"prompt": "x", "echo": True}, "echo"),
                         ({"prompt": "x", "best_of": 3}, "best_of")):
        r = server.http.post("/v1/completions", json=bad)
        assert r.status_code == 422 and message in r.json()["error"]["message"], r.text


def test_fields_that_change_the_answer_are_refused_by_name_and_unknown_ones_ignored(server, caplog):
    client = server.client
    refused = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "auto",
               "presence_penalty": 0.5, "logit_bias": {"1": 5}}
    for field, value in refused.items():
        with pytest.raises(openai.UnprocessableEntityError, match=f"{field} is not supported"):
            _chat(client, **{field: value})
    defaults = _chat(client, n=1, logprobs=False, presence_penalty=0, response_format={"type": "text"},
                     tool_choice="none", user="someone")
    with caplog.at_level(logging.WARNING, logger="api.generation_fields"):
        unknown = _chat(client, extra_body={"foo_bar": 1})
    assert unknown.choices[0].message.content == defaults.choices[0].message.content
    assert "ignoring unknown request fields: foo_bar" in caplog.text


def test_health_and_a_plain_chat_and_completion_without_documents(tmp_path, tiny_engine):
    app = create_app(service_settings(tmp_path / "home"), tiny_engine)
    with LiveServer(app) as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, who are you?"}]
        first = client.chat.completions.create(model="kvlink-rag", messages=history, max_tokens=4)
        assert first.model_extra["kvlink"]["documents"] == [] and first.usage.completion_tokens >= 1
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "And what can you do?"}]
        second = client.chat.completions.create(model="kvlink-rag", messages=history, max_tokens=4)
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens  # the prefix tree
        done = client.completions.create(model="kvlink-rag", prompt="Once upon a time", max_tokens=3)
        assert done.usage.completion_tokens >= 1


def test_chat_retrieves_only_the_right_document_and_answers_a_greeting_without_documents(tmp_path, tiny_engine):
    from four_documents import DOCUMENTS, QUESTIONS

    app = create_app(service_settings(tmp_path / "home"), tiny_engine)
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        http.post("/v1/documents", json={"documents": [{"id": i, "text": t} for i, t in DOCUMENTS.items()]})
        for doc_id in DOCUMENTS:
            wait_ready(http, doc_id, timeout=120)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        for question, right in QUESTIONS.items():
            chat = client.chat.completions.create(model="kvlink-rag", max_tokens=1,
                                                  messages=[{"role": "user", "content": question}])
            assert [d["id"] for d in chat.model_extra["kvlink"]["documents"]] == [right], question
            query = http.post("/v1/query", json={"question": question, "top_k": 3, "max_new_tokens": 1}).json()
            assert [d["id"] for d in query["documents"]] == [right], question
        leave = http.post("/v1/query", json={"question": "How many days of annual leave do I get per year?",
                                             "top_k": 3, "max_new_tokens": 1}).json()  # the handbook is stored
        used = leave["documents"]  # as chunks (KVLINK_RAG_CHUNK_TOKENS 512): its retrieved chunks alone are linked
        assert {d["id"] for d in used} == {"employee-handbook"} and len({d["chunk"] for d in used}) == len(used) >= 1
        assert None not in {d["chunk"] for d in used} and leave["context_tokens"] < 600 * len(used)
        assert [d["chunk"] for d in query["documents"]] == [None]  # a document that is not chunked: whole
        hello = client.chat.completions.create(model="kvlink-rag", max_tokens=2,
                                               messages=[{"role": "user", "content": "Hello, who are you?"}])
        assert hello.model_extra["kvlink"]["documents"] == []
        r = http.post("/v1/query", json={"question": "Hello, who are you?"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "no_matching_documents"  # /v1/query needs some
        question = "Is return shipping free for a defective item?"  # its second match: the FAQ (the handbook
        ask = {"question": question, "top_k": 3, "max_new_tokens": 1}  # beside another would not fit 2048 positions)
        everything = http.post("/v1/query", json={**ask, "min_relative_score": 0}).json()  # 0: the whole top_k
        assert [d["id"] for d in everything["documents"]] == ["returns-policy", "storage-faq"]
        chat = client.chat.completions.create(model="kvlink-rag", max_tokens=1, extra_body={"min_relative_score": 0},
                                              messages=[{"role": "user", "content": question}])
        assert [d["id"] for d in chat.model_extra["kvlink"]["documents"]] == ["returns-policy", "storage-faq"]
        assert http.post("/v1/query", json={**ask, "min_score": 100}).json()["error"]["code"] == "no_matching_documents"
        r = http.post("/v1/query", json={**ask, "min_relative_score": 1.5})
        assert r.status_code == 422 and "body.min_relative_score" in r.json()["error"]["message"]


def test_mode_full_is_cold_every_time_and_answers_as_a_warm_full_does(server, tmp_path, tiny_engine, fixture_docs):
    ask = {"question": QUESTION, **VOLCANO, "max_new_tokens": 4, "mode": "full"}
    cold = [server.http.post("/v1/query", json=ask).json() for _ in range(2)]
    assert [r["cached_tokens"] for r in cold] == [0, 0]  # neither read the prefix tree (nor filled it)
    assert all(d["cache_hit"] is False for r in cold for d in r["documents"])
    linked = server.http.post("/v1/query", json={**ask, "mode": "linked"}).json()
    assert linked["cached_tokens"] > 0  # linked requests still read the document caches
    app = create_app(service_settings(tmp_path / "warm", full_mode_cached=True), tiny_engine)
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        http.post("/v1/documents", json={"documents": fixture_docs})
        wait_ready(http, "volcano")
        warm = [http.post("/v1/query", json=ask).json() for _ in range(2)]
    assert warm[0]["cached_tokens"] == 0 and warm[1]["cached_tokens"] == warm[1]["context_tokens"] - 1  # the tree
    assert {r["answer"] for r in cold + warm} == {cold[0]["answer"]}  # cold or from the tree: the same answer


def test_n_choices_sample_with_successive_seeds_and_share_the_prompt(server):
    client = server.client
    kw = dict(temperature=1.0, seed=5, extra_body={"document_ids": ["paris"], "ignore_eos": True}, max_tokens=6,
              messages=[{"role": "user", "content": "Which river flows through Paris?"}], model="kvlink-rag")
    three = client.chat.completions.create(n=3, **kw)
    assert [c.index for c in three.choices] == [0, 1, 2]
    alone = [client.chat.completions.create(**{**kw, "seed": 5 + i}).choices[0].message.content for i in range(3)]
    assert [c.message.content for c in three.choices] == alone and len(set(alone)) > 1
    assert three.usage.completion_tokens == 18
    assert three.usage.prompt_tokens_details.cached_tokens == three.usage.prompt_tokens - 1  # read from the tree
    chunks = list(client.chat.completions.create(n=2, stream=True, stream_options={"include_usage": True}, **kw))
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(2)]
    assert [t.strip() for t in texts] == alone[:2] and chunks[-1].usage.completion_tokens == 12
    done = client.completions.create(model="kvlink-rag", prompt="Paris is", n=2, max_tokens=4, temperature=1.0,
                                     seed=1, extra_body={"ignore_eos": True})
    assert [c.index for c in done.choices] == [0, 1] and done.usage.completion_tokens == 8
    with pytest.raises(openai.UnprocessableEntityError, match="KVLINK_RAG_MAX_CHOICES"):
        client.chat.completions.create(n=9, **kw)
