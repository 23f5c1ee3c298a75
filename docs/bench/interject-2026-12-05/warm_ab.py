"""Host tier and LMDB-warm linked TTFT at ~4k tokens in blocks of 7 (the bench's order), several rounds."""
import os, sys, time, tempfile, statistics, json
from pathlib import Path
import torch
from cli.common import make_engine, make_settings
from evaluation.nq import load_nq
from bench.contexts import documents_for_budget
from store.factory import open_store
from store.tiers.tier_fill import TIER_FILLER
ex = load_nq(os.environ["KVLINK_RAG_NQ_PATH"])
eng = make_engine(make_settings())
tmp = tempfile.mkdtemp()
st = open_store(eng.settings.model_copy(update={"home": Path(tmp), "store_max_bytes": 16 << 30, "host_cache_bytes": 8 << 30}))
eng.cache = st.cache
docs = documents_for_budget(eng, ex, 10, 4000, start=100)
for d in docs: eng.get_or_encode(d)
keys = [eng.cache_key(d) for d in docs]
q = ex[0].question
def one(warm):
    if warm:
        TIER_FILLER.join(); [st.tiered.invalidate(k) for k in keys]
    t0 = time.perf_counter()
    ctx, hits = eng.link_context(q, docs)
    int(torch.argmax(ctx.last_logits))
    return time.perf_counter() - t0, ctx.timings.link_forward_s
one(False); one(True)
out = []
for r in range(int(sys.argv[2])):
    h = [one(False) for _ in range(7)]
    w = [one(True) for _ in range(7)]
    hm, wm = statistics.median(x[0] for x in h), statistics.median(x[0] for x in w)
    out.append({"host_ms": hm * 1e3, "warm_ms": wm * 1e3, "host_fwd_ms": statistics.median(x[1] for x in h) * 1e3,
                "warm_fwd_ms": statistics.median(x[1] for x in w) * 1e3, "warm_max_ms": max(x[0] for x in w) * 1e3,
                "ratio": hm / wm})
    print(json.dumps(out[-1]))
json.dump(out, open(sys.argv[1], "w"))
