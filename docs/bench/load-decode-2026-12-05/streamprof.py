"""Stream-only loop (bench/bandwidth.py stream_into_blocks at depth 0: 10 NQ documents, ~4k tokens, from LMDB into
one request's KV blocks, values and keys copied): ms per stream over argv[1] repeats. Run from the repo root."""
import sys, tempfile, time
from pathlib import Path
import torch
from cli.common import make_settings, make_engine
from evaluation.nq import load_nq
from bench.contexts import documents_for_budget
from store.factory import open_store
from bench.bandwidth import stream_into_blocks
from kvlink_rag.linking.rope_rows import block_writers, copy_rows
from kvlink_rag.runtime.kv_sequence import SequenceKV
from store.records.codec import target_dtype
from store.tiers.prefetch import prefetch_layers
engine = make_engine(make_settings())
ex = load_nq("/work/shared/data/nq-open-oracle-dev.jsonl.gz")
tmp = tempfile.mkdtemp()
st = open_store(engine.settings.model_copy(update={"home": Path(tmp), "store_max_bytes": 16 << 30, "host_cache_bytes": 8 << 30}))
docs = documents_for_budget(engine, ex, 10, 4000, start=1000)
keys = []
for i, d in enumerate(docs):
    kv = engine.encode(d); k = f"bw-{i}"; st.blobs.put(k, kv); keys.append(k)
blobs = st.blobs
metas = [blobs.meta(k) for k in keys]
L, H, _, D = metas[0]["shape"]
dtype, tokens = target_dtype(metas[0], None), sum(m["shape"][2] for m in metas)
seq = SequenceKV([], L, H, D, dtype, capacity=tokens)
pool = seq.pool
def run(writers):
    s = SequenceKV([], L, H, D, dtype, capacity=tokens, pool=pool)
    docs = prefetch_layers(blobs, keys)
    runs = s.own_runs(0, tokens)
    for i in range(L):
        docs.fill(i, runs[0][0][i], runs[0][1][i], *writers)
    s.commit(tokens); s.release()
seq.release()
n = int(sys.argv[1])
for _ in range(5): run((copy_rows, copy_rows))
t = time.perf_counter()
for _ in range(n): run((copy_rows, copy_rows))
print("stream ms", (time.perf_counter() - t) / n * 1e3, flush=True)
