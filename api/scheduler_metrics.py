"""Scheduler and prefix-tree metrics: batch size and queue wait histograms (observed per step), running
and waiting requests, the prefix tree's shared bytes, hit tokens and evictions, and fair admission's per-tenant
virtual token counters (read at scrape time), and the engine's weight format and KV cache dtype as an info metric
(vLLM's ``cache_config_info``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class StepMetrics:
    """Histograms fed by :class:`kvlink_rag.runtime.scheduler.Scheduler` after each step (its ``observe``)."""

    def __init__(self, registry: CollectorRegistry):
        self.batch = Histogram("kvlink_batch_size", "Requests in one scheduler step's forwards (prefill and decode).",
                               registry=registry, buckets=BATCH_BUCKETS)
        self.wait = Histogram("kvlink_queue_wait_seconds", "Seconds a request waited before the scheduler admitted it.",
                              registry=registry, buckets=WAIT_BUCKETS)

    def __call__(self, rows: int, waits: list[float]) -> None:
        if rows:
            self.batch.observe(rows)
        for w in waits:
            self.wait.observe(w)


class SchedulerCollector:
    """Scrape-time gauges and counters of the scheduler of ``state.runtime`` (nothing before it starts)."""

    def __init__(self, state):
        self.state = state

    def describe(self):
        return []

    def collect(self):
        engine = self.state.engine
        if engine is not None:
            lm = engine.lm
            info = InfoMetricFamily("kvlink_cache_config", "The model runner's weight format and the dtype of the "
                                    "scheduler's KV blocks (KVLINK_RAG_KV_CACHE_DTYPE and what it resolved to).")
            info.add_metric([], {"weight_format": lm.weight_format, "kv_cache_dtype": lm.kv_cache_dtype,
                                 "kv_dtype": str(lm.kv_dtype).removeprefix("torch.")})
            yield info
        rt = self.state.runtime
        sched = rt.scheduler if rt is not None else None
        if sched is None:
            return
        s = sched.stats()
        tree = s["tree"]
        for name, doc, value in (
                ("kvlink_scheduler_running", "Requests generating (in the running batch).", s["running"]),
                ("kvlink_scheduler_waiting", "Requests waiting for admission.", s["waiting"]),
                ("kvlink_prefix_tree_bytes", "KV bytes held by the prefix tree (shared across requests).", tree["bytes"]),
                ("kvlink_prefix_tree_nodes", "Nodes in the prefix tree.", tree["nodes"]),
                ("kvlink_running_own_kv_bytes", "KV bytes running requests hold privately (not shared).",
                 s["running_own_bytes"]),
                ("kvlink_kv_pool_used_bytes", "Bytes of KV blocks in use (running requests and the prefix tree).",
                 s["kv_pool"].get("used_bytes", 0)),
                ("kvlink_kv_pool_capacity_bytes", "Bytes of KV blocks the pool holds (arenas allocated so far).",
                 s["kv_pool"].get("capacity_bytes", 0))):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        for name, doc, value in (
                ("kvlink_prefix_tree_hit_tokens", "Prompt tokens served from the prefix tree.", tree["hit_tokens"]),
                ("kvlink_prefix_tree_evicted_bytes", "KV bytes evicted from the prefix tree (LRU).", tree["evicted_bytes"]),
                ("kvlink_scheduler_steps", "Scheduler steps run.", s["steps"])):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        counters = getattr(sched.policy, "counters", None)  # fair admission (kvlink_rag.runtime.fair_admission)
        if counters is not None:
            c = CounterMetricFamily("kvlink_admission_tenant_tokens", "Fair admission's virtual token counter per "
                                    "tenant: prefill tokens admitted + 2 x tokens generated, lifted when the tenant "
                                    "starts sending.", labels=["tenant"])
            for tenant, value in sorted(dict(counters).items()):  # a C-level copy: safe beside the scheduler
                c.add_metric([tenant], value)
            yield c
