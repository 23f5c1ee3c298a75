"""The official openai client against /v1/chat/completions on a real uvicorn server."""

from __future__ import annotations

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
        messages=[{"role": "system", "content": "ignored"}, {"role": "user", "content": question}],
        extra_body={"document_ids": ["volcano"]})
    choice = done.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == reference["answer"]
    assert choice.finish_reason in ("stop", "length")
    assert done.usage.completion_tokens == reference["completion_tokens"]
    assert done.usage.prompt_tokens == reference["context_tokens"]
    extra = done.model_extra["kvlink"]
    assert extra["documents"][0]["id"] == "volcano" and extra["documents"][0]["cache_hit"] is True

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
