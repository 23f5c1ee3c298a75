"""Profile the load path: 10 NQ documents (~4k tokens) streamed from LMDB into KV blocks, as bench/bandwidth.py."""
import sys, tempfile, time
from pathlib import Path
import torch
from cli.common import make_settings, make_engine
from evaluation.nq import load_nq
from bench.contexts import documents_for_budget
from store.factory import open_store
from bench.bandwidth import stream_into_blocks
engine = make_engine(make_settings())
ex = load_nq("/work/shared/data/nq-open-oracle-dev.jsonl.gz")
with tempfile.TemporaryDirectory() as tmp:
    st = open_store(engine.settings.model_copy(update={"home": Path(tmp), "store_max_bytes": 16 << 30, "host_cache_bytes": 8 << 30}))
    docs = documents_for_budget(engine, ex, 10, 4000, start=1000)
    keys = []
    for i, d in enumerate(docs):
        kv = engine.encode(d); k = f"bw-{i}"; st.blobs.put(k, kv); keys.append(k)
    for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        res = stream_into_blocks(st.blobs, keys, repeats=9)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items() if not isinstance(v, dict)},
              "stream ms", round(res["stream"]["median_s"] * 1e3, 2), "rope ms", round(res["stream_rope"]["median_s"] * 1e3, 2),
              "copy ms", round(res["copy"]["median_s"] * 1e3, 2), flush=True)
