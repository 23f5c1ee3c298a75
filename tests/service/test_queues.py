"""The precompute queues: one protocol, a queue that schedules nothing, passwords kept out of URLs."""

from __future__ import annotations

from service.settings import Settings
from service.queues import CeleryQueue, EmbeddedQueue, NoQueue, Queue, redact


def test_every_queue_is_a_queue_and_no_queue_schedules_nothing():
    none = NoQueue()
    assert none("t", "d", 1) is None and none.depth() == 0 and none.ping() is None
    celery = CeleryQueue(Settings(broker_url="redis://127.0.0.1:1/0"))  # connects lazily
    embedded = EmbeddedQueue(None, threads=0)
    try:
        assert all(isinstance(q, Queue) for q in (none, celery, embedded))
        assert embedded.depth() == 0
    finally:
        celery.close()
        embedded.close()


def test_redact_hides_the_password_only():
    assert redact("redis://:s3cret@cache.internal:6379/0") == "redis://***@cache.internal:6379/0"
    assert redact("redis://user:pw@h/1") == "redis://***@h/1"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_a_precompute_chunk_waits_while_the_scheduler_is_busy_then_takes_the_model():
    import time

    from service.model_lock import FairLock
    from service.queues import EmbeddedQueue

    lock, busy_until = FairLock(), time.monotonic() + 0.2
    q = EmbeddedQueue(lock, threads=0)
    q.model_busy = lambda: time.monotonic() < busy_until
    with q._model_turn():  # one chunk
        assert lock.locked() and time.monotonic() >= busy_until
    assert not lock.locked()
    q.max_defer_s, q.model_busy = 0.05, lambda: True  # constant load: the document still advances
    t0 = time.monotonic()
    with q._model_turn():
        assert lock.locked()
    assert time.monotonic() - t0 < 1


def test_a_precompute_chunk_gives_back_its_threads_openmp_team(monkeypatch):
    import service.queues as queues
    from service.model_lock import FairLock

    calls = []
    monkeypatch.setattr(queues, "release_thread_pool", lambda: calls.append("released"))
    q = EmbeddedQueue(FairLock(), threads=0)
    with q._model_turn():  # the chunk's forward ran with this thread's team
        assert calls == []
    assert calls == ["released"]  # the scheduler's team stays the only one (kvlink_rag.omp_pool)


def test_the_embedded_queue_retries_a_busy_store_then_gives_up_with_the_document_failed():
    from store.lmdb_env import StoreBusyError

    class Documents:
        def __init__(self, busy_times):
            self.busy_times, self.calls, self.failed = busy_times, 0, []

        def precompute_or_fail(self, tenant, doc_id, version):
            self.calls += 1
            if self.calls <= self.busy_times:
                raise StoreBusyError("no room for k: pid 7 reads a snapshot older than its eviction")

        def mark_failed(self, tenant, doc_id, version, reason):
            self.failed.append(reason)

    q = EmbeddedQueue(None, threads=0)
    q.busy_retries_s = (0.0, 0.0)
    q.documents = Documents(busy_times=2)
    q._run("acme", "d", 1)
    assert q.documents.calls == 3 and q.documents.failed == []
    q.documents = Documents(busy_times=5)
    q._run("acme", "d", 1)
    assert q.documents.calls == 3
    assert q.documents.failed == ["StoreBusyError: no room for k: pid 7 reads a snapshot older than its eviction"]
