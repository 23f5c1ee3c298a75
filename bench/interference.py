"""A short cached query's latency while a ~4k-token document is precomputed, against the same query idle."""

from __future__ import annotations

import statistics
import time

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine

from .serving_common import TENANT, ingest, runtime


def _long_text(examples: list[NQExample], engine: Engine, tokens: int, start: int) -> str:
    parts, n, i = [], 0, start
    while n < tokens:
        text = examples[i].gold.text
        parts.append(text)
        n += int(engine.document_ids(type(examples[i].gold)(text)).numel())
        i += 1
    return "\n\n".join(parts)


def precompute_interference(engine: Engine, examples: list[NQExample], long_tokens: int = 4000, samples: int = 10,
                            log=print) -> dict:
    """p50 latency of a 1-document cached query (8 new tokens) idle and while long documents are encoded."""
    rt = runtime(engine)
    try:
        ingest(rt, {"short": examples[0]})
        queries = rt.queries

        def once() -> float:
            t0 = time.perf_counter()
            queries.answer(queries.plan(TENANT, examples[0].question, ["short"], max_new_tokens=8, temperature=0.0))
            return time.perf_counter() - t0

        once()
        log("short query idle")
        idle = [once() for _ in range(samples)]
        log(f"short query while ~{long_tokens}-token documents are precomputed")
        busy, k, encode_s = [], 0, []
        while len(busy) < samples and k < 10:
            text = _long_text(examples, engine, long_tokens, 100 + 40 * k)
            t0 = time.perf_counter()
            rt.documents.ingest(TENANT, f"long{k}", text)
            while rt.queue.depth() and len(busy) < samples:
                busy.append(once())
            while rt.queue.depth():
                time.sleep(0.05)
            encode_s.append(time.perf_counter() - t0)
            k += 1
    finally:
        rt.close()
    p_idle, p_busy = statistics.median(idle), statistics.median(busy)
    return {"idle_p50_s": p_idle, "busy_p50_s": p_busy, "ratio": p_busy / p_idle, "samples": len(busy),
            "long_documents": k, "long_encode_wall_s": statistics.median(encode_s)}
