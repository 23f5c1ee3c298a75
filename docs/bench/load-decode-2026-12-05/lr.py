"""lowrank_add alone per layer (the shipped adapter's stacked shapes), 1 and 16 rows, caches warm: us a layer, x30."""
import torch, time, sys
from kvlink_rag.runtime.cpu_kernels import kernels
K = kernels()
if len(sys.argv) > 1: torch.set_num_threads(int(sys.argv[1]))
def t(fn, n=50):
    fn(); ts=[]
    for _ in range(n):
        a=time.perf_counter(); fn(); ts.append(time.perf_counter()-a)
    ts.sort(); return ts[n//2]*1e6
tot = 0
for T in (1, 16):
    tot = 0
    for name, (inn, r, span) in {"qkv": (576, 48, 960), "o": (576, 16, 576), "gate_up": (576, 32, 3072), "down": (1536, 16, 576)}.items():
        x = torch.randn(T, inn); a = torch.randn(r, inn); bt = torch.randn(r, span); y = torch.zeros(T, span + 7)
        us = t(lambda: K.lowrank_add(y, x, a, bt, 3))
        tot += us
        print(f"T={T} {name}: {us:.1f} us")
    print(f"T={T} per layer {tot:.0f} us, x30 = {tot*30/1e3:.1f} ms")
