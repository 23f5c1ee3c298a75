"""Helpers of the serving benchmarks: a runtime on a temporary home, ingesting NQ passages, client threads."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from kvlink_rag.engine import Engine
from kvlink_rag.nq import NQExample
from service.runtime import Runtime, build_runtime

TENANT = "default"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def runtime(engine: Engine, **overrides) -> Runtime:
    home = Path(tempfile.mkdtemp(prefix="kvlink-bench-serving-"))
    settings = engine.settings.model_copy(update={"home": home, "index_url": "", "broker_url": "", **overrides})
    return build_runtime(settings, engine, queue="auto", recover=False)


def ingest(rt: Runtime, docs: dict[str, NQExample], timeout: float = 1800) -> None:
    for doc_id, ex in docs.items():
        rt.store.catalog.ingest(TENANT, doc_id, ex.gold.text, ex.gold.title or "")
    deadline = time.monotonic() + timeout
    while rt.queue.depth() and time.monotonic() < deadline:
        time.sleep(0.1)


def run_clients(n_clients: int, jobs: list, run) -> tuple[list, float]:
    """Run ``run(job)`` for ``jobs`` from ``n_clients`` threads; ``(results, wall seconds)``."""
    out, lock = [], threading.Lock()

    def client(k: int) -> None:
        for job in jobs[k::n_clients]:
            r = run(job)
            with lock:
                out.append(r)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0
