"""Staging of the load before (c14df93's lmdb_records.stage_layer_stored) and after, alternating in one process: the
fill loop, the bench's stream_vs_copy, and staging alone (no copy) against the copy kernel alone (stage.txt).
    .venv/bin/python docs/bench/load-stage-avx2-2026-12-07/stage_ab.py   (from the repository root)"""
import sys
exec(open("docs/bench/load-stage-avx2-2026-12-07/stage_profile.py").read().split("import cProfile")[0].replace('print(f"floor', 'pass  # print(f"floor'))
import importlib, subprocess, types
from store.blobs import lmdb_records as records
new = records.stage_layer_stored
src = subprocess.run(["git", "show", "c14df93:store/blobs/lmdb_records.py"], capture_output=True, text=True).stdout
old_mod = types.ModuleType("old_lmdb_records"); old_mod.__dict__["__name__"] = "old_lmdb_records"
exec(compile(src, "old_lmdb_records.py", "exec"), old_mod.__dict__)
from store.records import stored_order
from store.records.verified import VERIFIED
import store.records.stored_order as so
def old_stored_rows_wrap(*a, **k): return so.stored_rows(*a, **k)
old_mod.stored_rows = so.stored_rows
old = old_mod.stage_layer_stored
R = 31
for rnd in range(6):
    for name, fn in (("old", old), ("new", new)):
        records.stage_layer_stored = fn
        VERIFIED.clear(); fill_only()
        f = med(fill_only)
        res = stream_into_blocks(blobs, keys, repeats=R)
        print(f"round {rnd} {name}: fill {f*1e3:.2f} ms, stream_vs_copy {res['stream_vs_copy']:.3f} ({res['stream_gbps']:.2f} / {res['copy_gbps']:.2f} GB/s), rope {res['stream_rope_vs_copy']:.3f}", flush=True)
class Nop:
    def write_many(self, out, parts): pass
nop = Nop()
def stage_only():
    d = prefetch_layers(blobs, keys)
    for i in range(L):
        d.fill(i, runs[0][0][i], runs[0][1][i], nop, nop)
import statistics
for rnd in range(3):
    for name, fn in (("old", old), ("new", new)):
        records.stage_layer_stored = fn
        ts = []
        for _ in range(41):
            t = time.perf_counter(); stage_only(); ts.append(time.perf_counter() - t)
        print(f"stage only {name}: median {statistics.median(ts)*1e3:.2f} ms, min {min(ts)*1e3:.2f}", flush=True)
ts = []
for _ in range(41):
    t = time.perf_counter(); kernel_only(); ts.append(time.perf_counter() - t)
print(f"kernel only: median {statistics.median(ts)*1e3:.2f} ms, min {min(ts)*1e3:.2f}")
