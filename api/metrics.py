"""Prometheus metrics of one app, in a private ``CollectorRegistry`` (several apps in one process, as in
tests, do not collide).

Measured in the request path: request latency per route (histogram, seconds), query TTFT and stages
(histograms, seconds), documents used per cache outcome. Read from the store at scrape time: memory
tier hits, misses, hit ratio, bytes and evictions per tier; LMDB loads, misses and evictions; checksum
failures; the precompute queue depth.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from api.scheduler_metrics import SchedulerCollector, StepMetrics

log = logging.getLogger(__name__)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods labelled as themselves; any other method name a client sends is labelled ``other``."""
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
STAGES = ("retrieval_s", "queue_wait_s", "cache_load_s", "link_s", "ttft_s", "total_s")


class StoreCollector:
    """Scrape-time metrics from the store and the precompute queue.

    Args:
        state: an object with ``store`` (``store.factory.Store``) and ``queue`` (``depth()``), or None
            attributes before the app started.
    """

    def __init__(self, state):
        self.state = state

    def describe(self):
        return []

    def _pins(self):
        pins = self.state.runtime.pins if self.state.runtime is not None else None
        if pins is None:
            return
        g = GaugeMetricFamily("kvlink_pinned_bytes", "Host-tier bytes of pinned documents, per tenant.",
                              labels=["tenant"])
        for tenant, n in sorted(pins.bytes_by_tenant().items()):
            g.add_metric([tenant], n)
        yield g

    def collect(self):
        store = self.state.store
        if store is not None:
            yield from self._tiers(store)
            yield from self._pins()
            blobs = store.blobs
            c = CounterMetricFamily("kvlink_checksum_failures", "Stored KV records that failed their checksum.")
            c.add_metric([], blobs.checksum_failures)
            yield c
            events = blobs.events()
            if events:
                shared = CounterMetricFamily("kvlink_blob_store_events", "Reads and writes of a tiered or shared "
                                             "blob store by outcome (local_hit, shared_hit, miss, fenced, "
                                             "shared_error, missing, corrupt, newer_format, fill_skipped).",
                                             labels=["event"])
                for event, n in sorted(events.items()):
                    shared.add_metric([event], n)
                yield shared
            corrupt = CounterMetricFamily("kvlink_corrupt_records", "Reads of a stored text or index record that "
                                          "failed its checksum (the document is reported failed, never served).",
                                          labels=["kind"])
            corrupt.add_metric(["text"], store.texts.corrupt_reads)
            corrupt.add_metric(["record"], store.index.corrupt_reads)
            yield corrupt
        queue = self.state.queue
        if queue is not None:
            g = GaugeMetricFamily("kvlink_precompute_queue_depth", "Precompute tasks waiting (or running, embedded).")
            try:
                g.add_metric([], queue.depth())
            except Exception:  # noqa: BLE001 - broker down: report NaN rather than failing the scrape
                g.add_metric([], float("nan"))
            yield g

    def _tiers(self, store):
        stats = store.tiered.stats()
        hits = CounterMetricFamily("kvlink_cache_hits", "Cache lookups that found the document.", labels=["tier"])
        misses = CounterMetricFamily("kvlink_cache_misses", "Cache lookups that did not.", labels=["tier"])
        ratio = GaugeMetricFamily("kvlink_cache_hit_ratio", "hits / (hits + misses) per tier.", labels=["tier"])
        evictions = CounterMetricFamily("kvlink_cache_evictions", "Documents evicted for space.", labels=["tier"])
        used = GaugeMetricFamily("kvlink_cache_used_bytes", "Bytes held per tier.", labels=["tier"])
        partial = CounterMetricFamily("kvlink_cache_partial_misses", "Lookups a tier missed because it holds the "
                                      "document at a lower retention than asked (also in misses).", labels=["tier"])
        held = GaugeMetricFamily("kvlink_cache_entries", "Entries (documents, or chunks of long documents) held per tier, by the retention held.",
                                 labels=["tier", "retention"])
        for t in stats["tiers"]:
            name = t["name"]
            hits.add_metric([name], t["hits"])
            misses.add_metric([name], t["misses"])
            total = t["hits"] + t["misses"]
            ratio.add_metric([name], t["hits"] / total if total else 0.0)
            evictions.add_metric([name], t["evictions"])
            used.add_metric([name], t["used_bytes"])
            partial.add_metric([name], t["partial_misses"])
            for r, n in t["entries_by_retention"].items():
                held.add_metric([name, r], n)
        counters = stats["counters"]
        lmdb_hits, lmdb_misses = counters.get("load", 0) + counters.get("load_shared", 0), counters.get("miss", 0)
        hits.add_metric(["lmdb"], lmdb_hits)
        misses.add_metric(["lmdb"], lmdb_misses)
        ratio.add_metric(["lmdb"], lmdb_hits / (lmdb_hits + lmdb_misses) if lmdb_hits + lmdb_misses else 0.0)
        evictions.add_metric(["lmdb"], store.blobs.evictions)
        try:
            used.add_metric(["lmdb"], store.blobs.used_bytes())
        except Exception:  # noqa: BLE001
            pass
        rt = self.state.runtime
        if rt is not None and rt.scheduler is not None:  # the prefix tree is a memory tier too (shared KV)
            used.add_metric(["prefix"], rt.scheduler.tree.stats()["bytes"])
        yield from (hits, misses, ratio, evictions, used, partial, held)


class Metrics:
    """The app's metrics and registry.

    Args:
        state: see :class:`StoreCollector`.
    """

    def __init__(self, state):
        self.registry = CollectorRegistry()
        self.requests = Histogram("kvlink_request_duration_seconds", "HTTP request latency (to the last byte for "
                                  "streams).", ["method", "route", "status"], registry=self.registry,
                                  buckets=LATENCY_BUCKETS)
        self.ttft = Histogram("kvlink_ttft_seconds", "Query time to first token, from the request's start.",
                              registry=self.registry, buckets=LATENCY_BUCKETS)
        self.stages = Histogram("kvlink_query_stage_seconds", "Query stage durations.", ["stage"],
                                registry=self.registry, buckets=LATENCY_BUCKETS)
        self.documents = Counter("kvlink_query_documents", "Documents used by queries, by cache outcome.",
                                 ["cache"], registry=self.registry)
        self.registry.register(StoreCollector(state))
        self.registry.register(SchedulerCollector(state))
        self.observe_step = StepMetrics(self.registry)  # the scheduler's observe

    def observe_query(self, result) -> None:
        """Record an :class:`service.queries.QueryResult`."""
        self.ttft.observe(result.timings["ttft_s"])
        for stage in STAGES:
            if stage in result.timings:
                self.stages.labels(stage).observe(result.timings[stage])
        for hit in result.cache_hits:
            self.documents.labels("hit" if hit else "miss").inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def request_labels(scope: dict, status: int) -> tuple[str, str, str]:
    """``(method, route, status)`` labels of a request, from closed sets (clients cannot add series):
    a known method or ``other``, the route template (``/v1/documents/{doc_id}``) or ``unmatched``, and the
    status code the app answered."""
    method = scope.get("method", "")
    route = getattr(scope.get("route"), "path", None)
    return (method if method in METHODS else "other", route if isinstance(route, str) else "unmatched",
            str(int(status)))


class RequestTimer:
    """ASGI middleware: observe each request's latency, to its last byte, labelled by
    :func:`request_labels`."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.requests.labels(*request_labels(scope, status[0])).observe(time.perf_counter() - t0)
