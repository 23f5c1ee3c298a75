"""How often the KV pool creates an arena (fresh pages: every first write page-faults) and gives one back, during
the 16-client serving level; the level's throughput beside. ARENA_KEEP (optional) sets the new policy's knob."""
import collections, os, sys
import kvlink_rag.runtime.block_pool as bp
count = collections.Counter()
_add = bp.BlockPool._add_arena
def add(self):
    count["arenas created"] += 1
    return _add(self)
bp.BlockPool._add_arena = add
if hasattr(bp.BlockPool, "_give_back"):  # before f159ba2: an arena went back when emptied
    _back = bp.BlockPool._give_back
    def back(self, a):
        had = self.arenas[a] is not None
        _back(self, a)
        count["arenas given back"] += had and self.arenas[a] is None
    bp.BlockPool._give_back = back
else:  # since: trimmed after idle_s
    _trim = bp.BlockPool.trim
    def trim(self):
        n = _trim(self)
        count["arenas given back"] += n
        return n
    bp.BlockPool.trim = trim
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
    print("after ingest", dict(count)); count.clear()
    for n in [int(c) for c in os.environ.get("LEVELS", "16,1").split(",")]:
        r = _nq_level(rt, pool, n, 24, True, seed=1000 * n + 1)
        print(n, "clients", round(r["throughput_rps"], 2), "req/s", dict(count), flush=True); count.clear()
finally:
    rt.close()
