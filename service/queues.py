"""Where precompute work goes: a thread pool in this process (embedded), Celery workers, or nowhere.

Every one is a :class:`Queue`: a ``store.catalog.Enqueue`` callable ``(tenant, doc_id, version) -> None``
with a depth, a reachability check and ``close``.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvlink_rag.omp_pool import release_thread_pool
from service.errors import QueueUnavailable
from store.lmdb_env import StoreBusyError

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine
    from service.settings import Settings
    from service.documents import DocumentService

__all__ = ["CeleryQueue", "EmbeddedQueue", "NoQueue", "Queue", "QueueUnavailable", "redact"]
log = logging.getLogger(__name__)


@runtime_checkable
class Queue(Protocol):
    """A precompute queue."""

    def __call__(self, tenant: str, doc_id: str, version: int) -> None:
        """Schedule the precompute of ``doc_id`` at ``version``; returns at once.

        Raises:
            QueueUnavailable: the queue cannot be reached.
        """

    def depth(self) -> int:
        """Tasks waiting (and, embedded, running)."""

    def ping(self) -> None:
        """Raises when the queue is unreachable."""

    def close(self) -> None:
        """Release the queue (embedded: finish its tasks)."""


class NoQueue:
    """Schedules nothing (workers, direct CLI commands): documents are precomputed by whoever holds the
    engine, or when first queried."""

    def __call__(self, tenant: str, doc_id: str, version: int) -> None:
        """Does nothing."""

    def depth(self) -> int:
        """Always 0."""
        return 0

    def ping(self) -> None:
        """Always reachable."""

    def close(self) -> None:
        """Nothing to release."""


class EmbeddedQueue:
    """Precompute in ``threads`` background threads of this process, one model call at a time; a document
    is encoded in chunks (``kvlink_rag.linking.document_prefill.CHUNK_TOKENS``) with the model lock handed to the
    batching scheduler between them, so queries keep answering while a long document is encoded.

    Args:
        model_lock: serialises model calls with queries.
        threads: pool size; 0 runs nothing (documents are then encoded when first queried).
    The document service is attached after the store is opened (:attr:`documents`), since the store needs
    this queue; its engine (the shared one, its cache the store's ``StoreCache``) does the encoding.
    """

    def __init__(self, model_lock: threading.Lock, threads: int = 1):
        self.model_lock = model_lock
        self.documents: DocumentService | None = None
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="precompute") if threads else None
        self._pending = 0
        self._count_lock = threading.Lock()
        self.model_busy: Callable[[], bool] | None = None  # the scheduler has running or waiting requests
        self.max_defer_s = 2.0
        self.busy_retries_s: tuple[float, ...] = (0.5, 2.0, 8.0)

    @property
    def engine(self) -> Engine | None:
        """The engine precompute runs on: the document service's (None until one is loaded)."""
        return self.documents.engine if self.documents is not None else None

    def __call__(self, tenant: str, doc_id: str, version: int) -> None:
        """Schedule ``documents.precompute_or_fail(tenant, doc_id, version)``; returns at once."""
        if self._pool is None:
            return
        with self._count_lock:
            self._pending += 1
        self._pool.submit(self._run, tenant, doc_id, version)

    @contextmanager
    def _model_turn(self) -> Iterator[None]:
        """The model for one chunk of a document: while the batching scheduler has requests
        (:attr:`model_busy`) let it run, for at most :attr:`max_defer_s` seconds, then take the model lock
        (first-come first-served) for the chunk: queries keep their latency, and a document still advances
        under constant load."""
        deadline = time.monotonic() + self.max_defer_s
        while self.model_busy is not None and self.model_busy() and time.monotonic() < deadline:
            time.sleep(0.005)
        with self.model_lock:
            try:
                yield
            finally:
                release_thread_pool()  # the scheduler's thread runs the next forwards (kvlink_rag.omp_pool)

    def _run(self, tenant: str, doc_id: str, version: int) -> None:
        from kvlink_rag.linking.document_prefill import chunk_guard

        token = chunk_guard.set(self._model_turn)  # each chunk's forward takes the model; the rest does not
        try:
            self._precompute_retrying(tenant, doc_id, version)  # permanent failures marked there
        except Exception as e:  # noqa: BLE001 - keep the pool alive; the document can be re-ingested
            log.exception("precompute of %s/%s v%d failed", tenant, doc_id, version)
            self.documents.mark_failed(tenant, doc_id, version, f"{type(e).__name__}: {e}")
        finally:
            chunk_guard.reset(token)
            release_thread_pool()  # what ran outside the chunks (scoring, storing) opened a team too
            with self._count_lock:
                self._pending -= 1

    def _precompute_retrying(self, tenant: str, doc_id: str, version: int) -> None:
        """``documents.precompute_or_fail``, tried again after each pause of :attr:`busy_retries_s` (seconds)
        while the store is busy (``StoreBusyError``: a reader in another process holds the space freed for the
        document), as the Celery task retries a transient error.

        Raises:
            StoreBusyError: still busy after the last pause. Anything ``precompute_or_fail`` raises.
        """
        for pause in (*self.busy_retries_s, None):
            try:
                self.documents.precompute_or_fail(tenant, doc_id, version)
                return
            except StoreBusyError as e:
                if pause is None:
                    raise
                log.warning("precompute of %s/%s v%d: %s; again in %.1f s", tenant, doc_id, version, e, pause)
                time.sleep(pause)

    def depth(self) -> int:
        """Tasks queued or running."""
        return self._pending

    def ping(self) -> None:
        """Always reachable."""

    def close(self) -> None:
        """Finish queued work and stop the threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=False)


class CeleryQueue:
    """Send ``kvlink.precompute`` by name to Celery workers over the Redis broker.

    Args:
        settings: broker URL, queue name (the web process never imports the task code).
    """

    def __init__(self, settings: Settings):
        import redis

        from service.celery_config import PRECOMPUTE_TASK, make_celery

        self.app = make_celery(settings)
        self.task_name = PRECOMPUTE_TASK
        self.queue = settings.task_queue
        self.url = settings.broker_url
        self._redis = redis.Redis.from_url(settings.broker_url, socket_connect_timeout=2, socket_timeout=5)

    def __call__(self, tenant: str, doc_id: str, version: int) -> None:
        """Publish the task (no retry on a dead broker).

        Raises:
            QueueUnavailable: the broker is unreachable.
        """
        try:
            self.app.send_task(self.task_name, args=[tenant, doc_id, version], queue=self.queue, retry=False,
                               ignore_result=True)
        except Exception as e:  # kombu OperationalError, redis ConnectionError
            raise QueueUnavailable(f"task queue at {redact(self.url)} is unreachable: {e}") from e

    def depth(self) -> int:
        """Messages waiting in the queue (not those being worked on).

        Raises:
            redis.exceptions.ConnectionError: the broker is unreachable.
        """
        return int(self._redis.llen(self.queue))

    def ping(self) -> None:
        """Raises redis.exceptions.ConnectionError when the broker is unreachable."""
        self._redis.ping()

    def close(self) -> None:
        """Release connections."""
        self._redis.close()
        self.app.close()


def redact(url: str) -> str:
    """``url`` without its password."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
