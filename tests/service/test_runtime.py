"""build_runtime: the one wiring of queue, store, engine, recovery, retrieval and queries."""

from __future__ import annotations

import pytest

from runtime_helpers import service_settings
from service.queues import EmbeddedQueue, NoQueue
from service.runtime import StoreOpenError, build_runtime
from service_support import wait_for


def test_the_engine_uses_the_store_cache_and_the_queries_share_the_runtime(make_runtime, tiny_engine):
    rt = make_runtime()
    assert isinstance(rt.queue, NoQueue)
    assert rt.engine is tiny_engine and tiny_engine.cache is rt.store.cache
    assert rt.queries.engine is rt.engine and rt.queries.store is rt.store and rt.queries.model_lock is rt.model_lock
    rec = rt.documents.ingest("t", "d", "The harbour opens at seven.").record
    assert rec.status == "queued"  # nothing scheduled: a worker or the first query encodes it


def test_the_embedded_queue_precomputes_with_the_runtime_engine(make_runtime):
    rt = make_runtime(queue="auto")
    assert isinstance(rt.queue, EmbeddedQueue) and rt.queue.engine is rt.engine
    rt.documents.ingest("t", "d", "The harbour opens at seven.")
    rec = wait_for(lambda: (r := rt.store.index.get("t", "d")).status == "ready" and r, 30, what="precompute")
    assert rec.cache_key in rt.store.blobs


def test_unfinished_documents_are_queued_again_when_built_again(make_runtime, tiny_engine, tmp_path):
    first = build_runtime(service_settings(tmp_path / "home", precompute_threads=0), tiny_engine)  # never precomputes
    first.documents.ingest("t", "d", "The harbour opens at seven.")
    first.close()
    again = make_runtime(queue="auto")
    assert wait_for(lambda: again.store.index.get("t", "d").status == "ready", 30, what="recovery")


def test_the_engine_can_be_loaded_later(make_runtime, tiny_engine, tmp_path):
    rt = build_runtime(service_settings(tmp_path / "later"), queue="none", load_engine=False)
    try:
        assert rt.engine is None and rt.queries is None
        assert rt.load_engine(tiny_engine) is tiny_engine and rt.queries.engine is tiny_engine
        assert rt.load_engine() is tiny_engine  # loaded once
    finally:
        rt.close()


def test_a_store_that_cannot_open_says_where_and_why(tmp_path):
    settings = service_settings(tmp_path / "home", index_url="mongodb://nowhere/0")
    with pytest.raises(StoreOpenError, match=f"cannot open the store under {settings.store_dir}: "):
        build_runtime(settings, queue="none", load_engine=False)
    with pytest.raises(ValueError, match="queue must be 'auto' or 'none'"):
        build_runtime(settings, queue="celery", load_engine=False)
