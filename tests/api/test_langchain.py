"""langchain-openai's ChatOpenAI (a client built on the openai SDK) against a real uvicorn server: invoke
with stop=, stream, usage and a batch (skipped where langchain-openai is not installed)."""

from __future__ import annotations

import httpx
import pytest

from api.main import create_app
from api_helpers import service_settings, wait_ready
from service_support import LiveServer

langchain_openai = pytest.importorskip("langchain_openai")


def test_chat_openai_invoke_with_stop_stream_and_batch(tmp_path, tiny_engine, fixture_docs):
    app = create_app(service_settings(tmp_path / "home"), tiny_engine)
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        http.post("/v1/documents", json={"documents": fixture_docs})
        wait_ready(http, "volcano")
        llm = langchain_openai.ChatOpenAI(base_url=srv.url + "/v1", api_key="unused", model="kvlink-rag",
                                          max_tokens=12, temperature=0, max_retries=0, stream_usage=True,
                                          extra_body={"document_ids": ["volcano"], "ignore_eos": True})
        question = "Which volcano has a lava lake?"
        free = llm.invoke(question)
        assert free.usage_metadata["output_tokens"] == 12
        text = free.content
        i = next(i for i in range(2, len(text) - 2) if not text[i].isspace() and text.find(text[i]) == i)
        stopped = llm.invoke(question, stop=[text[i]])
        assert stopped.content == text[:i].strip() and stopped.response_metadata["finish_reason"] == "stop"
        pieces = list(llm.stream(question, stop=[text[i]]))
        assert "".join(p.content for p in pieces).strip() == text[:i].strip()
        assert sum(p.usage_metadata["output_tokens"] for p in pieces if p.usage_metadata) < 12
        assert [m.content for m in llm.batch([question, question])] == [text, text]
