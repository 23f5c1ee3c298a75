"""What the app holds while it runs: settings, store, engine, precompute queue, retrieval, queries.

:meth:`ServiceState.open` runs in the app's lifespan (loads the model unless an engine is given) and
:meth:`ServiceState.close` at shutdown.
"""

from __future__ import annotations

import logging
import threading
import time

from api.answering import QueryService
from api.concurrency import Gates
from api.precompute import CeleryQueue, EmbeddedQueue, redact
from api.retrieval import Retrieval
from kvlink_rag.settings import Settings

log = logging.getLogger(__name__)


class ServiceState:
    """Handles of a running app; attributes are None until :meth:`open`.

    Args:
        settings: service settings.
        engine: an already loaded ``Engine`` (tests); else one is loaded from ``settings.model``.
    """

    def __init__(self, settings: Settings, engine=None):
        self.settings = settings
        self.engine = engine
        self.store = None
        self.queue = None
        self.retrieval: Retrieval | None = None
        self.queries: QueryService | None = None
        self.model_lock = threading.Lock()
        self.gates = Gates()  # where queries wait for the model, and probes run (api.concurrency)
        self.on_result = None
        self.started = 0.0

    @property
    def mode(self) -> str:
        """``celery`` (Redis broker) or ``embedded`` (thread pool in this process)."""
        return "celery" if self.settings.distributed else "embedded"

    @property
    def tenancy(self) -> str:
        return "multi-tenant" if self.settings.api_keys else "single-tenant"

    def open(self) -> None:
        """Open the store, load the engine, start the precompute queue.

        Raises:
            ValueError, kvlink_rag.model.ModelLoadError: bad settings or model.
        """
        from store.factory import open_store
        from workers.runtime import apply_torch_threads

        s = self.settings
        apply_torch_threads(s)
        queue = CeleryQueue(s) if s.distributed else None
        embedded = None
        if queue is None:
            embedded = queue = EmbeddedQueue(None, self.model_lock, s.precompute_threads)
        self.store = open_store(s, enqueue=queue, on_corrupt=self._requeue)
        if self.engine is None:
            from kvlink_rag.engine import Engine

            self.engine = Engine(s, cache=self.store.cache)
        self.engine.cache = self.store.cache  # cache keys must be the store's (same as the workers')
        if embedded is not None:
            embedded.engine, embedded.catalog = self.engine, self.store.catalog
        self.queue = queue
        self._recover()
        self.retrieval = Retrieval(self.store.index, self.store.texts, s.bm25_refresh_s)
        self.queries = QueryService(self.engine, self.store, self.retrieval, self.model_lock, s,
                                    on_result=self.on_result)
        self.started = time.time()
        if not s.api_keys:
            log.warning("no API keys configured (KVLINK_RAG_API_KEYS): running single-tenant, every request is "
                        "tenant 'default' and no Authorization is required")
        log.info("kvlink-rag service ready: %s, precompute %s%s, index %s, store %s", self.tenancy, self.mode,
                 f" ({redact(s.broker_url)})" if s.distributed else f" ({s.precompute_threads} thread(s))",
                 redact(s.index_url) if s.index_url else "embedded (LMDB)", s.store_dir)

    def _recover(self) -> None:
        """Nothing accepted is forgotten after a crash, and the index agrees with the store.

        Documents still ``queued``/``stale`` are queued again: in the embedded mode no task survives a
        restart; in the Celery mode a task may still wait in the broker, and the duplicate is harmless
        (tasks are idempotent: the second finds the cache stored and only marks the record ready) while a
        task lost between the index write and the broker (or with a broker that lost its data) is not.
        An index that holds nothing while texts are stored (a Redis index restarted empty) is rebuilt
        from the texts (:func:`store.recovery.rebuild_index`). Skipped, with a warning, when Redis is down.
        """
        from api.errors import redis_errors
        from store.recovery import index_lost, rebuild_index, requeue_unfinished

        try:
            n = requeue_unfinished(self.store, self.queue)
            if n:
                log.info("queued the precompute of %d unfinished document(s) again", n)
            if index_lost(self.store):
                report = rebuild_index(self.store, self.engine)
                log.warning("the document index was empty while %d text(s) are stored: rebuilt it (%d ready, "
                            "%d queued, %d corrupt texts skipped)", len(report.ready) + len(report.queued)
                            + len(report.corrupt_texts), len(report.ready), len(report.queued),
                            len(report.corrupt_texts))
        except redis_errors() as e:
            log.warning("start-up recovery skipped, Redis unreachable (%s); run `kvlink-rag store check "
                        "--repair` later", e)

    def _requeue(self, cache_key: str) -> None:
        """A stored cache failed its checksum (and was deleted): precompute its documents again."""
        for tenant, doc_id in self.store.index.find_by_cache_key(cache_key):
            rec = self.store.index.get(tenant, doc_id)
            if rec is not None:
                self.queue(tenant, doc_id, rec.version)

    def close(self) -> None:
        """Stop the queue (embedded: finish its tasks) and flush the store's access stats."""
        if self.queue is not None:
            self.queue.close()
        if self.store is not None:
            self.store.blobs.close()
            self.store.index.close()
