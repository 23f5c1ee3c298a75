"""The load into blocks inside serving: GB/s of each kv_rows_many call the scheduler makes while admitting requests,
with the memory-tier filler's queue and the caller's torch threads noted. CLIENTS (default 16) clients, then 1."""
import collections, json, os, resource, sys, threading, time
import torch
from kvlink_rag.runtime.cpu_kernels import kernels
from store.tiers.tier_fill import TIER_FILLER
K = kernels()
calls = []
faults = []
own = []  # the calling (scheduler) thread's own faults: half the kernel's rows at two threads
on = threading.Event()
_many = K.kv_rows_many
def many(out, srcs, tm, starts, cos, sin):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    g0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    t = time.perf_counter()
    r = _many(out, srcs, tm, starts, cos, sin)
    if on.is_set():
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        own.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - g0)
        calls.append((time.perf_counter() - t, out.numel() * out.element_size(), torch.get_num_threads(),
                      TIER_FILLER.queue.qsize(), len(srcs)))
    return r
K.kv_rows_many = many
import kvlink_rag.linking.rope_rows as rr
from evaluation.nq import load_nq
from service.settings import Settings
from bench.serving_common import runtime, ingest
from bench.serving_nq import _nq_level
from cli.common import make_engine
from kvlink_rag.cache import MemoryCache
examples = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], limit=60)
engine = make_engine(Settings(), cache=MemoryCache())
pool = {f"d{i}": ex for i, ex in enumerate(examples[:60])}
rt = runtime(engine, scheduler=True)
def report(tag):
    s = sum(c[0] for c in calls); b = sum(c[1] for c in calls)
    busy = [c for c in calls if c[3] > 0]
    print(tag, f"calls {len(calls)} {s:.3f}s {b / s / 1e9:.2f} GB/s; threads {collections.Counter(c[2] for c in calls)};"
          f" with the filler's queue non-empty: {len(busy)} calls, "
          f"{sum(c[1] for c in busy) / max(1e-9, sum(c[0] for c in busy)) / 1e9:.2f} GB/s; docs/call "
          f"{collections.Counter(c[4] for c in calls)}", flush=True)
    print(f"  minor page faults (whole process) during the calls: {sum(faults)} ({sum(faults) * 4096 / max(1, b):.2f} of"
          " the bytes written, in 4 KiB pages);"
          f" the calling thread's own: {sum(own)}", flush=True)
    calls.clear(); faults.clear(); own.clear()
try:
    ingest(rt, pool)
    on.set()
    for n in (int(os.environ.get("CLIENTS", "16")), 1):
        r = _nq_level(rt, pool, n, 24, True, seed=1000 * n + 7)
        report(f"{n} clients ({r['throughput_rps']:.2f} req/s):")
finally:
    rt.close()
