"""Where a 16-client serving level's scheduler time goes, by wall-clock timers around the step's phases
(inclusive seconds per phase; no sampling profiler, so the level runs at its own speed). The level is
serving_levels.py's 16-client NQ level (10 documents of a 60-passage pool, 24 new tokens).
Usage (repository root): .venv/bin/python docs/bench/epyc-phases-2026-12-07i/phases.py OUT.json"""
import json, os, sys, time
from collections import defaultdict

from bench.serving_common import ingest, runtime
from bench.serving_nq import _nq_level
from cli.common import make_engine
from evaluation.nq import load_nq
from kvlink_rag.cache import MemoryCache
from kvlink_rag.runtime import fused_decode, model_runner, scheduler
from service.settings import Settings

SPENT: dict = defaultdict(float)
CALLS: dict = defaultdict(int)


def timed(owner, name, label):
    fn = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            SPENT[label] += time.perf_counter() - t0
            CALLS[label] += 1
    setattr(owner, name, wrapper)


def fused_or_general(self, batch, *a, **k):  # the runner's forward, split by which path it takes
    t0 = time.perf_counter()
    out = FORWARD(self, batch, *a, **k)
    label = "forward: decode-only (fused)" if all(fused_decode.plain_decode(r) for r in batch.rows) else "forward: other"
    SPENT[label] += time.perf_counter() - t0
    CALLS[label] += 1
    return out


FORWARD = model_runner.ModelRunner.forward
model_runner.ModelRunner.forward = fused_or_general
timed(scheduler.Scheduler, "_step", "step")
timed(scheduler.Scheduler, "_admit", "admit")
timed(fused_decode, "layer_pre", "fused layer_pre")
timed(fused_decode, "layer_post", "fused layer_post")
timed(fused_decode, "attend", "fused attend")
timed(model_runner.ModelRunner, "_attend_rows", "general attend_rows")
timed(model_runner.ModelRunner, "_mlp", "general mlp")
timed(model_runner.ModelRunner, "_rope", "general rope")
from kvlink_rag.runtime import admit as admit_mod, request_layout
for name in ("_fill", "_prefill", "_layout", "new_sequence"):
    timed(admit_mod, name, f"admit.{name}")
timed(request_layout, "_rotate_into", "admit._fill: _rotate_into")
timed(model_runner.ModelRunner, "_split_forward", "forward: mixed (split)")

examples = load_nq(os.environ["KVLINK_RAG_NQ_PATH"], limit=60)
engine = make_engine(Settings(), cache=MemoryCache())
pool = {f"d{i}": ex for i, ex in enumerate(examples[:60])}
rt = runtime(engine, scheduler=True)
try:
    ingest(rt, pool)
    _nq_level(rt, pool, 4, 24, True, seed=7)  # warm-up
    SPENT.clear(), CALLS.clear()
    t0 = time.perf_counter()
    r = _nq_level(rt, pool, 16, 24, True, seed=16001)
    wall = time.perf_counter() - t0
finally:
    rt.close()
rows = {k: {"s": round(v, 3), "share_of_wall": round(v / wall, 3), "calls": CALLS[k]} for k, v in sorted(SPENT.items())}
out = {"level": r, "wall_s": wall, "phases": rows}
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
