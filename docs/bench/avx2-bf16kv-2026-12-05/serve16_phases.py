"""16 clients, wall time per phase (wrappers summing perf_counter in the scheduler thread)."""
import os, sys, time, collections, functools, importlib
stats = collections.defaultdict(lambda: [0, 0.0])
def wrap(modname, qual):
    mod = importlib.import_module(modname)
    owner, attr = (mod, qual) if "." not in qual else (getattr(mod, qual.split(".")[0]), qual.split(".")[1])
    f = getattr(owner, attr)
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            s = stats[qual]; s[0] += 1; s[1] += time.perf_counter() - t
    setattr(owner, attr, g)
    return g
R = "kvlink_rag.runtime."
import kvlink_rag.runtime.ragged as rg, kvlink_rag.runtime.model_runner as mr
g = wrap(R + "ragged", "attend"); mr.attend = g
for m, q in [(R + "linear", "DenseLinear.__call__"), (R + "linear", "SplitLinear.__call__"),
             (R + "fused_decode", "layer_pre"), (R + "fused_decode", "layer_post"), (R + "fused_decode", "attend"),
             (R + "scheduler", "Scheduler._admit"), (R + "scheduler", "Scheduler._forward"),
             (R + "model_runner", "ModelRunner.forward"), (R + "model_runner", "ModelRunner._rope"),
             (R + "model_runner", "ModelRunner._mlp"), (R + "lora", "FusedLowRank.add_to"),
             (R + "head", "RescoredHead.__call__"), (R + "kv_sequence", "SequenceKV.write")]:
    try:
        wrap(m, q)
    except Exception as e:
        print("skip", q, e)
t0 = time.perf_counter()
exec(open(__file__.replace("serve16_phases.py", "serve16.py").replace("serve16_attn.py", "serve16.py")).read())
for k, (n, s) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
    print(f"{k:32s} {n:7d} {s:7.2f}s")
