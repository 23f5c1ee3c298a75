"""Fixtures of the multi-host tests: "hosts" are apps (or processes) with their own ``KVLINK_RAG_HOME`` and no
shared files, sharing only Redis: a private index/queue server (append-only file) and a shared cache tier (a
second private server, or a real 3-node Redis Cluster)."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from factories import tiny_text_engine
from service.settings import Settings
from redis_servers import RedisServer, need_redis_server, private_redis
from service_support import wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "api" / "fixtures" / "documents.jsonl"


@pytest.fixture(scope="module")
def index_server(tmp_path_factory):
    """The index, texts and broker: a private redis-server with the append-only file (never evicts)."""
    yield from private_redis(tmp_path_factory.mktemp("index-redis"))


@pytest.fixture
def shared_server(tmp_path):
    """The shared cache tier: a second private redis-server, LRU eviction (set maxmemory per test)."""
    need_redis_server()
    s = RedisServer(tmp_path / "shared-redis", ["--maxmemory-policy", "allkeys-lru", "--maxmemory-samples", "10"]).start()
    yield s
    s.stop()


@pytest.fixture
def documents() -> list[dict]:
    """The API tests' four fixture documents (lighthouse, paris, photosynthesis, volcano)."""
    return [json.loads(line) for line in FIXTURES.read_text().splitlines() if line.strip()]


class Host:
    """One host: a started app over its own home, and its engine (whose ``encode`` calls are counted)."""

    def __init__(self, client: TestClient, engine):
        self.client, self.engine, self.encodes = client, engine, 0
        self.store = client.app.state.service.store
        encode = engine.encode

        def counted(doc):
            self.encodes += 1
            return encode(doc)

        engine.encode = counted

    def query(self, ids: list[str], question: str = "Who kept the lamp burning?") -> dict:
        r = self.client.post("/v1/query", json={"question": question, "document_ids": ids})
        assert r.status_code == 200, r.text
        return r.json()

    def ready(self, doc_id: str) -> dict:
        """The document's detail once its status is ``ready``."""
        def ready():
            body = self.client.get(f"/v1/documents/{doc_id}").json()
            return body if body.get("status") == "ready" else None

        return wait_for(ready, 60, what=f"document {doc_id} ready")


@pytest.fixture
def make_host(tmp_path, index_server, request) -> Callable:
    """``make_host(name, shared_url, **settings)`` -> context manager of a :class:`Host` whose home is
    ``tmp_path/name``; index and texts in this test's DB of the index server, precompute in its own thread."""
    db = 1 + abs(hash(request.node.name)) % 14

    @contextmanager
    def make(name: str, shared_url: str, seed: int = 0, **overrides):
        engine = tiny_text_engine(tmp_path / f"{name}-engine", seed=seed, max_new_tokens=4)
        settings = Settings(home=tmp_path / name, model="unused", device="cpu", store_max_bytes=64 << 20,
                            host_cache_bytes=32 << 20, index_url=index_server.url(db), shared_store_url=shared_url,
                            **overrides)
        with TestClient(create_app(settings, engine)) as client:
            yield Host(client, engine)

    yield make
    index_server.client(db=db).flushdb()
