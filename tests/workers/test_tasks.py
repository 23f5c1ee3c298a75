"""The precompute task run in-process (``apply``): ready, stale versions skipped, permanent failures marked,
transient failures retried then given up."""

from __future__ import annotations

import pytest

import workers.runtime as runtime
from factories import tiny_text_engine
from service.settings import Settings
from service.runtime import build_runtime
from service_support import free_port
from store.backends import open_index
from workers.tasks import precompute


@pytest.fixture
def worker_runtime(tmp_path):
    settings = Settings(home=tmp_path, model="unused", device="cpu", store_max_bytes=64 << 20)
    engine = tiny_text_engine(tmp_path / "engine")
    runtime._runtime = build_runtime(settings, engine, queue="none", recover=False)  # as get_runtime() does
    yield runtime._runtime
    runtime._runtime.close()
    runtime._runtime = None


def test_ready_then_stale_versions_are_skipped(worker_runtime):
    documents = worker_runtime.documents
    documents.ingest("t", "d", "The harbour opens at seven.")
    documents.ingest("t", "d", "The harbour opens at eight.")  # version 2: the version-1 task is stale
    assert precompute.apply(args=["t", "d", 1]).get()["status"] == "skipped"
    done = precompute.apply(args=["t", "d", 2]).get()
    assert done["status"] == "ready" and done["num_tokens"] > 5
    rec = worker_runtime.store.index.get("t", "d")
    assert rec.status == "ready" and rec.version == 2 and rec.cache_key in worker_runtime.store.blobs
    assert precompute.apply(args=["t", "gone", 1]).get()["status"] == "skipped"


def test_a_document_too_long_for_the_model_is_marked_failed(worker_runtime):
    documents = worker_runtime.documents
    documents.ingest("t", "long", "word " * 3000)  # the tiny model has 2048 positions
    out = precompute.apply(args=["t", "long", 1]).get()
    assert out["status"] == "failed"
    rec = worker_runtime.store.index.get("t", "long")
    assert rec.status == "failed" and rec.metadata["error"] == out["error"]


def test_an_unreachable_index_is_retried_then_given_up(worker_runtime):
    worker_runtime.store.catalog.index = open_index(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    result = precompute.apply(args=["t", "d", 1])
    assert result.failed() and "Connection refused" in str(result.result)
    assert result.traceback and "Retry" not in type(result.result).__name__
