"""One place that wires a running service from its settings: precompute queue, store, engine, retrieval
and queries. The API, the workers and the CLI all build theirs with :func:`build_runtime`.

Order matters: the queue exists before the store (the store's catalog enqueues into it), the document
service on the store is attached to the queue (whose tasks it runs), the engine
uses the store's cache (its cache keys are then the same in every process), and recovery runs last
(rebuilding an index uses the engine to find stored caches).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from service.settings import Settings
from service.documents import DocumentService
from service.model_lock import FairLock
from service.queries import QueryResult, QueryService
from service.queues import CeleryQueue, EmbeddedQueue, NoQueue, Queue, redact
from service.recovery_hooks import RequeueCorrupt, recover_at_start
from service.retrieval import BM25Params, Retrieval

if TYPE_CHECKING:
    from kvlink_rag.cache import DocumentCache
    from kvlink_rag.engine import Engine
    from kvlink_rag.runtime.scheduler import Scheduler
    from service.pins import PinRegistry
    from store.factory import Store

log = logging.getLogger(__name__)

QueueKind = Literal["auto", "none"]


class StoreOpenError(RuntimeError):
    """The store under ``settings.home`` (or its index) cannot be opened; the message names the folder
    and the cause (chained)."""


@dataclass
class Runtime:
    """Handles of a running service.

    Attributes:
        settings: the settings it was built from.
        store: the document store (texts, index, catalog, cache).
        documents: the documents' lifecycle (ingest, update, delete, precompute, recovery).
        queue: where precompute work goes (:class:`service.queues.Queue`).
        retrieval: BM25 over each tenant's documents.
        model_lock: serialises model calls (queries, embedded precompute, query bookkeeping).
        engine: the loaded engine, its cache the store's; None until :meth:`load_engine`.
        queries: the query service; None until the engine is loaded.
        on_result: called with every finished query (metrics).
        timings: seconds of ``store_open_s``, ``model_load_s``, ``engine_setup_s``.
        pins: documents pinned in the host tier (:mod:`service.pins`).
    """

    settings: Settings
    store: Store
    queue: Queue
    retrieval: Retrieval
    model_lock: threading.Lock
    documents: DocumentService
    engine: Engine | None = None
    queries: QueryService | None = None
    scheduler: Scheduler | None = None
    pins: PinRegistry | None = None
    on_result: Callable[[QueryResult], None] | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def load_s(self) -> float:
        """Seconds spent opening the store and loading the engine."""
        return sum(self.timings.values())

    def load_engine(self, engine: Engine | None = None) -> Engine:
        """Load the engine (or adopt ``engine``) on the store's cache and build the query service.

        Does nothing when an engine is loaded and none is given.

        Raises:
            kvlink_rag.model.support.ModelLoadError, kvlink_rag.model.convert.ModelFetchError, ValueError: the model
                cannot be loaded or does not fit the settings.
        """
        if engine is None and self.engine is not None:
            return self.engine
        if engine is None:
            engine = load_engine(self.settings, self.store.cache, self.timings)
        engine.cache = self.store.cache  # cache keys must be the store's (same as the workers')
        self.engine = self.documents.engine = engine  # the embedded queue precomputes through documents
        self.retrieval.use_chunks(engine.chunks)  # chunked documents are retrieved chunk by chunk
        if self.scheduler is None:
            self.scheduler = build_scheduler(self.settings, engine, self.model_lock)
            if isinstance(self.queue, EmbeddedQueue):  # precompute chunks wait while queries are served
                self.queue.model_busy = self.scheduler.busy
        self.queries = QueryService(engine, self.store, self.retrieval, self.model_lock, self.settings,
                                    on_result=self.on_result, scheduler=self.scheduler, documents=self.documents)
        return engine

    def close(self) -> None:
        """Stop the scheduler and the queue (embedded: finish its tasks), flush the store's access stats, close
        the index."""
        if self.scheduler is not None:
            self.scheduler.close()
        self.queue.close()
        self.store.blobs.close()
        self.store.index.close()


def build_scheduler(settings: Settings, engine: Engine, model_lock: threading.Lock) -> Scheduler:
    """The batching scheduler over ``engine``'s model with the settings' limits and prefix-tree budget (every
    query's one path to the model; with ``KVLINK_RAG_SCHEDULER=false`` it runs one request at a time)."""
    from kvlink_rag.runtime.block_pool import configure_pool
    from kvlink_rag.runtime.policies import make_policy
    from kvlink_rag.runtime.prefix_tree import PrefixTree
    from kvlink_rag.runtime.limits import SchedulerLimits
    from kvlink_rag.runtime.scheduler import Scheduler

    running = settings.max_running_requests if settings.scheduler else 1  # off: one request at a time
    limits = SchedulerLimits(max_running=running, max_waiting=settings.max_waiting_requests,
                             max_prefill_tokens=settings.max_prefill_tokens, max_wait_s=settings.max_queue_wait_s,
                             max_adapters=settings.max_loaded_adapters, max_step_tokens=settings.max_step_tokens,
                             long_prefill_budget=settings.long_prefill_budget)
    configure_pool(engine.lm, settings.kv_pool_bytes, settings.kv_block_size, settings.kv_pool_idle_s)
    return Scheduler(engine.lm, PrefixTree(settings.prefix_cache_bytes), model_lock, limits,
                     policy=make_policy(settings.admission_policy))


def apply_torch_threads(settings: Settings) -> None:
    """``torch.set_num_threads(settings.torch_threads)`` when it is set (> 0)."""
    if settings.torch_threads > 0:
        import torch

        torch.set_num_threads(settings.torch_threads)


def load_engine(settings: Settings, cache: DocumentCache, timings: dict[str, float] | None = None) -> Engine:
    """The model of ``settings`` with its engine (prefix KV, link tokens, query-side LoRA) over ``cache``.

    Args:
        timings: if given, ``model_load_s`` (weights, tokenizer, fingerprint; converts the default model on
            first use) and ``engine_setup_s`` are set in it.
    Raises:
        kvlink_rag.model.support.ModelLoadError, kvlink_rag.model.convert.ModelFetchError, ValueError: see :class:`Engine`.
    """
    from kvlink_rag.engine import Engine
    from kvlink_rag.model.loader import load_model

    t0 = time.perf_counter()
    lm = load_model(settings)
    t1 = time.perf_counter()
    engine = Engine(settings, lm=lm, cache=cache)
    if timings is not None:
        timings.update(model_load_s=t1 - t0, engine_setup_s=time.perf_counter() - t1)
    return engine


def open_queue(settings: Settings, kind: QueueKind, model_lock: threading.Lock) -> Queue:
    """``auto``: Celery workers when a broker is configured, else an embedded pool of
    ``settings.precompute_threads`` (its engine attached when loaded); ``none``: no queue."""
    if kind == "none":
        return NoQueue()
    if kind != "auto":
        raise ValueError(f"queue must be 'auto' or 'none', got {kind!r}")
    if settings.distributed:
        return CeleryQueue(settings)
    return EmbeddedQueue(model_lock, settings.precompute_threads)


def open_service_store(settings: Settings, queue: Queue) -> Store:
    """The store under ``settings.home`` enqueueing into ``queue``; a corrupt cache is re-queued (unless
    ``queue`` is a :class:`NoQueue`).

    Raises:
        StoreOpenError: the store or its index cannot be opened (bad index URL, Redis down, LMDB error).
    """
    from store.factory import open_store

    hook = None if isinstance(queue, NoQueue) else RequeueCorrupt(queue)
    try:
        store = open_store(settings, enqueue=queue, on_corrupt=hook)
    except Exception as e:  # noqa: BLE001 - any store failure becomes one clear message
        where = settings.store_dir if settings.local_store_url is None else redact(settings.local_store)
        raise StoreOpenError(f"cannot open the store under {where}: {e}") from e
    if hook is not None:
        hook.store = store
    return store


def open_pins(settings: Settings, store: Store) -> PinRegistry | None:
    """The pin registry of the store's host tier with ``settings.pinned_documents`` pinned (None without a host
    tier)."""
    from service.pins import PinRegistry, pin_listed

    if not any(t.name == "host" for t in store.tiered.tiers):
        return None
    pins = PinRegistry(store.tiered, settings.pin_budget_bytes)
    pin_listed(pins, settings.pinned_documents, store.index)
    return pins


def build_runtime(settings: Settings, engine: Engine | None = None, *, queue: QueueKind = "auto",
                  on_result: Callable[[QueryResult], None] | None = None, recover: bool = True,
                  load_engine: bool = True, model_lock: threading.Lock | None = None) -> Runtime:
    """Open the queue and the store, load the engine, recover, and build retrieval and queries.

    Args:
        engine: an already loaded engine to serve (tests); its cache becomes the store's.
        queue: ``auto`` (Celery with a broker, else embedded threads) or ``none`` (workers, CLI).
        on_result: called with every finished query.
        recover: re-queue unfinished documents and rebuild an emptied index
            (:func:`service.recovery_hooks.recover_at_start`).
        load_engine: load the engine now (else call :meth:`Runtime.load_engine` when one is needed).
        model_lock: the lock model calls share (a new one by default).
    Raises:
        StoreOpenError: the store cannot be opened. ValueError, kvlink_rag.model.support.ModelLoadError: bad
        settings or model. What is opened is closed again on failure.
    """
    apply_torch_threads(settings)
    lock = model_lock if model_lock is not None else FairLock()
    q = open_queue(settings, queue, lock)
    try:
        t0 = time.perf_counter()
        store = open_service_store(settings, q)
    except BaseException:
        q.close()
        raise
    retrieval = Retrieval(store.index, store.texts, settings.bm25_refresh_s,
                          params=BM25Params(settings.bm25_k1, settings.bm25_b))
    documents = DocumentService(store, retrieval=retrieval)
    if isinstance(q, EmbeddedQueue):
        q.documents = documents  # its tasks run the documents' precompute
    rt = Runtime(settings, store, q, retrieval, lock, documents, on_result=on_result,
                 timings={"store_open_s": time.perf_counter() - t0})
    try:
        if load_engine or engine is not None:
            rt.load_engine(engine)
        if recover:
            recover_at_start(documents)
        rt.pins = documents.pins = open_pins(settings, store)
    except BaseException:
        rt.close()
        raise
    return rt
