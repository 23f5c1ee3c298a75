"""The first linked queries of a fresh process (the scheduler's path, two cached NQ documents each, 8 new tokens):
TTFT and total seconds of each, after the engine's construction (its seconds printed first).
Usage (repository root): .venv/bin/python docs/bench/first-query-2026-12-08/first_query.py"""
import os, time, json
from bench.serving_common import ingest, runtime, TENANT
from cli.common import make_engine
from evaluation.nq import load_nq
from kvlink_rag.cache import MemoryCache
from service.settings import Settings
ex = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], limit=12)
t0 = time.perf_counter()
engine = make_engine(Settings(), cache=MemoryCache())
print("engine", round(time.perf_counter() - t0, 2), "s")
rt = runtime(engine, scheduler=True)
try:
    ingest(rt, {f"d{i}": e for i, e in enumerate(ex)})
    q = rt.queries
    for i in range(4):
        t0 = time.perf_counter()
        r = q.answer(q.plan(TENANT, ex[i].question, [f"d{i}", f"d{(i+1)%12}"], max_new_tokens=8))
        print(i, "TTFT", round(r.timings["ttft_s"], 3), "total", round(time.perf_counter() - t0, 3))
finally:
    rt.close()
