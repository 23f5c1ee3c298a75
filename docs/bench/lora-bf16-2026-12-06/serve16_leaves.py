"""16 clients through the scheduler; wall time of leaf phases summed in the scheduler thread, counted from the
first request (the documents' ingest excluded). Output: the run's JSON line, then seconds per phase."""
import collections, functools, importlib, json, os, sys, threading, time
stats = collections.defaultdict(lambda: [0, 0.0])
on = threading.Event()
def wrap(modname, qual):
    mod = importlib.import_module(modname)
    owner, attr = (mod, qual) if "." not in qual else (getattr(mod, qual.split(".")[0]), qual.split(".")[1])
    f = getattr(owner, attr)
    @functools.wraps(f)
    def g(*a, **k):
        if not on.is_set():
            return f(*a, **k)
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            s = stats[qual]; s[0] += 1; s[1] += time.perf_counter() - t
    setattr(owner, attr, g)
    return g
R = "kvlink_rag.runtime."
import kvlink_rag.runtime.model_runner as mr
import kvlink_rag.runtime.ragged as rg
shapes = collections.defaultdict(lambda: [0, 0.0])
_attend = rg.attend
def by_shape(q, pieces, mask, scale, causal=False):  # ATTEND_SHAPES=1: seconds per (queries, keys, pieces) class
    if not on.is_set() or not os.environ.get("ATTEND_SHAPES"):
        return _attend(q, pieces, mask, scale, causal)
    t = time.perf_counter()
    out = _attend(q, pieces, mask, scale, causal)
    key = (q.shape[1] // 16 * 16, sum(k.shape[1] for k, _ in pieces) // 256 * 256, len(pieces), mask is not None,
           causal, str(q.dtype)[6:], str(pieces[0][0].dtype)[6:])
    s = shapes[key]; s[0] += 1; s[1] += time.perf_counter() - t
    return out
rg.attend = by_shape
mr.attend = wrap(R + "ragged", "attend")
for m, q in [(R + "packed_linear", "PackedLinear.__call__"), (R + "q4q8", "Q4Q8Linear.__call__"),
             (R + "linear", "DenseLinear.__call__"), (R + "fused_decode", "layer_pre"),
             (R + "fused_decode", "layer_post"), (R + "fused_decode", "attend"), (R + "scheduler", "Scheduler._admit"),
             (R + "scheduler", "Scheduler._step"), (R + "lora", "FusedLowRank._gemm"),
             (R + "lora", "FusedLowRank.add_to"), (R + "model_runner", "ModelRunner._rope"),
             (R + "head", "RescoredHead.__call__"), (R + "kv_sequence", "SequenceKV.write")]:
    wrap(m, q)
import cProfile, pstats
import kvlink_rag.runtime.scheduler as sch
prof = cProfile.Profile()
_admit = sch.Scheduler._admit
def profiled_admit(self, chosen):  # ADMIT_PROFILE=1: cProfile of admission alone (its Python inflated)
    if not on.is_set() or not os.environ.get("ADMIT_PROFILE"):
        return _admit(self, chosen)
    prof.enable()
    try:
        return _admit(self, chosen)
    finally:
        prof.disable()
sch.Scheduler._admit = profiled_admit
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
try:
    ingest(rt, pool)
    on.set(); t0 = time.perf_counter()
    r = _nq_level(rt, pool, int(os.environ.get("CLIENTS", "16")), 24, True, seed=16001)
    wall = time.perf_counter() - t0
finally:
    rt.close()
print(json.dumps(r))
print(f"wall {wall:.2f}s")
for k, (n, s) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
    print(f"{k:32s} {n:7d} {s:7.2f}s {100 * s / wall:5.1f}%")
for k, (n, s) in sorted(shapes.items(), key=lambda kv: -kv[1][1])[:20]:
    print("attend (queries//16*16, keys//256*256, pieces, mask, causal, q, kv)", k, n, f"{s:.3f}s {s / n * 1e3:.2f} ms/call")
if os.environ.get("ADMIT_PROFILE"):
    pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
