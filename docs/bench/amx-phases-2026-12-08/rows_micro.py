"""Stored rows into 30 layers' blocks (1,370 tokens, bfloat16) by the row writers: into fresh pages, then the same
pages again; a plain copy of the same bytes. Usage (repository root): .venv/bin/python docs/bench/amx-phases-2026-12-08/rows_micro.py"""
import time, torch
from kvlink_rag.runtime.cpu_kernels import kernels
from kvlink_rag.linking.rope_rows import block_writers
k = kernels()
n, H, D, L = 1370, 3, 64, 30
raws_k = [torch.randn(n, H, D).bfloat16().view(torch.int16).numpy().tobytes() for _ in range(L)]
raws_v = [torch.randn(n, H, D).bfloat16().view(torch.int16).numpy().tobytes() for _ in range(L)]
cos, sin = torch.randn(n, D), torch.randn(n, D)
keys, values = block_writers(cos, sin)
for trial in range(3):
    outk = torch.empty(L, H, n, D, dtype=torch.bfloat16); outv = torch.empty_like(outk)
    t0 = time.perf_counter()
    for i in range(L):
        keys(outk[i], raws_k[i], True, 0); values(outv[i], raws_v[i], True, 0)
    t1 = time.perf_counter()
    for i in range(L):
        keys(outk[i], raws_k[i], True, 0); values(outv[i], raws_v[i], True, 0)
    t2 = time.perf_counter()
    print(f"fresh {1e3*(t1-t0):.1f} ms, rewrite {1e3*(t2-t1):.1f} ms; bytes {2*L*n*H*D*2/1e6:.1f} MB")
a = torch.empty(L*n*H*D*2, dtype=torch.bfloat16); b = torch.randn(L*n*H*D*2).bfloat16()
t0=time.perf_counter(); a.copy_(b); print("torch copy", 1e3*(time.perf_counter()-t0))
t0=time.perf_counter(); c = b.clone(); print("fresh clone", 1e3*(time.perf_counter()-t0))
