"""Serving levels 1 and 16 clients (scheduler on) + the compute floor, JSON lines to argv[1]; with argv[2], this
process's pid is written there when the 16-client level starts, so a sampling profiler can attach for that level
only (epyc-serve-2026-12-07d/prof.sh)."""
import json, sys, os
from pathlib import Path
from evaluation.nq import load_nq
from kvlink_rag.engine import Engine
from service.settings import Settings
from bench.serving_common import runtime, ingest
from bench.serving_nq import _nq_level
from bench.flops import compute_floor
import torch
examples = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], limit=60)
from cli.common import make_engine
from kvlink_rag.cache import MemoryCache
engine = make_engine(Settings(), cache=MemoryCache())
pool = {f"d{i}": ex for i, ex in enumerate(examples[:60])}
rt = runtime(engine, scheduler=True)
out = open(sys.argv[1], "w")
try:
    ingest(rt, pool)
    for n in (1, 16):
        if n == 16 and len(sys.argv) > 2:
            Path(sys.argv[2]).write_text(str(os.getpid()))
        r = _nq_level(rt, pool, n, 24, True, seed=1000 * n + 1)
        print(json.dumps(r)); out.write(json.dumps(r) + "\n"); out.flush()
    fl = compute_floor(engine, r["prefill_tokens"], 24, int(r["context_tokens"]), 16)
    print(json.dumps(fl)); out.write(json.dumps(fl) + "\n")
finally:
    rt.close()
