"""Time spent in the model runner's attention_mass during a kvlink-rag command (the profile quoted in BENCHMARKS.md:
    PYTHONPATH=. python docs/bench/importance-past-2026-12-06i/profile.py bench-edit --parts chunked ...)."""
import sys, time, atexit
import kvlink_rag.runtime.model_runner as mr
from cli.main import app
tot = [0.0, 0, 0]
orig = mr.attention_mass
def timed(q, pieces, mask, scale, skip=0, exclude_self=False, *rest):
    t = time.perf_counter(); r = orig(q, pieces, mask, scale, skip, exclude_self, *rest); tot[0] += time.perf_counter() - t; tot[1] += 1
    tot[2] += sum(k.shape[1] for k, _ in pieces) * q.shape[1]
    return r
mr.attention_mass = timed
atexit.register(lambda: print("attention_mass s, calls, query-key pairs per head:", tot, file=sys.stderr))
sys.argv[0] = "kvlink-rag"
app()
