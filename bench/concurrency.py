"""Concurrent clients through the HTTP API with a mixed workload (60% short, 30% medium, 10% long queries
by context size): throughput, p50/p99 latency, hit rate, and short-vs-long latency spread (fairness)."""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine

from .timing import pct, run_clients

CLASSES = (("short", 0.6, 2), ("medium", 0.3, 5), ("long", 0.1, 10))  # name, share, documents


def workload(n: int, rng: random.Random) -> list[str]:
    """``n`` request classes in the ``CLASSES`` shares (largest remainder, so 32 requests hold 19 short,
    10 medium and 3 long; every class appears once n >= 10), in a seeded random order."""
    exact = [share * n for _, share, _ in CLASSES]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(CLASSES)), key=lambda i: counts[i] - exact[i])[: n - sum(counts)]:
        counts[i] += 1
    plan = [name for (name, _, _), c in zip(CLASSES, counts) for _ in range(c)]
    rng.shuffle(plan)
    return plan


def concurrency(engine: Engine, examples: list[NQExample], clients: list[int], requests: int = 32,
                max_new_tokens: int = 8, seed: int = 0) -> list[dict]:
    """For each client count: that many threads sharing ``max(requests, clients)`` queries (see
    :func:`workload`) sent to one app.

    The documents (the gold passages of 40 questions) are ingested and precomputed first, so queries
    measure reuse; latency is what each client observes end to end (HTTP, queueing on the model, answer).
    """
    from fastapi.testclient import TestClient

    from api.main import create_app

    home = Path(tempfile.mkdtemp(prefix="kvlink-bench-http-"))
    app = create_app(engine.settings.model_copy(update={"home": home}), engine)
    pool = examples[:40]
    rows = []
    with TestClient(app) as c:
        c.post("/v1/documents", json={"documents": [{"id": f"d{i}", "title": ex.gold.title or "", "text": ex.gold.text}
                                                    for i, ex in enumerate(pool)]})
        deadline = time.monotonic() + 1800
        while any(c.get(f"/v1/documents/d{i}").json().get("status") != "ready" for i in range(len(pool))):
            if time.monotonic() > deadline:
                raise TimeoutError("documents were not precomputed in time")
            time.sleep(0.2)
        for n_clients in clients:
            plan = _plan(pool, max(requests, n_clients), random.Random(seed + n_clients), max_new_tokens)
            results, wall = _run_clients(c, plan, n_clients)
            rows.append(_summary(n_clients, results, wall))
    return rows


def _plan(pool: list[NQExample], n: int, rng: random.Random, max_new_tokens: int) -> list[tuple[str, dict]]:
    """``n`` query bodies ``(class, body)`` of the :func:`workload` mix over the ingested documents
    ``d0..d{len(pool)-1}`` (the question's own gold passage plus random others)."""
    n_pool = len(pool)
    docs_of = {name: n_docs for name, _, n_docs in CLASSES}
    plan = []
    for name in workload(n, rng):
        q = rng.randrange(n_pool)
        others = rng.sample([j for j in range(n_pool) if j != q], docs_of[name] - 1)
        plan.append((name, {"question": pool[q].question, "document_ids": [f"d{q}"] + [f"d{j}" for j in others],
                            "max_new_tokens": max_new_tokens}))
    return plan


def _run_clients(c, plan: list[tuple[str, dict]], n_clients: int) -> tuple[list[tuple[str, float, int, int]], float]:
    """Send ``plan`` from ``n_clients`` threads; ``[(class, latency s, hits, documents)]`` and the wall time (s)."""

    def run(job: tuple[str, dict]) -> tuple[str, float, int, int]:
        t0 = time.perf_counter()
        resp = c.post("/v1/query", json=job[1]).json()
        return job[0], time.perf_counter() - t0, sum(d["cache_hit"] for d in resp["documents"]), len(resp["documents"])

    return run_clients(n_clients, plan, run)


def _summary(n_clients: int, results: list[tuple[str, float, int, int]], wall: float) -> dict:
    """Throughput, p50/p99 latency, hit rate and the short-vs-long latency spread of one level."""
    lat = [r[1] for r in results]
    by = {name: [r[1] for r in results if r[0] == name] for name, _, _ in CLASSES}
    short, long_ = by["short"], by["long"]
    return {"clients": n_clients, "requests": len(results), "throughput_rps": len(results) / wall,
            "p50_s": statistics.median(lat), "p99_s": pct(lat, 0.99),
            "hit_rate": sum(r[2] for r in results) / sum(r[3] for r in results),
            "p50_short_s": statistics.median(short) if short else None,
            "p50_long_s": statistics.median(long_) if long_ else None,
            "long_over_short": (statistics.median(long_) / statistics.median(short)) if short and long_ else None}
