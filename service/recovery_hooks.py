"""What a starting service does so that nothing accepted is forgotten after a crash, and what it does when a
stored cache turns out corrupt. The store-level work is in :mod:`store.recovery`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from service.errors import redis_errors

if TYPE_CHECKING:
    from service.documents import DocumentService
    from service.queues import Queue
    from store.factory import Store

log = logging.getLogger(__name__)


def recover_at_start(documents: DocumentService) -> None:
    """Queue unfinished documents again and rebuild an index that lost its records.

    Documents still ``queued``/``stale`` are queued again: in the embedded mode no task survives a
    restart; in the Celery mode a task may still wait in the broker, and the duplicate is harmless
    (tasks are idempotent: the second finds the cache stored and only marks the record ready) while a
    task lost between the index write and the broker (or with a broker that lost its data) is not.
    An index that holds nothing while texts are stored (a Redis index restarted empty) is rebuilt
    from the texts (:meth:`service.documents.DocumentService.rebuild_index`; its engine, when loaded,
    finds their stored caches). Skipped, with a warning, when Redis is down.
    """
    from store.recovery import index_lost

    try:
        n = documents.requeue_unfinished()
        if n:
            log.info("queued the precompute of %d unfinished document(s) again", n)
        if index_lost(documents.store):
            report = documents.rebuild_index()
            log.warning("the document index was empty while %d text(s) are stored: rebuilt it (%d ready, "
                        "%d queued, %d corrupt texts skipped)", len(report.ready) + len(report.queued)
                        + len(report.corrupt_texts), len(report.ready), len(report.queued),
                        len(report.corrupt_texts))
    except redis_errors() as e:
        log.warning("start-up recovery skipped, Redis unreachable (%s); run `kvlink-rag store check "
                    "--repair` later", e)


class RequeueCorrupt:
    """The store's ``on_corrupt`` hook: a stored cache failed its checksum (and was deleted), so the
    documents that use it are precomputed again.

    Args:
        queue: where their precompute goes.
    The store is attached after it is opened (:attr:`store`), since opening it needs this hook.
    """

    def __init__(self, queue: Queue):
        self.queue = queue
        self.store: Store | None = None

    def __call__(self, cache_key: str) -> None:
        """Enqueue the current version of every document whose record points at ``cache_key``."""
        if self.store is None:
            return
        for tenant, doc_id in self.store.index.find_by_cache_key(cache_key):
            rec = self.store.index.get(tenant, doc_id)
            if rec is not None:
                self.queue(tenant, doc_id, rec.version)
