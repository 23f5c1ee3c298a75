"""Serving levels 1 and 16 clients with the floor (as prefill-kernel-2026-12-05/serving_levels.py), writing
argv[2] when the 16-client level starts so a sampling profiler can attach for that level only.
Usage (repository root): python serve_prof.py OUT.jsonl MARKER"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())
from bench.flops import compute_floor  # noqa: E402
from bench.serving_common import ingest, runtime  # noqa: E402
from bench.serving_nq import _nq_level  # noqa: E402
from cli.common import make_engine  # noqa: E402
from evaluation.nq import load_nq  # noqa: E402
from kvlink_rag.cache import MemoryCache  # noqa: E402
from service.settings import Settings  # noqa: E402

examples = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], limit=60)
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
