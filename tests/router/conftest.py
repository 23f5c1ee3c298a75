"""Replicas and a router on loopback sockets in this process (uvicorn threads), sharing one claimed Redis DB
for the index, the texts and the fleet's registrations and events."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from api.main import create_app
from factories import tiny_text_engine
from service.settings import Settings
from router.main import build_router
from router.proxy import create_router_app
from router.settings import RouterSettings
from service_support import LiveServer, claimed_redis_db

FIXTURES = Path(__file__).resolve().parents[1] / "api" / "fixtures" / "documents.jsonl"


@pytest.fixture
def redis_url():
    with claimed_redis_db() as url:
        yield url


@pytest.fixture
def documents() -> list[dict]:
    """The API tests' four fixture documents (lighthouse, paris, photosynthesis, volcano)."""
    return [json.loads(line) for line in FIXTURES.read_text().splitlines() if line.strip()]


@pytest.fixture
def make_replica(tmp_path, redis_url):
    """``make_replica(name)`` -> context manager of a started :class:`LiveServer` replica that registers and
    publishes its cache events in the test's Redis DB (heartbeat 0.2 s, registration TTL 1 s)."""

    @contextmanager
    def make(name: str, **overrides):
        engine = tiny_text_engine(tmp_path / f"{name}-engine", max_new_tokens=3)
        settings = Settings(home=tmp_path / name, model="unused", device="cpu", store_max_bytes=64 << 20,
                            index_url=redis_url, events_url=redis_url, replica_id=name, heartbeat_interval_s=0.2,
                            replica_ttl_s=1.0, playground=False, **overrides)
        app = create_app(settings, engine)
        server = LiveServer(app)
        server.app = app
        settings.replica_url = server.url
        with server:
            yield server

    return make


@pytest.fixture
def make_router(redis_url):
    """``make_router(**router settings)`` -> context manager of a started router :class:`LiveServer`."""

    @contextmanager
    def make(**overrides):
        rs = RouterSettings(**{"events_url": redis_url, "poll_s": 0.1, "dead_after_s": 1.0, "shared_tier": False,
                               **overrides})
        with LiveServer(create_router_app(build_router(rs, Settings(index_url=redis_url, bm25_refresh_s=0)))) as server:
            yield server

    return make

