"""Linked NQ queries through the batching scheduler at several client counts, next to the compute floor."""

from __future__ import annotations

import random
import statistics
import time

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine
from service.runtime import Runtime

from .flops import compute_floor
from .serving_common import TENANT, ingest, runtime
from .timing import pct, run_clients


def nq_throughput(engine: Engine, examples: list[NQExample], clients: list[int], new_tokens: int = 24,
                  log=print) -> dict:
    """Linked NQ queries at each client count (scheduler on), and the highest count with it off."""
    pool = {f"d{i}": ex for i, ex in enumerate(examples[:60])}
    rows = []
    for scheduler in (True, False):
        rt = runtime(engine, scheduler=scheduler)
        try:
            ingest(rt, pool)
            levels = clients if scheduler else clients[-1:]
            for n in levels:
                log(f"NQ queries: {n} client(s), scheduler {'on' if scheduler else 'off'}")
                rows.append(_nq_level(rt, pool, n, new_tokens, scheduler, seed=1000 * n + scheduler))
        finally:
            rt.close()
    base = next(r for r in rows if r["clients"] == clients[0] and r["scheduler"])
    for r in rows:
        r["speedup_vs_1"] = r["throughput_rps"] / base["throughput_rps"]
    return {"rows": rows, "floor": compute_floor(engine, rows[-1]["prefill_tokens"], new_tokens, 1500, 16)}


def _nq_level(rt: Runtime, pool: dict, n_clients: int, new_tokens: int, scheduler: bool, seed: int) -> dict:
    rng = random.Random(seed)
    ids = list(pool)
    n = max(8, 3 * n_clients)
    jobs = []
    for _ in range(n):
        q = rng.choice(ids)
        jobs.append((pool[q].question, [q] + rng.sample([i for i in ids if i != q], 9)))
    queries = rt.queries

    def run(job):
        t0 = time.perf_counter()
        r = queries.answer(queries.plan(TENANT, job[0], job[1], max_new_tokens=new_tokens, temperature=0.0,
                                        ignore_eos=True))  # all 24 tokens, as vLLM's benchmarks
        return time.perf_counter() - t0, len(r.token_ids), r.timings["ttft_s"], r.context_tokens

    results, wall = run_clients(n_clients, jobs, run)
    lat = [r[0] for r in results]
    p50 = statistics.median(lat)
    return {"clients": n_clients, "scheduler": scheduler, "requests": n, "throughput_rps": n / wall,
            "tokens_per_s": sum(r[1] for r in results) / wall, "p50_s": p50, "p99_s": pct(lat, 0.99),
            "p99_over_p50": pct(lat, 0.99) / p50, "ttft_p50_s": statistics.median(r[2] for r in results),
            "mean_new_tokens": statistics.mean(r[1] for r in results),
            "prefill_tokens": 10 * rt.engine.link_k + 20,  # link tokens + a typical question with its header
            "context_tokens": statistics.mean(r[3] for r in results)}
