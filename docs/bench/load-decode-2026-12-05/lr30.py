"""lowrank_add for one decode row over 30 layers' distinct stacks (the shipped adapter's shapes), float32 stacks
against the same values in bfloat16, alternating: ms a token."""
import time, torch
from kvlink_rag.runtime.cpu_kernels import kernels
K = kernels()
shapes = {"qkv": (576, 48, 960), "o": (576, 16, 576), "gate_up": (576, 32, 3072), "down": (1536, 16, 576)}
g = torch.Generator().manual_seed(0)
layers32 = [{n: (torch.randn(r, i, generator=g).bfloat16().float(), torch.randn(r, s, generator=g).bfloat16().float())
             for n, (i, r, s) in shapes.items()} for _ in range(30)]
layers16 = [{n: (a.bfloat16(), b.bfloat16()) for n, (a, b) in l.items()} for l in layers32]
xs = {n: torch.randn(1, i) for n, (i, r, s) in shapes.items()}
ys = {n: torch.zeros(1, s) for n, (i, r, s) in shapes.items()}
def token(layers):
    for l in layers:
        for n, (a, b) in l.items():
            K.lowrank_add(ys[n], xs[n], a, b, 0)
def med(f, n=41):
    f(); ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[n // 2] * 1e3
big = torch.empty(64 << 20, dtype=torch.uint8)
def cold(layers):  # evict the caches between tokens, as a decode step's weights and KV do
    big.fill_(1)
    return token(layers)
for _ in range(3):
    t32 = med(lambda: cold(layers32)); t16 = med(lambda: cold(layers16)); tf = med(lambda: big.fill_(1))
    print(f"float32 stacks {t32 - tf:.2f} ms, bfloat16 stacks {t16 - tf:.2f} ms (cache flush {tf:.2f} ms subtracted)", flush=True)
