"""Nothing accepted is forgotten after a crash, and the index agrees with the store: unfinished documents are
queued again at start, a re-POST of a queued document re-queues it, an index that lost its records is
rebuilt at start, and what the index does not hold is not served."""

from __future__ import annotations

import pytest

from api_helpers import wait_ready
from redis_servers import private_redis
from service_support import claimed_redis_db, wait_for

DOCS = [{"id": f"d{i}", "text": f"Document {i} is about the harbour of town number {i}."} for i in range(5)]


def test_documents_queued_before_a_crash_are_precomputed_after_the_restart(make_client):
    with make_client(precompute_threads=0) as c:  # accepted, never precomputed (as if killed after the 202)
        out = c.post("/v1/documents", json={"documents": DOCS}).json()["documents"]
        assert all(d["status"] == "queued" and d["queued"] for d in out)
        again = c.post("/v1/documents", json=DOCS[0]).json()  # a re-POST of a queued document re-queues it
        assert again["queued"] is True and again["version"] == 1
    with make_client() as c:  # restarted on the same home, with a precompute thread
        for d in DOCS:
            assert wait_ready(c, d["id"])["version"] == 1
        assert c.post("/v1/documents", json=DOCS[0]).json()["queued"] is False  # ready: nothing to do


@pytest.fixture
def redis_index():
    with claimed_redis_db() as url:
        yield url


def test_an_emptied_redis_index_is_rebuilt_at_start_and_nothing_it_lost_is_served(make_client, redis_index):
    with make_client(index_url=redis_index, index_watch_interval_s=0) as c:  # no watch: only the start rebuilds
        c.post("/v1/documents", json={"documents": [{**d, "metadata": {"n": i}} for i, d in enumerate(DOCS)]})
        keys = {d["id"]: wait_ready(c, d["id"])["cache_key"] for d in DOCS}
        store = c.app_state.store
        store.index.drop_all()  # Redis restarted empty; LMDB keeps texts and caches
        assert c.get("/v1/documents").json()["documents"] == []
        assert c.get("/v1/documents/d1").status_code == 404
        q = c.post("/v1/query", json={"question": "Which harbour?", "document_ids": ["d1"]})
        assert q.status_code == 404 and q.json()["error"]["code"] == "document_not_found"
        gone = c.delete("/v1/documents/d0")  # its text (and cache) go although the index had lost it
        assert gone.status_code == 200 and store.texts.get("default", "d0") is None and keys["d0"] not in store.blobs
        assert c.delete("/v1/documents/d0").status_code == 404
    with make_client(index_url=redis_index) as c:  # restart: the index is rebuilt from the texts
        listed = c.get("/v1/documents").json()["documents"]
        assert [(d["id"], d["status"], d["cache_key"], d["metadata"]) for d in listed] == [
            (d["id"], "ready", keys[d["id"]], {"n": i}) for i, d in enumerate(DOCS) if d["id"] != "d0"]
        q = c.post("/v1/query", json={"question": "Which harbour?", "document_ids": ["d1"]})
        assert q.status_code == 200 and q.json()["documents"][0]["cache_hit"] is True
        assert c.post("/v1/query", json={"question": "Which harbour?", "document_ids": ["d0"]}).status_code == 404


@pytest.fixture
def index_server(tmp_path):
    yield from private_redis(tmp_path / "index-redis")


def _restart_empty(server) -> None:
    """Kill the Redis and start it again on its port without its data (a lost volume, no append-only file)."""
    import shutil

    server.stop()
    shutil.rmtree(server.folder)
    server.folder.mkdir()
    server.start()


def test_a_redis_index_emptied_under_a_running_host_is_rebuilt_in_the_background(make_client, index_server):
    docs = [{**d, "metadata": {"n": i}} for i, d in enumerate(DOCS)]
    with make_client(index_url=index_server.url(0), index_watch_interval_s=0.2) as c:
        c.post("/v1/documents", json={"documents": docs})
        keys = {d["id"]: wait_ready(c, d["id"])["cache_key"] for d in DOCS}
        _restart_empty(index_server)  # the data is gone: the watch's rebuild count below proves it saw that

        def listed():
            got = c.get("/v1/documents").json().get("documents", [])
            return got if len(got) == len(DOCS) else None

        rows = wait_for(listed, 20, interval=0.1, what="the index rebuilt from this host's texts")
        assert [(d["id"], d["status"], d["cache_key"], d["metadata"]) for d in rows] == [
            (d["id"], "ready", keys[d["id"]], {"n": i}) for i, d in enumerate(DOCS)]  # caches found: none queued
        assert c.get("/v1/documents/d1").json()["version"] == 1
        q = c.post("/v1/query", json={"question": "Which harbour?", "document_ids": ["d1"]})
        assert q.status_code == 200 and q.json()["documents"][0]["cache_hit"] is True
        top = c.post("/v1/query", json={"question": "Which harbour?", "top_k": 1})
        assert top.status_code == 200 and top.json()["documents"][0]["id"] in keys  # BM25 over the rebuilt index
        assert c.app_state.store.texts.r.zcard(c.app_state.store.texts._set) == len(DOCS)  # texts back in Redis
        assert c.app_state.index_watch.rebuilds == 1
