"""An LMDB-warm linked query at ~4k tokens (10 NQ documents) on this class: host tier and LMDB warm alternating
(total, load, rows + RoPE, forward), then three LMDB-warm queries under cProfile (cumulative). Two threads.
Run: .venv/bin/python docs/bench/icelake-state-2026-12-07b/warm_profile.py"""
import os, sys, tempfile, time, cProfile, pstats
from pathlib import Path
import torch
sys.path.insert(0, os.getcwd())
from cli.common import make_engine, make_settings
from bench.contexts import documents_for_budget
from evaluation.nq import load_nq
from store.factory import open_store
from store.tiers.tier_fill import TIER_FILLER
torch.set_num_threads(2)
eng = make_engine(make_settings(chunk_tokens=0))
ex = load_nq(Path(os.environ["KVLINK_RAG_NQ_PATH"]))
with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
    st = open_store(eng.settings.model_copy(update={"home": Path(tmp), "store_max_bytes": 16 << 30, "host_cache_bytes": 8 << 30}))
    eng.cache = st.cache
    docs = documents_for_budget(eng, ex, 10, 4000, start=100)
    for d in docs: eng.get_or_encode(d)
    keys = [eng.cache_key(d) for d in docs]
    q = ex[0].question
    def run(warm):
        if warm:
            TIER_FILLER.join(); [st.tiered.invalidate(k) for k in keys]
        t0 = time.perf_counter(); ctx, hits = eng.link_context(q, docs); t = ctx.timings
        return time.perf_counter() - t0, t.load_s, t.rope_s, t.link_forward_s
    for w in (False, True, False, True, False, True):
        print("warm" if w else "host", ["%.0f ms" % (x * 1e3) for x in run(w)])
    prof = cProfile.Profile()
    for _ in range(3):
        TIER_FILLER.join(); [st.tiered.invalidate(k) for k in keys]
        prof.enable(); eng.link_context(q, docs); prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
