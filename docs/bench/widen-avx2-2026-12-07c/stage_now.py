"""Staging of the load alone (the fill with writers that copy nothing), 10 NQ documents of the bandwidth suite, and
where its time goes (cProfile, tottime). Run from the repository root: .venv/bin/python docs/bench/widen-avx2-2026-12-07c/stage_now.py"""
import sys, time, statistics
exec(open("docs/bench/load-stage-avx2-2026-12-07/stage_profile.py").read().split("import cProfile")[0].replace('print(f"floor', 'pass  # print(f"floor'))
class Nop:
    def write_many(self, out, parts): pass
nop = Nop()
def stage_only():
    d = prefetch_layers(blobs, keys)
    for i in range(L):
        d.fill(i, runs[0][0][i], runs[0][1][i], nop, nop)
for rnd in range(2):
    ts = []
    for _ in range(41):
        t = time.perf_counter(); stage_only(); ts.append(time.perf_counter() - t)
    print(f"stage only: median {statistics.median(ts)*1e3:.2f} ms, min {min(ts)*1e3:.2f}", flush=True)
ts = []
for _ in range(41):
    t = time.perf_counter(); prefetch_only(); ts.append(time.perf_counter() - t)
print(f"prefetch_layers only: median {statistics.median(ts)*1e3:.2f} ms", flush=True)
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(20): stage_only()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
