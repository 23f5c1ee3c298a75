"""What the app holds while it runs: the service's runtime (settings, store, engine, precompute queue,
retrieval, queries) and the HTTP side's gates.

:meth:`ServiceState.open` runs in the app's lifespan (builds the runtime with
:func:`service.runtime.build_runtime`, which loads the model unless an engine is given) and
:meth:`ServiceState.close` at shutdown.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from api.concurrency import Gates
from service.settings import Settings
from service.cache_publisher import CachePublisher, start_publisher
from service.index_watch import IndexWatch
from service.model_lock import FairLock
from service.probes import ProbeMonitor, runtime_checks
from service.queries import QueryResult, QueryService
from service.queues import Queue, redact
from service.retrieval import Retrieval
from service.runtime import Runtime, build_runtime

if TYPE_CHECKING:
    from collections.abc import Callable

    from service.core_types import Engine
    from store.factory import Store

log = logging.getLogger(__name__)


class ServiceState:
    """Handles of a running app; attributes are None until :meth:`open`.

    Args:
        settings: service settings.
        engine: an already loaded ``Engine`` (tests); else one is loaded from ``settings.model``.
    """

    def __init__(self, settings: Settings, engine: Engine | None = None):
        self.settings = settings
        self.engine = engine
        self.runtime: Runtime | None = None
        self.model_lock = FairLock()  # FIFO: precompute and bookkeeping run between scheduler steps
        # where queries wait for the model, and probes run (api.concurrency); with the batching scheduler a
        # query's thread only waits for its tokens, so as many may enter as the scheduler can hold, plus one
        # that it refuses (503 with Retry-After) rather than leave waiting here
        slots = settings.max_running_requests + settings.max_waiting_requests + 1 if settings.scheduler else 1
        self.gates = Gates(model=slots)
        self.on_result: Callable[[QueryResult], None] | None = None
        self.on_step: Callable[[int, list[float]], None] | None = None  # the scheduler's per-step metrics
        self.started = 0.0
        self.probes: ProbeMonitor | None = None  # readiness checks in the background (service.probes)
        self.index_watch: IndexWatch | None = None  # a Redis index that lost its data is rebuilt
        self.publisher: CachePublisher | None = None  # cache events and load for a router (KVLINK_RAG_EVENTS_URL)

    @property
    def store(self) -> Store | None:
        """The runtime's store (None until :meth:`open`)."""
        return self.runtime.store if self.runtime is not None else None

    @property
    def queue(self) -> Queue | None:
        """The runtime's precompute queue (None until :meth:`open`)."""
        return self.runtime.queue if self.runtime is not None else None

    @property
    def retrieval(self) -> Retrieval | None:
        """The runtime's BM25 retrieval (None until :meth:`open`)."""
        return self.runtime.retrieval if self.runtime is not None else None

    @property
    def queries(self) -> QueryService | None:
        """The runtime's query service (None until :meth:`open`)."""
        return self.runtime.queries if self.runtime is not None else None

    @property
    def mode(self) -> str:
        """``celery`` (Redis broker) or ``embedded`` (thread pool in this process)."""
        return "celery" if self.settings.distributed else "embedded"

    @property
    def tenancy(self) -> str:
        return "multi-tenant" if self.settings.api_keys else "single-tenant"

    def open(self) -> None:
        """Open the store, load the engine, start the precompute queue (:func:`build_runtime`).

        Raises:
            ValueError, kvlink_rag.model.support.ModelLoadError, service.runtime.StoreOpenError: bad settings,
                model or store.
        """
        s = self.settings
        rt = build_runtime(s, self.engine, queue="auto", on_result=self.on_result, model_lock=self.model_lock)
        if rt.scheduler is not None:
            rt.scheduler.observe = self.on_step
        self.runtime, self.engine = rt, rt.engine
        self.started = time.time()
        self.probes = ProbeMonitor(runtime_checks(rt, s.readiness_timeout_s), s.readiness_interval_s,
                                   s.readiness_timeout_s)
        self.probes.start()
        if s.index_url and s.index_watch_interval_s > 0:
            self.index_watch = IndexWatch(rt, s.index_watch_interval_s)
            self.index_watch.start()
        self.publisher = start_publisher(s, rt)
        if not s.api_keys:
            log.warning("no API keys configured (KVLINK_RAG_API_KEYS): running single-tenant, every request is "
                        "tenant 'default' and no Authorization is required")
        log.info("kvlink-rag service ready: %s, precompute %s%s, index %s, store %s", self.tenancy, self.mode,
                 f" ({redact(s.broker_url)})" if s.distributed else f" ({s.precompute_threads} thread(s))",
                 redact(s.index_url) if s.index_url else "embedded (LMDB)", redact(s.local_store))

    def close(self) -> None:
        """Stop the background checks, the queue (embedded: finish its tasks) and flush the store's access
        stats."""
        for background in (self.publisher, self.index_watch, self.probes):
            if background is not None:
                background.close()
        if self.runtime is not None:
            self.runtime.close()
