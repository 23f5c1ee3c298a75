"""The decode rows' attention kernel alone: 16 rows, each over its own 1,370 bfloat16 KV tokens (distinct: read
from memory every step) or all over one row's (shared: in cache), 30 layers of SmolLM2-135M's shapes (9 query
heads, 3 KV heads, head_dim 64), through decode_rows; ms per step and the KV bytes a step over that time."""
import time
import torch
from kvlink_rag.runtime.cpu_kernels import kernels
K = kernels()
torch.manual_seed(0)
L, H, KV, T, D, ROWS = 30, 9, 3, 1370, 64, 16
bufs = [(torch.randn(L, KV, T, D).bfloat16(), torch.randn(L, KV, T, D).bfloat16()) for _ in range(ROWS)]
q = torch.randn(ROWS, (H + 2 * KV) * D).bfloat16().float()


def step(distinct: bool) -> None:
    for layer in range(L):
        ks = [bufs[r if distinct else 0][0] for r in range(ROWS)]
        vs = [bufs[r if distinct else 0][1] for r in range(ROWS)]
        K.decode_rows(q, H, layer, ks, vs, [T - 1] * ROWS, [[]] * ROWS, [[]] * ROWS, 0.125)


for distinct in (True, False, True, False):
    step(distinct)
    t = time.perf_counter()
    for _ in range(10):
        step(distinct)
    dt = (time.perf_counter() - t) / 10
    print("distinct" if distinct else "shared", f"{dt * 1e3:.1f} ms/step", f"{ROWS * L * KV * T * D * 2 * 2 / dt / 1e9:.1f} GB/s")
