"""16 clients only (scheduler on), for a profile; JSON line to argv[1]."""
import json, sys, os
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
n = int(os.environ.get("CLIENTS", "16"))
try:
    ingest(rt, pool)
    print("READY", flush=True)
    r = _nq_level(rt, pool, n, 24, True, seed=1000 * n + 1)
    print(json.dumps(r), flush=True)
    open(sys.argv[1], "w").write(json.dumps(r) + "\n")
finally:
    rt.close()
