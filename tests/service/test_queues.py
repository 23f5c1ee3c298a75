"""The precompute queues: one protocol, a queue that schedules nothing, passwords kept out of URLs."""

from __future__ import annotations

from kvlink_rag.settings import Settings
from service.queues import CeleryQueue, EmbeddedQueue, NoQueue, Queue, redact


def test_every_queue_is_a_queue_and_no_queue_schedules_nothing():
    none = NoQueue()
    assert none("t", "d", 1) is None and none.depth() == 0 and none.ping() is None
    celery = CeleryQueue(Settings(broker_url="redis://127.0.0.1:1/0"))  # connects lazily
    embedded = EmbeddedQueue(None, None, threads=0)
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
