"""Streaming 10 stored NQ documents (~1.3k tokens) from LMDB into KV blocks, keys rotated (the scheduler's admission):
the first read of a record in this process against a second read, into blocks whose pages were touched before
against a fresh arena's (page faults), each timed alone on the main thread. Minor page faults counted per case."""
import resource, sys, tempfile, time
from pathlib import Path
import torch
from cli.common import make_settings, make_engine
from evaluation.nq import load_nq
from store.factory import open_store
from store.tiers.prefetch import prefetch_layers
from store.records.codec import target_dtype
from kvlink_rag.runtime.kv_sequence import SequenceKV
from kvlink_rag.runtime.block_pool import BlockPool
from kvlink_rag.linking.rope_rows import block_writers
engine = make_engine(make_settings())
ex = load_nq("/work/shared/data/nq-open-oracle-dev.jsonl.gz", limit=80)
def fill(blobs, keys, pool):
    metas = [blobs.meta(k) for k in keys]
    L, H, _, D = metas[0]["shape"]
    tokens = sum(m["shape"][2] for m in metas)
    s = SequenceKV([], L, H, D, target_dtype(metas[0], None), capacity=tokens, pool=pool)
    writers = block_writers(torch.randn(tokens, D), torch.randn(tokens, D))
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    docs = prefetch_layers(blobs, keys)
    runs = s.own_runs(0, tokens)
    assert len(runs) == 1, f"{len(runs)} runs"
    for i in range(L):
        docs.fill(i, runs[0][0][i], runs[0][1][i], *writers)
    s.commit(tokens)
    dt = time.perf_counter() - t
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    nbytes = 2 * L * H * tokens * D * 2
    s.release()
    return dt, nbytes, faults
with tempfile.TemporaryDirectory() as tmp:
    st = open_store(engine.settings.model_copy(update={"home": Path(tmp), "store_max_bytes": 16 << 30}))
    keys = []
    for i, e in enumerate(ex[:70]):
        kv = engine.encode(e.gold)
        k = f"d{i}"; st.blobs.put(k, kv); keys.append(k)
    m = st.blobs.meta(keys[0]); L, H, _, D = m["shape"]
    pool = BlockPool(L, H, D, target_dtype(m, None), arena_blocks=256)  # serving's arenas; touched by the fills below
    fill(st.blobs, keys[60:70], pool)  # the pool's arena touched
    for j in range(0, 60, 10):
        ks = keys[j:j + 10]
        first = fill(st.blobs, ks, pool)
        again = fill(st.blobs, ks, pool)
        fresh_pool = BlockPool(L, H, D, target_dtype(m, None), arena_blocks=256)  # a new, untouched arena
        fresh = fill(st.blobs, ks, fresh_pool)
        print(" | ".join(f"{name} {dt * 1e3:6.2f} ms {nb / dt / 1e9:5.2f} GB/s {fl:6d} faults" for name, (dt, nb, fl)
                         in (("first read, touched blocks", first), ("second read", again), ("fresh arena", fresh))),
              flush=True)
