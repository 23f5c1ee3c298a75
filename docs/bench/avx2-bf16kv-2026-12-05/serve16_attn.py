"""16 clients, timing ragged.attend (prefill rows) by shape."""
import json, sys, os, time, collections
import kvlink_rag.runtime.ragged as rg
import kvlink_rag.runtime.model_runner as mr
stats = collections.defaultdict(lambda: [0, 0.0])
orig = rg.attend
def timed(q, pieces, mask, scale, causal=False):
    t = time.perf_counter()
    out = orig(q, pieces, mask, scale, causal)
    key = (q.shape[1] > 1, len(pieces), mask is not None, str(pieces[0][0].dtype), str(q.dtype))
    s = stats[key]; s[0] += 1; s[1] += time.perf_counter() - t
    stats[("keys",)][0] += sum(k.shape[1] for k, _ in pieces) * q.shape[1]
    return out
for mod in (rg, mr):
    if hasattr(mod, "attend"):
        setattr(mod, "attend", timed)
exec(open(__file__.replace("serve16_phases.py", "serve16.py").replace("serve16_attn.py", "serve16.py")).read())
for k, (n, s) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
    print(k, n, f"{s:.2f}s")
