"""Helpers of the API tests: waiting for a document to be ready, parsing server-sent events."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from service.settings import Settings
from service_support import wait_for

SMALL_STORE = dict(store_max_bytes=64 << 20, host_cache_bytes=32 << 20)


def service_settings(home: Path, **overrides) -> Settings:
    """Settings of a test app: its own home, a small store, the embedded default unless overridden."""
    return Settings(home=home, model="unused", device="cpu", **{**SMALL_STORE, **overrides})


def wait_ready(client, doc_id: str, headers: dict | None = None, timeout: float = 30) -> dict:
    """The document's detail once its status is ``ready``."""
    def ready():
        body = client.get(f"/v1/documents/{doc_id}", headers=headers).json()
        return body if body.get("status") == "ready" else None

    return wait_for(ready, timeout, what=f"document {doc_id} ready")


def parse_sse(text: str) -> list[tuple[str, str]]:
    """``[(event, data)]`` of a server-sent-events body (event defaults to ``message``)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            events.append((event, "\n".join(data)))
    return events


@contextmanager
def openai_server(home: Path, engine, docs: list[dict], ready: str = "volcano"):
    """A real uvicorn server (:class:`service_support.LiveServer`) over ``engine`` with ``docs`` ingested and
    ``ready`` encoded; yields it with ``.http`` (httpx) and ``.client`` (the openai SDK, no retries)."""
    import httpx
    import openai

    from api.main import create_app
    from service_support import LiveServer

    with LiveServer(create_app(service_settings(home), engine)) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            http.post("/v1/documents", json={"documents": docs})
            wait_ready(http, ready)
            srv.http = http
            srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
            yield srv
