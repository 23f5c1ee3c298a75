"""Per-call wall time of admission's _rotate_into (stored documents into blocks) in serving_levels-style levels: a
warm-up of 4 clients, then 16 clients twice; each entry (ms, runs of the reserved blocks, tokens). Usage (repository
root): .venv/bin/python docs/bench/amx-phases-2026-12-08/rot_calls.py > OUT.txt"""
import json, os, sys, time
from bench.serving_common import ingest, runtime
from bench.serving_nq import _nq_level
from cli.common import make_engine
from evaluation.nq import load_nq
from kvlink_rag.cache import MemoryCache
from kvlink_rag.runtime import request_layout
from service.settings import Settings
CALLS = []
fn = request_layout._rotate_into
def wrapper(*a, **k):
    seq, pos = a[1], a[3]
    seq.reserve(int(pos.numel())); nr = len(seq.own_runs(seq.length, int(pos.numel())))
    t0, c0 = time.perf_counter(), time.thread_time()
    try: return fn(*a, **k)
    finally: CALLS.append((round(1e3*(time.perf_counter()-t0),1), nr, int(pos.numel())))
request_layout._rotate_into = wrapper
examples = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], limit=60)
engine = make_engine(Settings(), cache=MemoryCache())
pool = {f"d{i}": ex for i, ex in enumerate(examples[:60])}
rt = runtime(engine, scheduler=True)
try:
    ingest(rt, pool)
    _nq_level(rt, pool, 4, 24, True, seed=7)
    print("warm-up", CALLS); CALLS.clear()
    r = _nq_level(rt, pool, 16, 24, True, seed=16001)
    print("16", CALLS); print(r["throughput_rps"])
    CALLS.clear()
    r = _nq_level(rt, pool, 16, 24, True, seed=16002)
    print("16 again", CALLS); print(r["throughput_rps"])
finally:
    rt.close()
