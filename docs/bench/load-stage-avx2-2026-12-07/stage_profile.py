"""Split the streamed load into the kernel's copy and everything around it (10 NQ docs, ~4k tokens)."""
import sys, time, tempfile, statistics
from pathlib import Path
import torch
sys.path.insert(0, ".")  # run from the repository root
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq
from store.factory import open_store
from bench.contexts import documents_for_budget
from bench.bandwidth import stream_into_blocks, copy_floor
from kvlink_rag.runtime.cpu_kernels import kernels
from kvlink_rag.runtime.kv_sequence import SequenceKV
from store.tiers.prefetch import prefetch_layers
from kvlink_rag.linking.rope_rows import copy_rows

engine = make_engine(make_settings(chunk_tokens=0))
ex = load_nq(Path(__import__("os").environ.get("KVLINK_RAG_NQ_PATH", "../shared/data/nq-open-oracle-dev.jsonl.gz")))
tmp = tempfile.mkdtemp()
st = open_store(engine.settings.model_copy(update={"home": Path(tmp), "store_max_bytes": 16 << 30, "host_cache_bytes": 8 << 30}))
engine.cache = st.cache
docs = documents_for_budget(engine, ex, 10, 4000, start=1000)
keys = []
for i, d in enumerate(docs):
    key = f"bw-{i}"; st.blobs.put(key, engine.encode(d)); keys.append(key)
blobs = st.blobs
R = 15
def med(f):
    ts = []
    for _ in range(R):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)

res = stream_into_blocks(blobs, keys, repeats=R)
print("bench: stream_vs_copy %.3f stream %.2f GB/s copy %.2f GB/s" % (res["stream_vs_copy"], res["stream_gbps"], res["copy_gbps"]))
metas = [blobs.meta(k) for k in keys]
L, H, _, D = metas[0]["shape"]; tokens = sum(m["shape"][2] for m in metas)
dtype = torch.bfloat16
# the staged buffers as the fill hands them: capture parts per layer
kv = [blobs.get(k) for k in keys]
seq = SequenceKV([], L, H, D, dtype, capacity=tokens); pool = seq.pool; seq.release()
s = SequenceKV([], L, H, D, dtype, capacity=tokens, pool=pool)
runs = s.own_runs(0, tokens)
captured = []
class Cap:
    def write_many(self, out, parts):
        captured.append((out, [bytes(memoryview(p.raw)) for p in parts], [p.token_major for p in parts], [p.start for p in parts]))
docs_ = prefetch_layers(blobs, keys)
for i in range(L):
    docs_.fill(i, runs[0][0][i], runs[0][1][i], Cap(), Cap())
print("token_major", captured[0][2][:3], "parts per layer", len(captured[0][1]), "bytes/layer", sum(len(b) for b in captured[0][1]))
K = kernels()
def kernel_only():
    for out, raws, tm, st_ in captured:
        K.kv_rows_many(out, raws, tm, st_, None, None)
t_kernel = med(kernel_only)
def kernel_1t():
    torch.set_num_threads(1)
    try: kernel_only()
    finally: torch.set_num_threads(2)
t_kernel1 = med(kernel_1t)
def fill_only():
    d = prefetch_layers(blobs, keys)
    for i in range(L):
        d.fill(i, runs[0][0][i], runs[0][1][i], copy_rows, copy_rows)
t_fill = med(fill_only)
def prefetch_only():
    prefetch_layers(blobs, keys)
t_pref = med(prefetch_only)
tensors = [t for x in kv for t in (x.keys, x.values)]
floor = copy_floor(tensors, R).median
nbytes = sum(x.nbytes for x in kv)
print(f"floor {floor*1e3:.2f} ms ({nbytes/floor/1e9:.2f} GB/s); kernel 2t {t_kernel*1e3:.2f} ms; kernel 1t {t_kernel1*1e3:.2f}; fill loop {t_fill*1e3:.2f}; prefetch_layers {t_pref*1e3:.2f}; stream {(nbytes/res['stream_gbps']/1e9)*1e3:.2f}")
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(20): fill_only()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
